#!/usr/bin/env python3
"""Our Gemma 4 drafter step against mlx-vlm's (`Gemma4AssistantDraftModel`) on the same inputs.

    pip install mlx-vlm==0.7.10      # not a dependency of this project: an oracle, run by hand
    .venv/bin/python scripts/checkpoints/check_gemma4_drafter.py                       # the tiny pairs
    .venv/bin/python scripts/checkpoints/check_gemma4_drafter.py --model B [--drafter A]

Both get the backbone's K/V as our adapter slices them from its cache, the same embedding and
h_prev, the query at the bonus token's position; three recursive steps. Compared: the next
h_prev, and the logits of the tokens our head scores (mlx-vlm fills the others with
min(selected) - 1, we with -1e9). Measured on the tiny pairs (small: centroid head, large: full
head): both differences 0.0, the same argmax at every step.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import adapters  # noqa: E402  (first: the BLAS preload)


def compare(backbone: Path, drafter=None, out=print) -> float:
    import mlx.core as mx
    from mlx_vlm.speculative.drafters.gemma4_assistant import Gemma4AssistantDraftModel, ModelConfig

    ad = adapters.load_adapter(backbone, drafter=drafter, compute_dtype="float32")
    dcfg = json.loads((ad.drafter_path / "config.json").read_text())
    ref = Gemma4AssistantDraftModel(ModelConfig.from_dict(dcfg))
    weights = {}
    for f in sorted(ad.drafter_path.glob("model*.safetensors")):
        weights.update(mx.load(str(f)))
    ref.load_weights(list(ref.sanitize(weights).items()))
    ref.set_dtype(mx.float32)
    ref.bind(ad.model)
    x = mx.array([list(range(5, 45))])
    cache = ad.make_cache()
    _, h, _ = ad.forward(x, cache)
    L, kv = cache[0].offset, ad.shared_kv(cache)
    ref.set_shared_kv(kv, L, position=L, kv_valid_len=L)
    tok, hp, worst = mx.array([[77]]), h[:, -1:], 0.0
    for step in range(3):
        emb = ad.inner.embed_tokens(tok) * ad.inner.embed_scale
        ours_h, ours = ad.draft_step({}, cache, hp, tok)
        ref_h, theirs = ref(mx.concatenate([emb, hp], -1), kv, mx.array([[L]]))
        theirs = theirs[:, -1]
        scored = ours > -1e8
        dh = mx.abs(ours_h - ref_h).max().item()
        dl = mx.abs(mx.where(scored, ours - theirs, 0)).max().item()
        same = mx.argmax(ours).item() == mx.argmax(theirs).item()
        out(f"step {step}: h_prev diff {dh:.3g}, logit diff on the {scored.sum().item()} scored tokens {dl:.3g}, "
            f"same argmax: {same}")
        worst = max(worst, dh, dl, 0.0 if same else float("inf"))
        tok, hp = mx.argmax(ours, axis=-1)[None], ours_h
    return worst


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a Gemma 4 backbone (default: the tiny pairs)")
    ap.add_argument("--drafter", help="its assistant drafter (default: MODEL/assistant/)")
    ap.add_argument("--tolerance", type=float, default=1e-4)
    a = ap.parse_args(argv)
    if a.model:
        worst = compare(Path(a.model), a.drafter)
    else:
        from scripts.checkpoints.tiny_gemma4 import make_tiny_gemma4

        worst = 0.0
        with tempfile.TemporaryDirectory() as tmp:
            for size in ("small", "large"):
                print(f"tiny {size} pair:")
                worst = max(worst, compare(make_tiny_gemma4(Path(tmp) / size, size=size)))
    print("OK" if worst <= a.tolerance else f"DIFFERENT: {worst:.3g} > {a.tolerance}")
    return 0 if worst <= a.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
