#!/usr/bin/env bash
# Eighteenth session's run (2026-12-04), about 450 s with setup. Issue 32's two figures still at
# their targets' edge, measured so that the host's drift of 10-30 % in minutes cancels:
# 1. AR at 4 requests against 1 (target 2.5x): bench_batch.py now alternates the sizes within each
#    repeat and reports each repeat's ratio (paired_vs_1), runs A B A B: the default against the
#    batch-submit trial (a batch's plain step handed to the GPU every 8 layers, as a batch's verify
#    is by default: its step is host-bound, build 3.3 + submit 4.3 ms against 7.6 ms synced).
# 2. MTP depth 2 at 4 requests against 1, the same pairing within repeats (target 2.5x).
# 3. The MTP step at 64 tokens of context (gpu_long.py; target 0.15: 0.15 / 0.17 / 0.15 in s17),
#    three runs more.
# Wheels in four calls: .whl/c1 .. .whl/c4 (scripts/gpu/carry_wheels.sh). Say lines hold no quotes.
source scripts/gpu/run_plan.sh   # /tmp/repo, $O, $C, say, T; the 9B checkpoint
say warm-up with the PTX cache from the repository
T "$PY scripts/bench/bench.py --model $C --depth 2 --max-tokens 16 --repeats 1 --no-mlx-lm 2>&1 | grep -v 'regex pattern' | tail -n 3" 480
BB="scripts/bench/bench_batch.py --model $C --requests 1 4 --tokens 256 --repeats 5 --long-prompt 0 --streams 0"
say AR, 4 requests against 1, default against batch-submit, A B A B
for k in 1 2; do
T "$PY $BB --lanes ar --json $O/batch_ar_256_a$k.json 2>&1 | grep -v 'regex pattern' | tail -n 4" 150
T "MTP_CHAT_GPU_TRIALS=batch-submit $PY $BB --lanes ar --json $O/batch_ar_256_submit_b$k.json 2>&1 | grep -v 'regex pattern' | tail -n 4" 150
done
say MTP depth 2, 4 requests against 1
T "$PY $BB --lanes mtp --json $O/batch_mtp_256.json 2>&1 | grep -v 'regex pattern' | tail -n 4" 200
say the MTP step at 64 tokens of context, three runs
for k in 1 2 3; do
T "$PY scripts/gpu/gpu_long.py --model $C --context 64 --json $O/long64_$k.json 2>&1 | grep -v 'regex pattern' | tail -n 2" 150
done
say all done
