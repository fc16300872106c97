#!/usr/bin/env bash
# Prepared in the eighteenth session (2026-12-04, GPU.md "Next GPU session") for the next one, ~450 s
# with setup. The "topk-kernel" trial (adapters/kernels/cuda_topk.py: the sampler's top-k support in
# two launches where MLX's ops take ~10; compiled with NVRTC on the CPU, never run on a GPU yet):
# 1. its check and what a draw costs with it and without (gpu_draw.py);
# 2. the sampled lanes, A B A B, default against the trial: bench.py at T = 0.6 (top_k 20, top_p 0.95),
#    depth 2, on the demo model (real acceptance) and on the 9B shape;
# 3. exactness with the trial on: the chi-square of sampled tokens (gpu_exact.py's sampled part);
# 4. the MTP step (issue 32's last target) with gpu_long.py's costs now taking turns in each round.
# About 600 s in all: the fourth wheel call waits up to ~560 s, a poll at once brings the rest.
# Wheels in four calls: .whl/c1 .. .whl/c4 (scripts/gpu/carry_wheels.sh). Say lines hold no quotes.
source scripts/gpu/run_plan.sh   # /tmp/repo, $O, $C, say, T; the 9B checkpoint
say what a draw costs, with the top-k kernel and without
T "$PY scripts/gpu/gpu_draw.py --json $O/draw.json 2>&1 | grep -v 'regex pattern' | tail -n 30" 200
say warm-up with the PTX cache from the repository
T "$PY scripts/bench/bench.py --model $C --depth 2 --max-tokens 16 --repeats 1 --no-mlx-lm 2>&1 | grep -v 'regex pattern' | tail -n 3" 480
S="--depth 2 --temperature 0.6 --top-p 0.95 --top-k 20 --max-tokens 128 --no-mlx-lm"
say sampled lanes on the demo model, default against topk-kernel, A B A B
for k in 1 2; do
T "$PY scripts/bench/bench.py --model models/demo $S --prompts-file scripts/demo_model/race_prompts.txt --repeats 8 --json $O/demo_t06_a$k.json 2>&1 | grep -v 'regex pattern' | tail -n 3" 150
T "MTP_CHAT_GPU_TRIALS=topk-kernel $PY scripts/bench/bench.py --model models/demo $S --prompts-file scripts/demo_model/race_prompts.txt --repeats 8 --json $O/demo_t06_topk_b$k.json 2>&1 | grep -v 'regex pattern' | tail -n 3" 150
done
say sampled lanes on the 9B shape, default against topk-kernel, A B A B
for k in 1 2; do
T "$PY scripts/bench/bench.py --model $C $S --repeats 3 --json $O/q9b_t06_a$k.json 2>&1 | grep -v 'regex pattern' | tail -n 3" 150
T "MTP_CHAT_GPU_TRIALS=topk-kernel $PY scripts/bench/bench.py --model $C $S --repeats 3 --json $O/q9b_t06_topk_b$k.json 2>&1 | grep -v 'regex pattern' | tail -n 3" 150
done
say the sampled check with topk-kernel
T "MTP_CHAT_GPU_TRIALS=topk-kernel $PY scripts/gpu/gpu_exact.py --model $C --skip parity prefix costs --json $O/exact_sampled_topk.json 2>&1 | grep -v 'regex pattern' | tail -n 4" 300
say the MTP step at 64 tokens of context, three runs, each cost taking turns in every round
for k in 1 2 3; do
T "$PY scripts/gpu/gpu_long.py --model $C --context 64 --json $O/long64_$k.json 2>&1 | grep -v 'regex pattern' | tail -n 2" 150
done
say all done
