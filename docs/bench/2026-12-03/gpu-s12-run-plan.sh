#!/usr/bin/env bash
# Twelfth session's detached run, prepared in the eleventh (GPU.md section 11, "Next GPU session").
# Started by the fourth wheels call (.whl/a, .whl/web1, .whl/ptx, then .whl/p3 with this plan).
# 1. Our kernels compiled once per machine (adapters/kernels/jit_cache.py): the first process writes
#    their entries into MLX's cache, the second should find them (its kernel check: seconds, not
#    14-20 s); greedy MTP == AR on the 9B with the seeded modules (gpu_check --model-only).
# 2. The 35B-A3B exactness failure: scripts/gpu/gpu_rows.py bisects a verify's row 0 against the
#    decode step op by op (eager), by compiled function (compiled) and for MLX's own ops.
# 3. The agent session's fixed ~0.3 s a warm turn: gpu_chunk_probe.py at 20k tokens of depth.
# 4. The agent session again, warm and restarted (no waits for history snapshots now; restarts
#    should no longer compile): issue 36's time to first token.
# Last: the PTX cache packed again (it now holds our kernels): bring ptx.tgz back into .whl/ptx/.
source scripts/gpu/run_plan.sh   # /tmp/repo, $O, $C, say, T; the 9B checkpoint
P=/root/.cache/mtp-chat/ptx/0.32.4/NVIDIA-H200-sm90
ours() { ls $P 2>/dev/null | grep -c '^custom_kernel.*\.ptx$'; }
say "kernel cache: $(ours) of our kernels before the first start"
for start in 1 2; do
  say "start $start (our kernels' entries: $(ours))"
  T "$PY scripts/bench/bench.py --model $C --depth 2 --max-tokens 16 --repeats 1 2>&1 | grep -E 'kernels|not kept|tok/s' | grep -v 'regex pattern' | head -n 6" 420
done
say "kernel cache: $(ours) of our kernels after two starts"
say 9B exactness with the seeded kernels
T "$PY scripts/gpu/gpu_check.py --model $C --model-only --json $O/check_9b.json > $O/check_9b.log 2>&1; grep -E 'identical|FAIL|kernels' $O/check_9b.log | head -n 12" 300
tar czf $O/ptx.tgz -C /root/.cache/mtp-chat ptx && ls -la $O/ptx.tgz   # early, in case the run is cut short
say moe rows bisect
M=/tmp/mtp_chat_q35a3b
[ -f $M/config.json ] || $PY scripts/gpu/gpu_make_checkpoint.py --out $M --shape 35b-a3b
T "$PY scripts/gpu/gpu_rows.py --model $M --json $O/rows_moe.json > $O/rows_moe.log 2>&1; tail -n 30 $O/rows_moe.log" 420
say chunk probe at 20k tokens of depth
T "$PY scripts/gpu/gpu_chunk_probe.py --model $C --depth 20000 --json $O/chunk_probe.json 2>&1 | grep -v 'regex pattern' | tail -n 16" 300
say "batch graph: what a step costs back to back and on the host (issue 32's batch of 4)"
T "$PY scripts/bench/batch_graph.py --model $C --batch 1 2 4 --steps 8 --json $O/batch_graph_9b.json 2>&1 | grep -v 'regex pattern' | tail -n 12" 240
say agent warm
T "$PY scripts/bench/agent_session.py --model $C --system-tokens 20000 --result-tokens 200 2000 800 1500 400 --runs warm --json $O/agent_warm_9b.json 2>&1 | grep -v 'regex pattern' | grep -E 'turn [0-9]:|done|failed'" 300
say agent restart, 4 turns
T "$PY scripts/bench/agent_session.py --model $C --system-tokens 20000 --result-tokens 200 2000 800 --turns 4 --runs restart --json $O/agent_restart_9b.json 2>&1 | grep -v 'regex pattern' | grep -E 'turn [0-9]:|server up|done|failed'" 420
tar czf $O/ptx.tgz -C /root/.cache/mtp-chat ptx && ls -la $O/ptx.tgz
say "all done ($(ours) of our kernels kept)"
