#!/usr/bin/env bash
# Eighteenth session's second run (2026-12-04), about 300 s with setup. Issue 32's MTP step (target
# 0.15 AR steps; 0.15-0.17 at 64 tokens of context): what a draw from a logit row costs
# (gpu_draw.py: MLX's argmax, the split-row argmax kernel, the default sampler's parts), then the
# step with the kernel's argmax and with MLX's, taking turns (gpu_long.py, three runs), greedy
# MTP == AR with it (gpu_exact.py), AR against mlx_lm at depth 2 (bench.py).
# Wheels in four calls: .whl/c1 .. .whl/c4 (scripts/gpu/carry_wheels.sh). Say lines hold no quotes.
source scripts/gpu/run_plan.sh   # /tmp/repo, $O, $C, say, T; the 9B checkpoint
say what a draw costs
T "$PY scripts/gpu/gpu_draw.py --json $O/draw.json 2>&1 | grep -v 'regex pattern' | tail -n 24" 200
say warm-up with the PTX cache from the repository
T "$PY scripts/bench/bench.py --model $C --depth 2 --max-tokens 16 --repeats 1 --no-mlx-lm 2>&1 | grep -v 'regex pattern' | tail -n 3" 480
say the MTP step at 64 tokens of context, three runs
for k in 1 2 3; do
T "$PY scripts/gpu/gpu_long.py --model $C --context 64 --json $O/long64_$k.json 2>&1 | grep -v 'regex pattern' | tail -n 2" 150
done
say greedy MTP == AR at depths 1-3
T "$PY scripts/gpu/gpu_exact.py --model $C --tokens 256 --skip sampled costs --json $O/exact.json 2>&1 | grep -v 'regex pattern' | tail -n 6" 300
say AR and mlx_lm at depth 2
T "$PY scripts/bench/bench.py --model $C --depth 2 --temperature 0 --max-tokens 128 --repeats 3 --json $O/bench_d2_t0.json 2>&1 | grep -v 'regex pattern' | tail -n 4" 240
say all done
