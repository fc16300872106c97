#!/usr/bin/env bash
# Prepared in the nineteenth session (2026-12-04, GPU.md "Next GPU session") for the next one, ~650 s
# with setup: where the MTP head's step goes (issue 32's last target, 0.19 AR steps against 0.15), and
# the "topk-draw" trial (the top-k kernel also drawing the token; compiled with NVRTC here only).
# 1. gpu_trace.py: every kernel of an AR step, a verify of 3, the MTP step, the head's layer and the
#    output projection, through CUPTI (PyTorch's profiler, in the machine's image): the GPU's busy and
#    idle time inside each, the host's lead before its first kernel, the kernels by time;
# 2. MTP/AR timed in real cycles at the Qwythos acceptance (gpu_oracle.py: greedy AR's tokens known,
#    each depth's draft right with probability 0.93 / 0.90 / 0.85): the figure the cost model projects;
#    then the MTP step with MLX's CUDA graphs off against on (gpu_long.py, each cost taking turns);
# 3. topk-draw: its check and a draw's cost, the sampled lanes A B A B at the 9B shape, the chi-square.
# Wheels in four calls: .whl/c1 .. .whl/c4 (scripts/gpu/carry_wheels.sh). Say lines hold no quotes.
source scripts/gpu/run_plan.sh   # /tmp/repo, $O, $C, say, T; the 9B checkpoint
say kernels of a step, a verify and the MTP step through CUPTI
T "$PY scripts/gpu/gpu_trace.py --model $C --json $O/trace.json 2>&1 | grep -v 'regex pattern' | tail -n 40" 240
say MTP against AR measured at the Qwythos acceptance, drafts steered by an oracle, depths 1-3
T "$PY scripts/gpu/gpu_oracle.py --model $C --tokens 256 --repeats 3 --json $O/oracle.json 2>&1 | grep -v 'regex pattern' | tail -n 4" 240
say the MTP step with CUDA graphs off, then on
T "MLX_USE_CUDA_GRAPHS=0 $PY scripts/gpu/gpu_long.py --model $C --context 64 --json $O/long64_graphs_off.json 2>&1 | grep -v 'regex pattern' | tail -n 2" 150
T "$PY scripts/gpu/gpu_long.py --model $C --context 64 --json $O/long64_graphs_on.json 2>&1 | grep -v 'regex pattern' | tail -n 2" 150
say what a draw costs, the top-k kernel drawing and not
T "$PY scripts/gpu/gpu_draw.py --json $O/draw.json 2>&1 | grep -v 'regex pattern' | tail -n 30" 200
S="--depth 2 --temperature 0.6 --top-p 0.95 --top-k 20 --max-tokens 128 --no-mlx-lm"
say sampled lanes on the 9B shape, default against topk-draw, A B A B
for k in 1 2; do
T "$PY scripts/bench/bench.py --model $C $S --repeats 3 --json $O/q9b_t06_a$k.json 2>&1 | grep -v 'regex pattern' | tail -n 3" 150
T "MTP_CHAT_GPU_TRIALS=topk-draw $PY scripts/bench/bench.py --model $C $S --repeats 3 --json $O/q9b_t06_draw_b$k.json 2>&1 | grep -v 'regex pattern' | tail -n 3" 150
done
say the sampled check with topk-draw
T "MTP_CHAT_GPU_TRIALS=topk-draw $PY scripts/gpu/gpu_exact.py --model $C --skip parity prefix costs --json $O/exact_sampled_draw.json 2>&1 | grep -v 'regex pattern' | tail -n 4" 300
say all done
