#!/usr/bin/env bash
# Set up the project: .venv (Python >= 3.10) with `pip install -e '.[dev]'`, and OpenBLAS
# on Linux (MLX's Linux CPU wheel bundles a ~30x slower reference BLAS; see adapters/runtime.py).
# Idempotent: a second run only re-installs when pyproject.toml changed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

say() { printf '[setup] %s\n' "$*"; }
is_root() { [ "$(id -u)" = "0" ]; }
APT_UPDATED=0
apt_install() {  # apt_install PKG... ; returns non-zero on failure, never exits
    command -v apt-get >/dev/null 2>&1 && is_root || return 1
    export DEBIAN_FRONTEND=noninteractive
    if [ "$APT_UPDATED" = 0 ]; then
        apt-get update -qq >/tmp/mtp-chat-apt.log 2>&1 || true
        APT_UPDATED=1
    fi
    apt-get install -y -qq --no-install-recommends "$@" >>/tmp/mtp-chat-apt.log 2>&1
}

# --- Python >= 3.10 ------------------------------------------------------------------
PY=""
for c in "${PYTHON:-}" python3 python3.13 python3.12 python3.11 python3.10; do
    [ -n "$c" ] || continue
    if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
        PY="$c"; break
    fi
done
if [ -z "$PY" ]; then
    say "Python >= 3.10 not found. Install it (e.g. apt-get install python3 python3-venv) or set PYTHON=/path/to/python3."
    exit 1
fi

# --- .venv ---------------------------------------------------------------------------
if [ ! -x .venv/bin/python ]; then
    say "creating .venv with $("$PY" --version 2>&1)"
    if ! "$PY" -m venv .venv 2>/tmp/mtp-chat-venv.log; then
        rm -rf .venv
        if apt_install python3-venv && "$PY" -m venv .venv; then :; else
            cat /tmp/mtp-chat-venv.log >&2
            say "could not create a virtual environment: install python3-venv and retry"
            exit 1
        fi
    fi
fi

STAMP=.venv/.mtp-chat-setup
WANT="$(cat pyproject.toml | sha256sum | cut -c1-16)"
if [ "$(cat "$STAMP" 2>/dev/null || true)" != "$WANT" ]; then
    say "installing the project and its dev dependencies into .venv (uv pip install -e '.[dev]')"
    # uv resolves the same versions as pip (checked on a cold cache: the same 150 packages) in
    # about 65 s on a 2-core host where pip takes ~2:45; bytecode is compiled at install, as pip
    # does (where PYTHONDONTWRITEBYTECODE is set, every process would otherwise compile what it
    # imports; caching it lazily instead cost the tests as much as it saved here). pip remains the
    # fallback (no uv wheel, an index only pip is configured for).
    if ! { .venv/bin/python -m pip install -q --disable-pip-version-check uv \
           && .venv/bin/python -m uv pip install -q --compile-bytecode --python .venv/bin/python -e '.[dev]'; } \
           >/tmp/mtp-chat-pip.log 2>&1; then
        say "uv could not install (log: /tmp/mtp-chat-pip.log); trying pip"
        .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null 2>&1 || true
        if ! .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev]' >>/tmp/mtp-chat-pip.log 2>&1; then
            tail -n 40 /tmp/mtp-chat-pip.log >&2
            say "pip install failed (full log: /tmp/mtp-chat-pip.log)"
            exit 1
        fi
    fi
    echo "$WANT" >"$STAMP"
else
    say ".venv up to date"
fi

# --- OpenBLAS (Linux) ----------------------------------------------------------------
if [ "$(uname -s)" = "Linux" ]; then
    have_openblas() {
        ls /usr/lib/*-linux-gnu/openblas-*/libopenblas*.so* /usr/lib/*-linux-gnu/libopenblas*.so* \
           /usr/lib64/libopenblas*.so* /usr/lib/libopenblas*.so* >/dev/null 2>&1 \
        || { command -v ldconfig >/dev/null 2>&1 && ldconfig -p 2>/dev/null | grep -q libopenblas; }
    }
    if have_openblas; then
        :
    elif apt_install libopenblas0-pthread; then
        say "installed libopenblas0-pthread (fast BLAS for MLX)"
    else
        say "note: no OpenBLAS found; MLX will use its slow reference BLAS. Install it with"
        say "      'sudo apt-get install libopenblas0-pthread' (Debian/Ubuntu), 'dnf install openblas-pthreads'"
        say "      (Fedora) or 'pacman -S openblas' (Arch), or set MTP_CHAT_BLAS=/path/to/libopenblas.so"
    fi
fi
.venv/bin/python -c 'import adapters.runtime as r; print("[setup]", r.describe_runtime())' 2>/dev/null \
    || say "warning: could not report the runtime (is the install complete?)"
