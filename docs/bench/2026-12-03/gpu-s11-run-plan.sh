#!/usr/bin/env bash
# Eleventh session's detached run, prepared in the tenth (GPU.md section 10, "Next GPU session").
# Started by the fourth wheels call (.whl/a, .whl/web1, .whl/ptx, then .whl/p3 with this plan).
# Untimed first: the checkpoint and a warm-up. Then, alone on the GPU: the agent session warm (6
# turns) and with a restart before each of 4 turns (issue 36: did the unified-memory fixes, the
# start-up preload and the tokenizer warm-up take the fixed part, the restart waits and the slow
# first-turn decode away? prefill parts and waterfalls per turn); long contexts and the attention
# kernel (its query reads no longer conflict on shared-memory banks: the verify at 32k / 128k);
# 4 concurrent requests, medians of
# 5, 64 and 256 tokens, the decode phase beside the whole run (issue 32's 2.5x); a batch step's
# graph with two tiles on; the 35B-A3B gpu_check.py (reported); the demo at depth auto and 3 with
# 256 tokens (auto's observed prices). Last: the PTX cache packed again if anything compiled.
source scripts/gpu/run_plan.sh   # /tmp/repo, $O, $C, say, T; the 9B checkpoint
say warm-up, untimed
T "$PY scripts/bench/bench.py --model $C --depth 2 --max-tokens 16 --repeats 1 2>&1 | grep -v 'regex pattern' | tail -n 4" 420
say agent warm
T "$PY scripts/bench/agent_session.py --model $C --system-tokens 20000 --result-tokens 200 2000 800 1500 400 --runs warm --json $O/agent_warm_9b.json 2>&1 | grep -v 'regex pattern' | grep -E 'turn [0-9]:|done|failed'" 300
say agent restart, 4 turns
T "$PY scripts/bench/agent_session.py --model $C --system-tokens 20000 --result-tokens 200 2000 800 --turns 4 --runs restart --json $O/agent_restart_9b.json 2>&1 | grep -v 'regex pattern' | grep -E 'turn [0-9]:|server up|done|failed'" 420
say long contexts and the attention kernel: shared-memory banks now conflict-free
STAGES=long STEP_TIMEOUT=300 bash scripts/gpu/gpu_bench.sh $O
T "$PY scripts/gpu/gpu_attention.py --json $O/attention.json 2>&1 | tail -n 20" 240
say batch
STAGES=batch STEP_TIMEOUT=300 bash scripts/gpu/gpu_bench.sh $O
say batch graph
T "$PY scripts/bench/batch_graph.py --model $C --json $O/batch_graph_9b.json 2>&1 | grep -v 'regex pattern' | tail -n 8" 240
say moe check
M=/tmp/mtp_chat_q35a3b
[ -f $M/config.json ] || $PY scripts/gpu/gpu_make_checkpoint.py --out $M --shape 35b-a3b
T "$PY scripts/gpu/gpu_check.py --model $M --model-only --json $O/moe_check.json > $O/moe_check.log 2>&1; tail -n 20 $O/moe_check.log" 420
say demo, 256 tokens: auto, then depth 3
for d in auto 3; do
  T "$PY scripts/bench/bench.py --model models/demo --depth $d --temperature 0 --top-p 0.95 --top-k 20 --max-tokens 256 --repeats 3 --json $O/demo_t0_256_d$d.json 2>&1 | grep -v 'regex pattern' | tail -n 6" 200
done
tar czf $O/ptx.tgz -C /root/.cache/mtp-chat ptx && ls -la $O/ptx.tgz
say all done
