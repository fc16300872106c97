# Sourced by start.sh and test.sh: Python caches the bytecode of what it imports in .venv/pycache,
# also where PYTHONDONTWRITEBYTECODE is set (then every process would compile gradio, mlx-lm and
# transformers again: ~13 s of CPU each). Nothing is written into the source tree.
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX="${PYTHONPYCACHEPREFIX:-$PWD/.venv/pycache}"
