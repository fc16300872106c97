#!/usr/bin/env bash
# Twentieth session's second run (2026-12-04, GPU.md section 20), ~200 s with setup: MLX's CUDA graphs
# off against on, where section 20's trace found a small evaluation's fixed costs (graph create,
# update, launch: ~0.3 ms of the MTP step's 1.4) and gpu_long's synchronised step costs came out
# lower with them off (AR step 6.59 against 6.87 ms, MTP step 0.175 against 0.210). MLX reads
# MLX_USE_CUDA_GRAPHS once a process, so each setting is a process of its own:
# 1. gpu_oracle.py (real cycles at the Qwythos acceptance, depths 1-3, AR's tok/s beside) on, off, on, off;
# 2. gpu_long.py (the step costs taking turns, now with the chained draft step) on, off.
# Wheels in four calls: .whl/c1 .. .whl/c4 (scripts/gpu/carry_wheels.sh). Say lines hold no quotes.
source scripts/gpu/run_plan.sh   # /tmp/repo, $O, $C, say, T; the 9B checkpoint
G="grep -v 'regex pattern'"
for k in 1 2; do
say oracle with CUDA graphs on, then off, round $k
T "$PY scripts/gpu/gpu_oracle.py --model $C --tokens 256 --repeats 2 --json $O/oracle_on$k.json 2>&1 | $G | tail -n 3" 120
T "MLX_USE_CUDA_GRAPHS=0 $PY scripts/gpu/gpu_oracle.py --model $C --tokens 256 --repeats 2 --json $O/oracle_off$k.json 2>&1 | $G | tail -n 3" 120
done
say step costs with CUDA graphs on, then off
T "$PY scripts/gpu/gpu_long.py --model $C --context 64 --json $O/long64_on.json 2>&1 | $G | tail -n 1" 100
T "MLX_USE_CUDA_GRAPHS=0 $PY scripts/gpu/gpu_long.py --model $C --context 64 --json $O/long64_off.json 2>&1 | $G | tail -n 1" 100
say all done
