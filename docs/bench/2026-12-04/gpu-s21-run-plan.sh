#!/usr/bin/env bash
# Prepared in the twentieth session (2026-12-04, GPU.md "Next GPU session") for the next one, ~750 s
# with setup: MLX's CUDA graphs off against on in the product's lanes, to decide the default
# (section 20: MTP in real cycles 1.93-2.00x at depth 3 with them off against 1.71-1.87x on, AR's lane
# the same in the oracle's processes, but one 64-token AR run 25 % slower off). MLX reads
# MLX_USE_CUDA_GRAPHS once a process, so each setting is its own process, in the order on off on off:
# 1. bench.py at the 9B shape, greedy, depth 2, with mlx_lm's lane (AR against mlx_lm: mlx_lm's
#    figure to keep is the graphs-on process's, as its users run it);
# 2. gpu_oracle.py (real cycles at the Qwythos acceptance, depths 1-3);
# 3. the demo model (trained weights, real acceptance), greedy, depth 3, the Race's prompts;
# 4. the ahead trial (the MTP lane builds the next cycle while a verify runs, on the guess that every
#    draft passes) against the default: the oracle (its tokens checked against AR's) and the demo;
# 5. gpu_trace.py both ways: each call's kernels, and its primitives and Python build (the head's
#    ~47 primitives: what fewer launches in the head would remove).
# Wheels in four calls: .whl/c1 .. .whl/c4 (scripts/gpu/carry_wheels.sh). Say lines hold no quotes.
source scripts/gpu/run_plan.sh   # /tmp/repo, $O, $C, say, T; the 9B checkpoint
G="grep -v 'regex pattern'"
say warm-up with the PTX cache from the repository
T "$PY scripts/bench/bench.py --model $C --depth 2 --max-tokens 16 --repeats 1 --no-mlx-lm 2>&1 | $G | tail -n 2" 240
for k in 1 2; do
for g in on off; do
  E=""; [ $g = off ] && E="MLX_USE_CUDA_GRAPHS=0"
  say round $k, CUDA graphs $g
  T "$E $PY scripts/bench/bench.py --model $C --depth 2 --max-tokens 128 --repeats 2 --json $O/q9b_greedy_${g}$k.json 2>&1 | $G | tail -n 2" 150
  T "$E $PY scripts/gpu/gpu_oracle.py --model $C --tokens 256 --repeats 2 --json $O/oracle_${g}$k.json 2>&1 | $G | tail -n 3" 120
  T "$E $PY scripts/bench/bench.py --model models/demo --depth 3 --max-tokens 128 --prompts-file scripts/demo_model/race_prompts.txt --repeats 3 --no-mlx-lm --json $O/demo_greedy_d3_${g}$k.json 2>&1 | $G | tail -n 2" 120
done
done
say the ahead trial against the default, graphs on: the oracle twice, the demo once, A B A B
for k in 1 2; do
  T "$PY scripts/gpu/gpu_oracle.py --model $C --tokens 256 --repeats 2 --json $O/oracle_default$k.json 2>&1 | $G | tail -n 3" 120
  T "MTP_CHAT_GPU_TRIALS=ahead $PY scripts/gpu/gpu_oracle.py --model $C --tokens 256 --repeats 2 --json $O/oracle_ahead$k.json 2>&1 | $G | tail -n 3" 120
done
T "$PY scripts/bench/bench.py --model models/demo --depth 3 --max-tokens 128 --prompts-file scripts/demo_model/race_prompts.txt --repeats 3 --no-mlx-lm --json $O/demo_greedy_d3_default.json 2>&1 | $G | tail -n 2" 120
T "MTP_CHAT_GPU_TRIALS=ahead $PY scripts/bench/bench.py --model models/demo --depth 3 --max-tokens 128 --prompts-file scripts/demo_model/race_prompts.txt --repeats 3 --no-mlx-lm --json $O/demo_greedy_d3_ahead.json 2>&1 | $G | tail -n 2" 120
say the calls traced with CUDA graphs on, then off: kernels, primitives and Python build of each call
T "$PY scripts/gpu/gpu_trace.py --model $C --json $O/trace_on.json 2>&1 | $G | grep -v '^  ' | tail -n 8" 120
T "MLX_USE_CUDA_GRAPHS=0 $PY scripts/gpu/gpu_trace.py --model $C --json $O/trace_off.json 2>&1 | $G | grep -v '^  ' | tail -n 8" 120
say all done
