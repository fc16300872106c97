#!/usr/bin/env bash
# Thirteenth session's detached run, prepared in the twelfth (GPU.md section 12).
# Started by the fourth wheels call (.whl/a, .whl/web1, .whl/ptx, then .whl/p3 with this plan).
# The PTX cache in .whl/ptx now holds our kernels: the first start should check in ~1 s.
# 1. The 35B-A3B shape with a compiled layer's first call taken from its compiled function
#    (gpu_runner._first_call): greedy MTP == AR (gpu_check) and "first call == replay" (gpu_rows).
# 2. A chunk length's first use: gpu_chunk_probe.py with the prefill conv as a tap sum, and its
#    first_use table (ours vs MLX's conv1d on fresh lengths).
# 3. The agent session warm and restarted (issue 36: each later turn <= 1.2x its new tokens).
# 4. The 9B's exactness after the changes (short chunks on the few path, the conv), batch graph.
source scripts/gpu/run_plan.sh   # /tmp/repo, $O, $C, say, T; the 9B checkpoint
P=/root/.cache/mtp-chat/ptx/0.32.4/NVIDIA-H200-sm90
ours() { ls $P 2>/dev/null | grep -c '^custom_kernel.*\.ptx$'; }
say "kernel cache: $(ours) of our kernels before the first start"
M=/tmp/mtp_chat_q35a3b
[ -f $M/config.json ] || $PY scripts/gpu/gpu_make_checkpoint.py --out $M --shape 35b-a3b
say moe exactness with the first call compiled
T "$PY scripts/gpu/gpu_check.py --model $M --model-only --json $O/moe_check.json > $O/moe_check.log 2>&1; grep -E 'identical|FAIL|kernels' $O/moe_check.log | head -n 12" 420
T "$PY scripts/gpu/gpu_rows.py --model $M --json $O/rows_moe.json > $O/rows_moe.log 2>&1; tail -n 12 $O/rows_moe.log" 420
say chunk probe at 20k tokens of depth
T "$PY scripts/gpu/gpu_chunk_probe.py --model $C --depth 20000 --json $O/chunk_probe.json 2>&1 | grep -v 'regex pattern' | tail -n 12" 300
say agent warm
T "$PY scripts/bench/agent_session.py --model $C --system-tokens 20000 --result-tokens 200 2000 800 1500 400 --runs warm --json $O/agent_warm_9b.json 2>&1 | grep -v 'regex pattern' | grep -E 'turn [0-9]:|done|failed'" 300
say 9B exactness after the prefill changes
T "$PY scripts/gpu/gpu_check.py --model $C --model-only --json $O/check_9b.json > $O/check_9b.log 2>&1; grep -E 'identical|FAIL|kernels' $O/check_9b.log | head -n 12" 300
say agent restart, 4 turns
T "$PY scripts/bench/agent_session.py --model $C --system-tokens 20000 --result-tokens 200 2000 800 --turns 4 --runs restart --json $O/agent_restart_9b.json 2>&1 | grep -v 'regex pattern' | grep -E 'turn [0-9]:|server up|done|failed'" 420
say batch graph, then 4 requests against 1 (one sampling launch for the batch's greedy rows now)
T "$PY scripts/bench/batch_graph.py --model $C --batch 1 4 --steps 8 --json $O/batch_graph_9b.json 2>&1 | grep -v 'regex pattern' | tail -n 6" 240
T "$PY scripts/bench/bench_batch.py --model $C --requests 1 4 --tokens 256 --repeats 5 --long-prompt 0 --streams 0 --json $O/batch_9b_256.json 2>&1 | grep -v 'regex pattern' | tail -n 8" 300
tar czf $O/ptx.tgz -C /root/.cache/mtp-chat ptx && ls -la $O/ptx.tgz
say "all done ($(ours) of our kernels kept)"
