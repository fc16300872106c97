#!/usr/bin/env bash
# Fourteenth session's run, prepared in the thirteenth (GPU.md section 13), about 750 s:
# 1. Where a long-path chunk's fixed ~0.02 s goes (gpu_chunk_parts.py: host build, encode, wait;
#    each kernel class at T rows), issue 36.
# 2. The agent session restarted, 4 turns: the start-up now rehearses a turn after the newest
#    snapshot (core.stream.rehearse), so a restarted process's first long chunk should no longer
#    spend ~0.2 s more on the host (issue 36). Then warm, 6 turns; warm again with the reply's
#    history snapshot taken as soon as the model is idle (history_grace_s 0, against 1 s: with a
#    one-chunk reply, ~0.03 s, the next turn may prefill only its new tokens); and warm with
#    prefill chunks of 1024 tokens (MTP_CHAT_PREFILL_CHUNK: fewer chunks a turn, each faster a
#    token; its ratios divide by turn 1's 1024-token chunk rate).
# 3. The 9B's exactness, then the batch graph and 4 requests against 1 (issue 32: the batched
#    rollback and a greedy batch's decisions together, ~200 fewer primitives an MTP cycle at B = 4;
#    bench_batch checks every reply against its reply alone).
# Wheels in four calls: .whl/pa, .whl/web1, .whl/ptx (the mlx wheel and the PTX cache), then
# .whl/p3 with this plan. Say lines hold no quotes or parentheses (bash).
source scripts/gpu/run_plan.sh   # /tmp/repo, $O, $C, say, T; the 9B checkpoint
# The fourteenth session's checkout came without .whl/ptx/ptx.tgz: this machine compiles MLX's
# kernels afresh (~300 s), once, here, so that no later step's limit pays for it.
say warm-up on a fresh machine without a PTX cache
T "$PY scripts/bench/bench.py --model $C --depth 2 --max-tokens 16 --repeats 1 2>&1 | grep -v 'regex pattern' | tail -n 3" 540
say where a prefill chunk spends its time
T "$PY scripts/gpu/gpu_chunk_parts.py --model $C --tokens 64 512 --json $O/chunk_parts.json 2>&1 | grep -v 'regex pattern' | tail -n 24" 240
say agent restart, 4 turns
T "$PY scripts/bench/agent_session.py --model $C --system-tokens 20000 --result-tokens 200 2000 800 --turns 4 --runs restart --json $O/agent_restart_9b.json 2>&1 | grep -v 'regex pattern' | grep -E 'turn [0-9]:|server up|done|failed'" 420
say agent warm
T "$PY scripts/bench/agent_session.py --model $C --system-tokens 20000 --result-tokens 200 2000 800 1500 400 --runs warm --json $O/agent_warm_9b.json 2>&1 | grep -v 'regex pattern' | grep -E 'turn [0-9]:|done|failed'" 300
say agent warm with the history snapshot taken at once, grace 0
T "MTP_CHAT_HISTORY_GRACE_S=0 $PY scripts/bench/agent_session.py --model $C --system-tokens 20000 --result-tokens 200 2000 800 1500 400 --runs warm --json $O/agent_warm_grace0_9b.json 2>&1 | grep -v 'regex pattern' | grep -E 'turn [0-9]:|done|failed'" 300
say agent warm with prefill chunks of 1024 tokens
T "MTP_CHAT_PREFILL_CHUNK=1024 $PY scripts/bench/agent_session.py --model $C --system-tokens 20000 --result-tokens 200 2000 800 1500 400 --runs warm --json $O/agent_warm_chunk1024_9b.json 2>&1 | grep -v 'regex pattern' | grep -E 'turn [0-9]:|done|failed'" 300
say 9B exactness with the batched rollback
T "$PY scripts/gpu/gpu_check.py --model $C --model-only --json $O/check_9b.json > $O/check_9b.log 2>&1; grep -E 'identical|FAIL|kernels' $O/check_9b.log | head -n 12" 300
say batch graph then 4 requests against 1
T "$PY scripts/bench/batch_graph.py --model $C --batch 1 4 --steps 8 --json $O/batch_graph_9b.json 2>&1 | grep -v 'regex pattern' | tail -n 6" 240
T "$PY scripts/bench/bench_batch.py --model $C --requests 1 4 --tokens 256 --repeats 5 --long-prompt 0 --streams 0 --json $O/batch_9b_256.json 2>&1 | grep -v 'regex pattern' | tail -n 8" 300
tar czf $O/ptx.tgz -C /root/.cache/mtp-chat ptx && ls -la $O/ptx.tgz
say all done
