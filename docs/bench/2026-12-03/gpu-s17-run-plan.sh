#!/usr/bin/env bash
# Seventeenth session's run (prepared in the sixteenth, GPU.md section 16), about 600 s with setup.
# Issue 32's figures that are near their targets, each measured three times in one run:
# 1. At 64 tokens of context (gpu_long.py): the verify of 2-5 positions in AR steps (targets
#    1.10 / 1.15 / 1.20 / 1.25; section 11: 1.10 / 1.11 / 1.15 / 1.27) and the MTP step (target
#    0.15; 0.15-0.17 so far).
# 2. AR at 4 requests against 1 (target 2.5x; 2.49 and 2.53x in section 16), lanes ar only, 3 runs.
# 3. AR and mlx_lm paired at depth 2 (bench.py, T = 0): the AR lane against mlx_lm's.
# Wheels in four calls: .whl/c1 .. .whl/c4 (scripts/gpu/carry_wheels.sh). Say lines hold no quotes.
source scripts/gpu/run_plan.sh   # /tmp/repo, $O, $C, say, T; the 9B checkpoint
say warm-up with the PTX cache from the repository
T "$PY scripts/bench/bench.py --model $C --depth 2 --max-tokens 16 --repeats 1 --no-mlx-lm 2>&1 | grep -v 'regex pattern' | tail -n 3" 480
say verify widths and the MTP step at 64 tokens of context, three runs
for k in 1 2 3; do
T "$PY scripts/gpu/gpu_long.py --model $C --context 64 --json $O/long64_$k.json 2>&1 | grep -v 'regex pattern' | tail -n 4" 150
done
say AR, 4 requests against 1, three runs
for k in 1 2 3; do
T "$PY scripts/bench/bench_batch.py --model $C --requests 1 4 --tokens 256 --repeats 5 --long-prompt 0 --streams 0 --lanes ar --json $O/batch_ar_256_$k.json 2>&1 | grep -v 'regex pattern' | tail -n 3" 150
done
say AR and mlx_lm at depth 2
T "$PY scripts/bench/bench.py --model $C --depth 2 --temperature 0 --max-tokens 128 --repeats 3 --json $O/bench_d2_t0.json 2>&1 | grep -v 'regex pattern' | tail -n 4" 240
say all done
