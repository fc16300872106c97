#!/usr/bin/env bash
# Thirteenth session's second run (GPU.md section 13): prefill chunks overlapping (the device runs
# one while the host builds the next, core.stream.PIPELINE) and the long runner handing the device
# its layers every 4 (GpuPrefill.submit_every), the disk cache no longer emptying MLX's buffer cache
# after each write, for issue 36's warm and restarted agent turns; the chunk probe's cleared table.
# Wheels as in the first run (.whl/pa, .whl/web1, .whl/ptx, then .whl/p3 with this plan).
# Say lines hold no quotes or parentheses: the first run stopped at one (bash syntax).
source scripts/gpu/run_plan.sh   # /tmp/repo, $O, $C, say, T; the 9B checkpoint
say chunk probe with the overlap table at 20k tokens of depth
T "$PY scripts/gpu/gpu_chunk_probe.py --model $C --depth 20000 --fresh --json $O/chunk_probe.json 2>&1 | grep -v 'regex pattern' | tail -n 8" 300
say agent warm
T "$PY scripts/bench/agent_session.py --model $C --system-tokens 20000 --result-tokens 200 2000 800 1500 400 --runs warm --json $O/agent_warm_9b.json 2>&1 | grep -v 'regex pattern' | grep -E 'turn [0-9]:|done|failed'" 300
say 9B exactness with overlapping chunks
T "$PY scripts/gpu/gpu_check.py --model $C --model-only --json $O/check_9b.json > $O/check_9b.log 2>&1; grep -E 'identical|FAIL|kernels' $O/check_9b.log | head -n 12" 300
say agent restart, 4 turns
T "$PY scripts/bench/agent_session.py --model $C --system-tokens 20000 --result-tokens 200 2000 800 --turns 4 --runs restart --json $O/agent_restart_9b.json 2>&1 | grep -v 'regex pattern' | grep -E 'turn [0-9]:|server up|done|failed'" 420
say all done
