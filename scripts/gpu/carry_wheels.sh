#!/usr/bin/env bash
# What the GPU machine needs beyond its image, as four folders of ~34 MB, one a device call:
#
#   bash scripts/gpu/carry_wheels.sh [DIR]      # default .whl: DIR/c1 .. DIR/c4
#
# mlx-cuda-13's 90 MB wheel in three pieces (scripts/gpu/gpu_env.sh joins them once all are there)
# in the first three, gradio's 31 MB wheel in the fourth, and mlx's own wheel and the rest of the web
# stack (web_wheels.sh) spread over the four by size. A call carries
# the working tree (~23 MB on 2026-12-03) and its folder, 64 MiB in all: ~34 MB a folder leaves
# the tree ~10 MB to grow. Carry them in four calls, each within 30 s of the one before
# (docs/gpu.md, "Running on the GPU machine"). Needs PyPI.
set -euo pipefail
D=${1:-.whl}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_35_x86_64 -d "$tmp/mlx" mlx==0.32.4 mlx-cuda-13==0.32.4
bash "$(dirname "$0")/web_wheels.sh" "$tmp/web" >/dev/null
rm -rf "$D"/c1 "$D"/c2 "$D"/c3 "$D"/c4
mkdir -p "$D"/c1 "$D"/c2 "$D"/c3 "$D"/c4
(cd "$tmp/mlx" && split -n 3 mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl cuda.part)
i=1
for p in "$tmp"/mlx/cuda.part*; do mv "$p" "$D/c$i/"; i=$((i + 1)); done
mv "$tmp"/mlx/mlx-0.32.4-*.whl "$tmp/web/"
# Each wheel, largest first, into the lightest folder.
python3 - "$D" "$tmp/web" <<'PY'
import os, shutil, sys
dest, src = sys.argv[1], sys.argv[2]
folders = [os.path.join(dest, f"c{i}") for i in range(1, 5)]
size = lambda d: sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
for w in sorted(os.listdir(src), key=lambda f: -os.path.getsize(os.path.join(src, f))):
    shutil.move(os.path.join(src, w), min(folders, key=size))
for d in folders:
    print(f"{d}: {len(os.listdir(d))} files, {size(d):,} bytes")
PY
