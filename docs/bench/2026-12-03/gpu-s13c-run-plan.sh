#!/usr/bin/env bash
# Thirteenth session's third run, in the device time left (about 270 s): where a prefill chunk's
# fixed ~21 ms goes, by the depth behind it (gpu_chunk_probe.py --depths).
source scripts/gpu/run_plan.sh   # /tmp/repo, $O, $C, say, T; the 9B checkpoint
say chunk sizes by depth
T "$PY scripts/gpu/gpu_chunk_probe.py --model $C --depth 20000 --tokens 5 64 512 --repeats 3 --fresh --overlap --depths 0 4096 20000 --json $O/chunk_depths.json 2>&1 | grep -v 'regex pattern' | grep -E 'by depth|wrote|Error'" 200
say all done
