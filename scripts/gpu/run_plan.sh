# Sourced by a session's detached GPU run plan (docs/bench/<date>/gpu-sN-run-plan.sh), from the
# repository copy the device call runs in: copies it to /tmp/repo (the call's own copy goes when
# the call ends) and works there; $O collects what polls bring back; the 9B checkpoint's folder.
# say: a timestamped stage line; T "command" [seconds]: a step with its own time limit.
R=/tmp/repo; O=/tmp/gb; C=/tmp/mtp_chat_q9b; PY=python3
mkdir -p $R $O
tar --exclude=./.whl --exclude=./artifacts --exclude=./.venv -cf - . | tar -xf - -C $R; cd $R
t0=$(date +%s); say() { echo "=== [$(( $(date +%s) - t0 )) s] $*"; }
T() { timeout ${2:-420} bash -c "$1"; }
git rev-parse HEAD 2>/dev/null; git status --short | head
say checkpoint
[ -f $C/config.json ] || $PY scripts/gpu/gpu_make_checkpoint.py --out $C || $PY scripts/gpu/gpu_make_checkpoint.py --out $C --host
