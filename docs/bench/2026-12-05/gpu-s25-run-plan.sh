#!/usr/bin/env bash
# The twenty-fifth session's GPU run (issue 32): the Gated-DeltaNet middle rewritten so that only
# its delta rule runs position by position (adapters/kernels/gdn_fused.py), checked and timed
# against the version before it, then the done-when's figures at this tree:
#   bash docs/bench/2026-12-05/gpu-s25-run-plan.sh ab         # gpu_gdn_ab.py (bits and time, paired) and gpu_fused_gdn.py
#   bash docs/bench/2026-12-05/gpu-s25-run-plan.sh targets2   # step costs, 4 requests, the demo, real cycles
#   bash docs/bench/2026-12-05/gpu-s25-run-plan.sh targets1   # exactness at 512 tokens (64 and 8k), AR vs mlx_lm
# run_plan.sh works from a copy in /tmp/repo and makes the 9B checkpoint once. Say lines hold no quotes.
source scripts/gpu/run_plan.sh   # /tmp/repo, $O, $C, say, T; the 9B checkpoint
say stages $1
case $1 in
ab) T "$PY scripts/gpu/gpu_gdn_ab.py --json $O/gdn_ab.json --before 6ddf101" 300
    T "$PY scripts/gpu/gpu_fused_gdn.py --model $C --json $O/fused_gdn.json" 200 ;;
*)  STAGES=$1 CKPT=$C PYTHON=$PY bash scripts/gpu/gpu_bench.sh $O 2>&1 | grep -v 'regex pattern' ;;
esac
say all done
