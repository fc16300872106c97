#!/usr/bin/env bash
# Fifth session's detached run: wait for the checkpoint, then one stage after another.
cd "$(dirname "$0")/.."
O=/tmp/gb; C=/tmp/mtp_chat_q9b; PY=python3
t0=$(date +%s); say() { echo "=== [$(( $(date +%s) - t0 )) s] $*"; }
git rev-parse HEAD 2>/dev/null; git status --short | head
while ! [ -f $O/ckpt_done ]; do sleep 2; done; say checkpoint ready
nvidia-smi --query-gpu=name,memory.used --format=csv
T() { timeout ${2:-420} bash -c "$1"; }
say checks
T "$PY scripts/gpu/gpu_fused_gdn.py --model $C --json $O/fused_gdn.json" 240
T "$PY scripts/gpu/gpu_attention.py --json $O/attention.json" 240
say batch
T "$PY scripts/bench/bench_batch.py --model $C --requests 1 2 4 --tokens 64 --long-prompt 0 --streams 0 --json $O/batch_9b.json 2>&1 | grep -v 'regex pattern' | tail -n 30"
say long
T "$PY scripts/gpu/gpu_long.py --model $C --json $O/long_9b.json --context 64 --context 8192 --context 32768 --context 131072 2>&1 | grep -v 'regex pattern'"
say agent
T "$PY scripts/bench/agent_session.py --model $C --system-tokens 20000 --result-tokens 200 2000 800 1500 400 --json $O/agent_9b.json" 480
say parity32k
T "$PY scripts/gpu/gpu_exact.py --model $C --json $O/exact_32k.json --tokens 256 --parity-context 32768 --skip parity prefix sampled costs 2>&1 | grep -v 'regex pattern'"
say demo_t0.6_d3
T "$PY scripts/bench/bench.py --model models/demo --depth 3 --temperature 0.6 --top-p 0.95 --top-k 20 --max-tokens 128 --repeats 3 --json $O/demo_t0.6_d3.json 2>&1 | tail -n 12"
say fp32ref
T "$PY scripts/gpu/gpu_prefill.py --model $C --json $O/prefill_fp32.json --check-lengths 7 --lengths 2048 --fp32-reference 2048 --chunks 512 --repeats 1 --sweep-length 2048 2>&1 | grep -v 'regex pattern'" 300
for d in 1 3; do say d$d
T "$PY scripts/bench/bench.py --model $C --depth $d --temperature 0 --top-p 1 --top-k 0 --min-p 0 --max-tokens 128 --repeats 3 --json $O/bench_d$d.json 2>&1 | grep -v 'regex pattern' | tail -n 14"
done
say moe
CKPT_MOE=/tmp/mtp_chat_moe STEP_TIMEOUT=420 STAGES=moe bash scripts/gpu/gpu_bench.sh $O
say all done
