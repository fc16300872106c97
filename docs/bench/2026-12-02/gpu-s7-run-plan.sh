#!/usr/bin/env bash
# Seventh session's detached run. Demo v3b trains first (started by the session's first call, its
# own process); beside it, untimed: the checkpoint and the kernels' compile (a warm-up bench). Once the training is done, the timed stages one after another.
R=/tmp/repo; O=/tmp/gb; C=/tmp/mtp_chat_q9b; PY=python3
mkdir -p $R $O
tar --exclude=./.whl --exclude=./artifacts --exclude=./.venv -cf - . | tar -xf - -C $R; cd $R
t0=$(date +%s); say() { echo "=== [$(( $(date +%s) - t0 )) s] $*"; }
T() { timeout ${2:-420} bash -c "$1"; }
git rev-parse HEAD 2>/dev/null; git status --short | head
say checkpoint
[ -f $C/config.json ] || $PY scripts/gpu/gpu_make_checkpoint.py --out $C
say warm-up compile, beside the training, untimed
T "$PY scripts/bench/bench.py --model $C --depth 2 --max-tokens 16 --repeats 1 2>&1 | grep -v 'regex pattern' | tail -n 6" 420
T "$PY scripts/bench/bench_batch.py --model $C --requests 4 --tokens 8 --long-prompt 0 --streams 0 --json /tmp/warm_batch.json 2>&1 | grep -v 'regex pattern' | tail -n 4" 300
say waiting for the training to end
n=0; while ! grep -q "stage train done" /tmp/v3_out/calls.log 2>/dev/null && [ $n -lt 700 ]; do sleep 2; n=$((n+2)); done
sleep 3; nvidia-smi --query-compute-apps=pid,used_memory --format=csv; say training over
say trials
STAGES=trials STEP_TIMEOUT=360 bash scripts/gpu/gpu_bench.sh $O
say parts
T "$PY scripts/gpu/gpu_step_parts.py --model $C --env-variants --json $O/step_parts.json 2>&1 | grep -v 'regex pattern'" 360
say long
T "$PY scripts/gpu/gpu_long.py --model $C --json $O/long_9b.json --context 64 --context 8192 --context 32768 --context 131072 2>&1 | grep -v 'regex pattern'" 300
say batch_graph
T "$PY scripts/bench/batch_graph.py --model $C --json $O/batch_graph_9b.json 2>&1 | grep -v 'regex pattern' | tail -n 30" 240
say parity32k
nvidia-smi --query-compute-apps=pid,used_memory --format=csv
T "$PY scripts/gpu/gpu_exact.py --model $C --json $O/exact_32k.json --tokens 256 --parity-context 32768 --skip parity prefix sampled costs 2>&1 | grep -v 'regex pattern'" 420
say demo depth 3 at T=0, calibrated twice
for k in a b; do
  T "$PY scripts/bench/bench.py --model models/demo --depth 3 --temperature 0 --top-p 0.95 --top-k 20 --max-tokens 128 --repeats 3 --json $O/demo_t0_d3_$k.json 2>&1 | grep -v 'regex pattern' | tail -n 12" 200
done
say all done
