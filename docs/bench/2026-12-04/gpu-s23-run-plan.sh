#!/usr/bin/env bash
# Prepared in the twenty-second session (2026-12-04, GPU.md "Next GPU session") for the next one:
# issue 32's done-when reproduced at the current tree, figure by figure, in two calls on one warm
# machine (scripts/gpu/gpu_targets.py writes $O/targets.json at the end of each):
#   bash docs/bench/2026-12-04/gpu-s23-run-plan.sh targets1   # exactness at 512 tokens (64 and 8k), AR vs mlx_lm
#   bash docs/bench/2026-12-04/gpu-s23-run-plan.sh targets2   # step costs, 4 requests, the demo, real cycles
# run_plan.sh works from a copy in /tmp/repo (a call's own copy goes when the call ends) and makes
# the 9B checkpoint once; the second call finds it. Say lines hold no quotes.
source scripts/gpu/run_plan.sh   # /tmp/repo, $O, $C, say, T; the 9B checkpoint
say stages $1
STAGES=$1 CKPT=$C PYTHON=$PY bash scripts/gpu/gpu_bench.sh $O 2>&1 | grep -v 'regex pattern'
say all done
