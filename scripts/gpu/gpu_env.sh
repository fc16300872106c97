# Source this on the GPU machine (no network) to get MLX CUDA and the web stack from carried wheels:
#   source scripts/gpu/gpu_env.sh DIR...   (folders holding *.whl files and/or cuda.part* pieces)
# Calls on one warm machine add up: each copies what its DIRs hold to /tmp/parts and installs
# into /tmp/site every wheel there not installed yet (a marker per wheel in /tmp/site/.installed),
# so the wheels may come over several calls in any order (docs/gpu.md, "Running on the GPU
# machine"). mlx-cuda-13's 90 MB wheel travels split (`split -n 2`); its pieces are joined
# in the order of their names once all are there (the joined file opens as a zip). mlx and
# mlx-cuda-13 share the folder mlx/, which a later install would replace: they go in together.
# Sets PYTHONPATH and LD_LIBRARY_PATH (the nvidia/*/lib folders of the machine's own Python).
mkdir -p /tmp/parts /tmp/site/.installed
for d in "$@"; do cp "$d"/*.whl "$d"/cuda.part* /tmp/parts/ 2>/dev/null; done
# A PTX cache packed on an earlier machine of the same GPU (ptx.tgz of ~/.cache/mtp-chat/ptx):
# MLX then loads the kernels it compiled there instead of compiling them again (~300 s a start).
# The repository keeps one too (scripts/gpu/ptx/, packed from a run's ptx.tgz: a fresh machine's
# warm-up compiled for 339 s without it, 2026-12-03), unpacked once a machine, before any carried one.
# A cache packed on another GPU model of the same compute capability serves this one too (an H200's on
# an H100: both sm90, and NVRTC compiles for the capability, not the model), so each packed folder
# of this machine's capability is merged into this machine's own (session 28's fresh H100 compiled
# for ~300 s beside the H200's cache it could not find).
if ! [ -f ~/.cache/mtp-chat/.ptx-unpacked ]; then
  # the folder name the app will use (kernel_cache.gpu_architecture; loaded by path: mlx is not in yet)
  arch=$(python3 -c "import importlib.util as u; s = u.spec_from_file_location('kc', 'adapters/kernel_cache.py'); m = u.module_from_spec(s); s.loader.exec_module(m); print(m.gpu_architecture() or '')" 2>/dev/null)
  for f in scripts/gpu/ptx/*.tar.xz; do
    [ -f "$f" ] && mkdir -p ~/.cache/mtp-chat && python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$f" ~/.cache/mtp-chat \
      && touch ~/.cache/mtp-chat/.ptx-unpacked && echo "gpu_env: $f unpacked"
  done
  for d in ~/.cache/mtp-chat/ptx/*/*-sm*; do
    [ -n "$arch" ] && [ -d "$d" ] && [ "${d##*/}" != "$arch" ] && [ "${d##*-}" == "${arch##*-}" ] || continue
    mkdir -p "${d%/*}/$arch" && cp -rn "$d"/. "${d%/*}/$arch/" && echo "gpu_env: ${d##*/}'s kernels serve $arch (same capability)"
  done
fi
for d in "$@"; do
  [ -f "$d/ptx.tgz" ] && mkdir -p ~/.cache/mtp-chat && tar xzf "$d/ptx.tgz" -C ~/.cache/mtp-chat \
    && echo "gpu_env: PTX cache unpacked ($(find ~/.cache/mtp-chat/ptx -type f | wc -l) files)"
done
cuda=/tmp/parts/mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl
if ls /tmp/parts/cuda.part* >/dev/null 2>&1 && ! [ -f "/tmp/site/.installed/${cuda##*/}" ]; then
  cat $(ls /tmp/parts/cuda.part* | sort) > "$cuda"
  python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1])" "$cuda" 2>/dev/null || rm -f "$cuda"
fi
pair=$(ls /tmp/parts/mlx-[0-9]*.whl /tmp/parts/mlx_cuda*.whl 2>/dev/null | wc -l)
wheels=()
for w in /tmp/parts/*.whl; do
  [ -f "$w" ] && ! [ -f "/tmp/site/.installed/${w##*/}" ] || continue
  [[ ${w##*/} == mlx-[0-9]* || ${w##*/} == mlx_cuda* ]] && [ "$pair" -lt 2 ] && continue
  wheels+=("$w")
done
if [ ${#wheels[@]} -gt 0 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "${wheels[@]}" \
    && for w in "${wheels[@]}"; do touch "/tmp/site/.installed/${w##*/}"; done
  echo "gpu_env: $(ls /tmp/site/.installed | wc -l) wheels installed in /tmp/site (${#wheels[@]} this call)"
fi
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
LD_LIBRARY_PATH=$(python3 -c "import glob, os, nvidia; print(':'.join(sorted(glob.glob(os.path.join(list(nvidia.__path__)[0], '*', 'lib')))))"):${LD_LIBRARY_PATH:-}
export LD_LIBRARY_PATH
python3 -c "import mlx.core as mx; print('mlx', mx.__version__, mx.default_device(), 'cuda', mx.cuda.is_available())" 2>&1 | tail -n 1
# The engine's settings import pydantic, which the web stack's wheels bring (scripts/gpu/carry_wheels.sh): say so
# before a stage fails at import (2026-12-02: a whole run's stages did).
python3 -c "import pydantic_settings" 2>/dev/null || echo "gpu_env: pydantic-settings missing: carry every .whl/cN (the engine needs it for every stage)"
