#!/usr/bin/env bash
# Ninth session's detached run (started by the third wheels call; polled every few minutes).
# Untimed first: the checkpoint, then a warm-up that compiles the kernels. Then, timed and alone on
# the GPU: two tiles a launch against 8 rows a launch (issue 32's batch), the 32k parity (issue 36),
# the demo's depth 3 at T = 0 calibrated twice (issue 32 item 4), the 35B-A3B shape (issue 32),
# an agent session's time to first token (issue 36). Last: MLX's PTX cache packed for the next
# session (carried back, its first compile skipped).
R=/tmp/repo; O=/tmp/gb; C=/tmp/mtp_chat_q9b; PY=python3
mkdir -p $R $O
tar --exclude=./.whl --exclude=./artifacts --exclude=./.venv -cf - . | tar -xf - -C $R; cd $R
t0=$(date +%s); say() { echo "=== [$(( $(date +%s) - t0 )) s] $*"; }
T() { timeout ${2:-420} bash -c "$1"; }
git rev-parse HEAD 2>/dev/null; git status --short | head
say checkpoint
[ -f $C/config.json ] || $PY scripts/gpu/gpu_make_checkpoint.py --out $C
say warm-up compile, untimed
T "$PY scripts/bench/bench.py --model $C --depth 2 --max-tokens 16 --repeats 1 2>&1 | grep -v 'regex pattern' | tail -n 4" 420
T "MTP_CHAT_GPU_TRIALS=two-tiles $PY scripts/bench/bench_batch.py --model $C --requests 4 --tokens 8 --long-prompt 0 --streams 0 --json /tmp/warm_batch.json 2>&1 | grep -v 'regex pattern' | tail -n 4" 300
say tiles
STAGES=tiles STEP_TIMEOUT=200 bash scripts/gpu/gpu_bench.sh $O
say parity32k
T "$PY scripts/gpu/gpu_exact.py --model $C --json $O/exact_32k.json --tokens 256 --parity-context 32768 --skip parity prefix sampled costs 2>&1 | grep -v 'regex pattern' | tail -n 30" 420
say demo depth 3 at T=0, calibrated twice
for k in a b; do
  T "$PY scripts/bench/bench.py --model models/demo --depth 3 --temperature 0 --top-p 0.95 --top-k 20 --max-tokens 128 --repeats 3 --json $O/demo_t0_d3_$k.json 2>&1 | grep -v 'regex pattern' | tail -n 12" 200
done
say moe
M=/tmp/mtp_chat_q35a3b
[ -f $M/config.json ] || $PY scripts/gpu/gpu_make_checkpoint.py --out $M --shape 35b-a3b
T "$PY scripts/bench/bench.py --model $M --depth 2 --temperature 0 --top-p 1 --top-k 0 --min-p 0 --max-tokens 128 --repeats 2 --json $O/moe_bench_d2.json 2>&1 | grep -v 'regex pattern' | tail -n 25" 360
say agent_warm
STAGES=agent_warm STEP_TIMEOUT=480 bash scripts/gpu/gpu_bench.sh $O
say moe check
T "$PY scripts/gpu/gpu_check.py --model $M --no-bench --json $O/moe_check.json 2>&1 | grep -v 'regex pattern' | tail -n 20" 300
say packing the PTX cache
tar czf /tmp/ptx.tgz -C /root/.cache/mtp-chat ptx && ls -la /tmp/ptx.tgz
say all done
