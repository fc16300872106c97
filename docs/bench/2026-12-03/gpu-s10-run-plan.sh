#!/usr/bin/env bash
# Tenth session's detached run (started by the third wheels call; polled every few minutes).
# Untimed first: the checkpoint, then a warm-up that loads the kernels (the carried PTX cache
# should spare their compile). Then, timed and alone on the GPU: two tiles a launch against 8 rows
# a launch, paired in one process (issue 32's batch), the demo at depth auto and 1-3, T = 0 (issue
# 32 item 4: does auto, priced by the reply's own cycles, pick the best depth?), the agent session
# warm and after restarts with the disk cache's writer thread (issue 36), the 35B-A3B shape's
# gpu_check.py (issue 32, reported).
R=/tmp/repo; O=/tmp/gb; C=/tmp/mtp_chat_q9b; PY=python3
mkdir -p $R $O
tar --exclude=./.whl --exclude=./artifacts --exclude=./.venv -cf - . | tar -xf - -C $R; cd $R
t0=$(date +%s); say() { echo "=== [$(( $(date +%s) - t0 )) s] $*"; }
T() { timeout ${2:-420} bash -c "$1"; }
git rev-parse HEAD 2>/dev/null; git status --short | head
say checkpoint
[ -f $C/config.json ] || $PY scripts/gpu/gpu_make_checkpoint.py --out $C
say warm-up, untimed
T "$PY scripts/bench/bench.py --model $C --depth 2 --max-tokens 16 --repeats 1 2>&1 | grep -v 'regex pattern' | tail -n 4" 420
T "MTP_CHAT_GPU_TRIALS=two-tiles $PY scripts/bench/bench_batch.py --model $C --requests 4 --tokens 8 --long-prompt 0 --streams 0 --json /tmp/warm_batch.json 2>&1 | grep -v 'regex pattern' | tail -n 4" 300
say tiles
STAGES=tiles STEP_TIMEOUT=420 bash scripts/gpu/gpu_bench.sh $O
say demo at T=0: auto, then depths 1-3
for d in auto 1 2 3; do
  T "$PY scripts/bench/bench.py --model models/demo --depth $d --temperature 0 --top-p 0.95 --top-k 20 --max-tokens 128 --repeats 3 --json $O/demo_t0_d$d.json 2>&1 | grep -v 'regex pattern' | tail -n 8" 200
done
say agent warm, then restart
STAGES="agent_warm agent_restart" STEP_TIMEOUT=420 bash scripts/gpu/gpu_bench.sh $O
say moe check
M=/tmp/mtp_chat_q35a3b
[ -f $M/config.json ] || $PY scripts/gpu/gpu_make_checkpoint.py --out $M --shape 35b-a3b
T "$PY scripts/gpu/gpu_check.py --model $M --no-bench --json $O/moe_check.json 2>&1 | grep -v 'regex pattern' | tail -n 20" 300
du -sh /root/.nv/ComputeCache 2>/dev/null
say all done
