#!/bin/bash
# Runs several training configs in parallel on one GPU (small models leave an H200 mostly idle),
# then packs logs/metrics into $OUT.  Usage: gpu_sweep.sh SECONDS "name|args" "name|args" ...
# Each run writes artifacts/demo/gpu/<name>-NN.safetensors, <name>.json, <name>.log.
set -u
SECS=$1; shift
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=2
OUTDIR=${OUT:-artifacts/demo/out}
mkdir -p artifacts/demo/gpu "$OUTDIR"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
pids=()
for spec in "$@"; do
  name=${spec%%|*}; args=${spec#*|}
  python3 scripts/demo_model/train_torch.py --out artifacts/demo/gpu --name "$name" --seconds "$SECS" $args \
    > "artifacts/demo/gpu/$name.stdout" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait $p; done
for spec in "$@"; do name=${spec%%|*}; grep -E "step (1|[0-9]*000) |trained|acceptance|done|Error|error" "artifacts/demo/gpu/$name.stdout" | tail -12; done
tar czf "$OUTDIR/sweep_logs.tgz" artifacts/demo/gpu/*.json artifacts/demo/gpu/*.stdout 2>/dev/null
nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader || true
