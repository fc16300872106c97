#!/usr/bin/env bash
# Set up (scripts/setup.sh), make sure Chromium is there for the browser tests, run pytest
# (in parallel, one worker per core).
# Arguments go to pytest; the exit status is pytest's.
#
# The browser tests need Debian's chromium (installed here when run as root). Without it this
# script stops and says what to install; MTP_CHAT_BROWSER_TESTS=skip runs the rest anyway (the
# browser tests then skip, saying why; with CI set, as .ci/run sets it, any skip fails the run).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh

if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
    if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
        echo "[test] installing chromium and chromium-driver (browser tests)"
        export DEBIAN_FRONTEND=noninteractive
        { apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium chromium-driver; } \
            >/tmp/mtp-chat-apt-chromium.log 2>&1 || true
    fi
fi
if ! [ -x /usr/bin/chromium ]; then
    if [ "${MTP_CHAT_BROWSER_TESTS:-}" = "skip" ]; then
        echo "[test] note: /usr/bin/chromium is missing: the browser tests will skip (MTP_CHAT_BROWSER_TESTS=skip)"
    else
        echo "[test] /usr/bin/chromium is missing, so the browser tests cannot run." >&2
        echo "[test] Install it: 'sudo apt-get install chromium chromium-driver' (Debian/Ubuntu; see /tmp/mtp-chat-apt-chromium.log" >&2
        echo "[test] if an install was tried), or run the rest without them: MTP_CHAT_BROWSER_TESTS=skip bash scripts/test.sh" >&2
        exit 1
    fi
fi

# One pytest-xdist worker per core (MTP_CHAT_TEST_WORKERS sets another count; 0 runs in this
# process); each test module runs whole on one worker, the slowest first (tests/conftest.py).
workers="${MTP_CHAT_TEST_WORKERS:-$(nproc 2>/dev/null || echo 2)}"
set +e
.venv/bin/python -m pytest -n "$workers" --dist loadfile --no-loadscope-reorder "$@"
status=$?
set -e
exit $status
