#!/bin/sh
# The toolkits scripts/gpu/nvrtc_check.py compiles with, in $NVRTC_DIR (default /tmp/nvc, ~900 MB):
# site13 and site12 (NVRTC, CUDA headers, CCCL, ptxas) from PyPI, and mlxinc (MLX's device headers).
# Pin NVRTC13 to the version the GPU machine has, e.g.
#   NVRTC13='==13.0.*' sh scripts/gpu/nvrtc_setup.sh
set -e
mkdir -p "${NVRTC_DIR:-/tmp/nvc}" && cd "${NVRTC_DIR:-/tmp/nvc}"
V13=${NVRTC13:-==13.*}
rm -rf wheels13 site13 wheels12 site12
pip download -q --no-deps -d wheels13 "nvidia-cuda-nvrtc$V13" "nvidia-cuda-runtime$V13" "nvidia-cuda-nvcc$V13" \
    "nvidia-cuda-crt$V13" nvidia-cuda-cccl
pip download -q --no-deps -d wheels12 "nvidia-cuda-nvrtc-cu12==12.9.*" "nvidia-cuda-runtime-cu12==12.9.*" \
    "nvidia-cuda-nvcc-cu12==12.9.*" "nvidia-cuda-cccl-cu12==12.9.*"
for w in wheels13/*.whl; do python3 -m zipfile -e "$w" site13/; done
for w in wheels12/*.whl; do python3 -m zipfile -e "$w" site12/; done
# MLX's device headers (what MLX compiles into libmlx as jit sources): mlx/backend/cuda/device/*
if [ ! -d mlxinc/mlx/backend/cuda/device ]; then
  echo "mlxinc missing: copy mlx/backend/cuda/device/ of ml-explore/mlx (tag v0.32.x) to mlxinc/mlx/backend/cuda/device/,"
  echo "e.g. git clone --depth 1 --branch v0.32.4 https://github.com/ml-explore/mlx /tmp/mlx-src &&"
  echo "     mkdir -p mlxinc/mlx/backend/cuda && cp -r /tmp/mlx-src/mlx/backend/cuda/device mlxinc/mlx/backend/cuda/"
fi
