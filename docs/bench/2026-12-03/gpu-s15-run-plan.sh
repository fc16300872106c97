#!/usr/bin/env bash
# Fifteenth session's run, prepared in the fourteenth (GPU.md section 14), about 800 s with setup:
# 1. The 9B exactness, default and with the verify-submit trial (a verify's layers handed to the
#    GPU every 8 while the host builds the rest; it cannot move a value, checked anyway).
# 2. Issue 32, 4 requests against 1: the rollback where every row keeps as many positions is a
#    slice now (no gather or selects: on random weights every cycle, at Qwythos acceptance about
#    half), the default and the verify-submit trial in turn, A B A B; the batch graph both ways.
#    Then the one-request lanes, bench.py at depth 2, both ways (the trial took MTP d2 +10 % when
#    submit covered every forward, 2026-12-02 section 8).
# 3. Issue 36, the agent session warm: the reply's snapshot now starts at the model's first idle
#    poll (grace 0) and a call that comes while it runs waits for it and starts from it: read the
#    client's ratios too, which count that wait, and agent_session's 'from the reply snapshot'. Then where a turn's new chunk
#    length costs ~20 ms more on first use (gpu_chunk_parts.py: its build, encode and wait).
# Wheels in four calls: .whl/c1 .. .whl/c4 (scripts/gpu/carry_wheels.sh); the PTX cache comes
# from the repository (scripts/gpu/ptx/). Say lines hold no quotes or parentheses (bash).
source scripts/gpu/run_plan.sh   # /tmp/repo, $O, $C, say, T; the 9B checkpoint
say warm-up with the PTX cache from the repository
T "$PY scripts/bench/bench.py --model $C --depth 2 --max-tokens 16 --repeats 1 --no-mlx-lm 2>&1 | grep -v 'regex pattern' | tail -n 3" 480
say 9B exactness, default then the verify-submit trial
T "$PY scripts/gpu/gpu_check.py --model $C --model-only --json $O/check_9b.json > $O/check_9b.log 2>&1; grep -E 'identical|FAIL' $O/check_9b.log | head -n 8" 300
T "MTP_CHAT_GPU_TRIALS=verify-submit $PY scripts/gpu/gpu_check.py --model $C --model-only --json $O/check_9b_vsubmit.json > $O/check_9b_vsubmit.log 2>&1; grep -E 'identical|FAIL|trials' $O/check_9b_vsubmit.log | head -n 8" 300
say 4 requests against 1, A B A B
T "$PY scripts/bench/bench_batch.py --model $C --requests 1 4 --tokens 256 --repeats 5 --long-prompt 0 --streams 0 --json $O/batch_9b_256_a1.json 2>&1 | grep -v 'regex pattern' | tail -n 5" 240
T "MTP_CHAT_GPU_TRIALS=verify-submit $PY scripts/bench/bench_batch.py --model $C --requests 1 4 --tokens 256 --repeats 5 --long-prompt 0 --streams 0 --lanes mtp --json $O/batch_9b_256_vsubmit_b1.json 2>&1 | grep -v 'regex pattern' | tail -n 3" 180
T "$PY scripts/bench/bench_batch.py --model $C --requests 1 4 --tokens 256 --repeats 5 --long-prompt 0 --streams 0 --lanes mtp --json $O/batch_9b_256_a2.json 2>&1 | grep -v 'regex pattern' | tail -n 3" 180
T "MTP_CHAT_GPU_TRIALS=verify-submit $PY scripts/bench/bench_batch.py --model $C --requests 1 4 --tokens 256 --repeats 5 --long-prompt 0 --streams 0 --lanes mtp --json $O/batch_9b_256_vsubmit_b2.json 2>&1 | grep -v 'regex pattern' | tail -n 3" 180
say batch graph both ways
T "$PY scripts/bench/batch_graph.py --model $C --batch 1 4 --steps 8 --lanes mtp --json $O/batch_graph_9b.json 2>&1 | grep -v 'regex pattern' | tail -n 4" 180
T "MTP_CHAT_GPU_TRIALS=verify-submit $PY scripts/bench/batch_graph.py --model $C --batch 1 4 --steps 8 --lanes mtp --json $O/batch_graph_9b_vsubmit.json 2>&1 | grep -v 'regex pattern' | tail -n 4" 180
say one request, AR and MTP d2, both ways
T "$PY scripts/bench/bench.py --model $C --depth 2 --max-tokens 128 --repeats 3 --no-mlx-lm --json $O/bench_d2.json 2>&1 | grep -v 'regex pattern' | tail -n 4" 180
T "MTP_CHAT_GPU_TRIALS=verify-submit $PY scripts/bench/bench.py --model $C --depth 2 --max-tokens 128 --repeats 3 --no-mlx-lm --json $O/bench_d2_vsubmit.json 2>&1 | grep -v 'regex pattern' | tail -n 4" 180
say agent warm, the history snapshot at once
T "$PY scripts/bench/agent_session.py --model $C --system-tokens 20000 --result-tokens 200 2000 800 1500 400 --runs warm --json $O/agent_warm_9b.json 2>&1 | grep -v 'regex pattern' | grep -E 'turn [0-9]:|done|failed'" 300
say a new chunk length, first use against later ones
T "$PY scripts/gpu/gpu_chunk_parts.py --model $C --tokens 470 229 512 --json $O/chunk_parts.json 2>&1 | grep -E '^T=|wrote'" 180
tar czf $O/ptx.tgz -C /root/.cache/mtp-chat ptx && ls -la $O/ptx.tgz
say all done
