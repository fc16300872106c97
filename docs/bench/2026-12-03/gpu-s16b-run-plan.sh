#!/usr/bin/env bash
# Sixteenth session's second run (the last ~300 s of device time): the agent session warm after
# the fix found on the CPU: a reply's history snapshot goes before the background work waiting
# (the disk's writes, the cost model's measures), so the next call starts from it.
source scripts/gpu/run_plan.sh   # /tmp/repo, $O, $C, say, T; the 9B checkpoint
say agent warm, the reply snapshot first in idle time
T "$PY scripts/bench/agent_session.py --model $C --system-tokens 20000 --result-tokens 200 2000 800 1500 400 --runs warm --json $O/agent_warm_9b.json 2>&1 | grep -v 'regex pattern' | grep -E 'turn [0-9]:|done|failed'" 200
say all done
