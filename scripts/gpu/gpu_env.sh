# Source this on the GPU machine (no network) to get MLX CUDA from carried wheels:
#   source scripts/gpu/gpu_env.sh DIR...   (folders holding *.whl files and/or cuda.part* pieces)
# mlx-cuda-13's 90 MB wheel travels split (`split -b 46000000`): the pieces are joined in the order
# of their names from every DIR given and from /tmp/parts (where an earlier call on the same warm
# machine left the first piece). Installs once into /tmp/site; sets PYTHONPATH and LD_LIBRARY_PATH
# (the nvidia/*/lib folders of the machine's own Python, which MLX CUDA loads).
if ! [ -f /tmp/site/.ok ]; then
  mkdir -p /tmp/parts
  for d in "$@"; do cp "$d"/cuda.part* /tmp/parts/ 2>/dev/null; done
  wheels=()
  for d in "$@"; do for w in "$d"/*.whl; do [ -e "$w" ] && wheels+=("$w"); done; done
  if ls /tmp/parts/cuda.part* >/dev/null 2>&1; then
    cat $(ls /tmp/parts/cuda.part* | sort) > /tmp/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl
    wheels+=(/tmp/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl)
  fi
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "${wheels[@]}" \
    && touch /tmp/site/.ok
fi
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
LD_LIBRARY_PATH=$(python3 -c "import glob, os, nvidia; print(':'.join(sorted(glob.glob(os.path.join(list(nvidia.__path__)[0], '*', 'lib')))))"):${LD_LIBRARY_PATH:-}
export LD_LIBRARY_PATH
python3 -c "import mlx.core as mx; print('mlx', mx.__version__, mx.default_device(), 'cuda', mx.cuda.is_available())"
