#!/usr/bin/env bash
# Sixteenth session's run, about 800 s with setup:
# 1. The 9B exactness with the new default: a verify of several sequences handed to the GPU every 8
#    layers (section 15's verify-submit trial, for batches only; one sequence's verify waits).
# 2. Issue 32, 4 requests against 1 at 256 tokens, A B A B: the default against the trial that
#    turns the batch's submit off (batch-verify-wait), AR measured in both A runs.
# 3. Issue 36, the agent session warm, A B: prefill chunks of planned lengths (a multiple of 16,
#    then what is left), each run once at the warm-up, against chunk step 0 (section 15's chunks).
#    Then one request at depth 2 (bench.py, T = 0.6: one sequence's verify unchanged) and the
#    agent session restarted, 3 turns.
# Wheels in four calls: .whl/c1 .. .whl/c4 (scripts/gpu/carry_wheels.sh); the PTX cache comes
# from the repository (scripts/gpu/ptx/). Say lines hold no quotes or parentheses (bash).
source scripts/gpu/run_plan.sh   # /tmp/repo, $O, $C, say, T; the 9B checkpoint
say warm-up with the PTX cache from the repository
T "$PY scripts/bench/bench.py --model $C --depth 2 --max-tokens 16 --repeats 1 --no-mlx-lm 2>&1 | grep -v 'regex pattern' | tail -n 3" 480
say 9B exactness with the batch submit default
T "$PY scripts/gpu/gpu_check.py --model $C --model-only --json $O/check_9b.json > $O/check_9b.log 2>&1; grep -E 'identical|FAIL' $O/check_9b.log | head -n 8" 300
say 4 requests against 1, A B A B, AR in both A runs
T "$PY scripts/bench/bench_batch.py --model $C --requests 1 4 --tokens 256 --repeats 5 --long-prompt 0 --streams 0 --json $O/batch_9b_256_a1.json 2>&1 | grep -v 'regex pattern' | tail -n 5" 240
T "MTP_CHAT_GPU_TRIALS=batch-verify-wait $PY scripts/bench/bench_batch.py --model $C --requests 1 4 --tokens 256 --repeats 5 --long-prompt 0 --streams 0 --lanes mtp --json $O/batch_9b_256_wait_b1.json 2>&1 | grep -v 'regex pattern' | tail -n 3" 180
T "$PY scripts/bench/bench_batch.py --model $C --requests 1 4 --tokens 256 --repeats 5 --long-prompt 0 --streams 0 --json $O/batch_9b_256_a2.json 2>&1 | grep -v 'regex pattern' | tail -n 5" 240
T "MTP_CHAT_GPU_TRIALS=batch-verify-wait $PY scripts/bench/bench_batch.py --model $C --requests 1 4 --tokens 256 --repeats 5 --long-prompt 0 --streams 0 --lanes mtp --json $O/batch_9b_256_wait_b2.json 2>&1 | grep -v 'regex pattern' | tail -n 3" 180
say agent warm, planned chunk lengths then chunk step 0
T "$PY scripts/bench/agent_session.py --model $C --system-tokens 20000 --result-tokens 200 2000 800 1500 400 --runs warm --json $O/agent_warm_9b.json 2>&1 | grep -v 'regex pattern' | grep -E 'turn [0-9]:|done|failed'" 300
T "MTP_CHAT_PREFILL_CHUNK_STEP=0 $PY scripts/bench/agent_session.py --model $C --system-tokens 20000 --result-tokens 200 2000 800 1500 400 --runs warm --json $O/agent_warm_step0_9b.json 2>&1 | grep -v 'regex pattern' | grep -E 'turn [0-9]:|done|failed'" 300
say one request, AR and MTP d2
T "$PY scripts/bench/bench.py --model $C --depth 2 --max-tokens 128 --repeats 3 --no-mlx-lm --json $O/bench_d2.json 2>&1 | grep -v 'regex pattern' | tail -n 4" 180
say agent restart, 3 turns
T "$PY scripts/bench/agent_session.py --model $C --system-tokens 20000 --result-tokens 200 2000 --turns 3 --runs restart --json $O/agent_restart_9b.json 2>&1 | grep -v 'regex pattern' | grep -E 'turn [0-9]:|server up|done|failed'" 360
say all done
