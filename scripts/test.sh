#!/usr/bin/env bash
# Set up (scripts/setup.sh), make sure Chromium is there for the browser tests, run pytest.
# Arguments go to pytest; the exit status is pytest's.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh

if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
    if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
        echo "[test] installing chromium and chromium-driver (browser tests)"
        export DEBIAN_FRONTEND=noninteractive
        { apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium chromium-driver; } \
            >/tmp/mtp-chat-apt-chromium.log 2>&1 \
            || echo "[test] note: could not install chromium (see /tmp/mtp-chat-apt-chromium.log); browser tests will skip"
    else
        echo "[test] note: chromium / chromium-driver missing and not root: browser tests will skip" \
             "(install with 'sudo apt-get install chromium chromium-driver')"
    fi
fi

set +e
.venv/bin/python -m pytest "$@"
status=$?
set -e
exit $status
