#!/usr/bin/env bash
# Set up (scripts/setup.sh) and start the web app; arguments go to `mtp-chat`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
exec .venv/bin/mtp-chat "$@"
