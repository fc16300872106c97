#!/usr/bin/env bash
# The wheels the GPU machine needs, beyond its image and MLX's own two, to serve the app
# (`python -m webapp`, driven by the anthropic client in the `agent` stage of gpu_bench.sh):
#
#   bash scripts/gpu/web_wheels.sh DEST        # 31 wheels, 43.8 MB (carry_wheels.sh spreads them over four calls)
#
# CPython 3.12, manylinux x86_64, at the versions of the project's venv. Left out because the
# image has them (docs/gpu.md, "Running on the GPU machine"): httpx, httpcore, h11, anyio, idna,
# typing-extensions, jinja2, markupsafe, numpy, pillow, pandas, huggingface-hub, typer, click,
# pyyaml, transformers, tokenizers, prometheus-client, uvloop, ... The set is closed: every
# Requires-Dist of these wheels (Python 3.12, Linux) is in it or in the image.
set -euo pipefail
DEST=${1:?usage: bash scripts/gpu/web_wheels.sh DEST}
mkdir -p "$DEST"
plat=()
for t in manylinux_2_31 manylinux_2_28 manylinux_2_17 manylinux2014; do plat+=(--platform "${t}_x86_64"); done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" -d "$DEST" \
  gradio==6.31.0 gradio-client==2.7.2 hf-gradio==0.4.1 groovy==0.1.2 brotli==1.2.1 orjson==3.13.0 pydub==0.25.1 \
  python-multipart==0.0.34 pytz==2026.6 safehttpx==0.1.7 semantic-version==2.10.0 tomlkit==0.14.0 \
  fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 opentelemetry-api==1.45.2 \
  anthropic==2.15.0 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 jiter==0.19.0 docstring-parser==0.18.0 \
  sniffio==1.3.1 llguidance==1.9.1 \
  pydantic==2.14.4 pydantic-core==2.50.5 pydantic-settings==2.16.3 python-dotenv==1.2.4 annotated-types==0.8.0 \
  typing-inspection==0.4.5 mlx-lm==0.32.2
size=$(cat "$DEST"/*.whl | wc -c)
echo "$DEST: $(ls "$DEST"/*.whl | wc -l) wheels, $size bytes"
[ "$size" -le 44000000 ] || echo "$DEST is over 44 MB: more than one call can carry beside the repository" >&2
