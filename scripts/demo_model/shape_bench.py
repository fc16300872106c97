"""Demo v3's shape, by measurement (issue 35): disk size and CPU AR decode speed of candidate shapes.

For each candidate (configs/v3_candidates.json: hidden, layers, MLP width; Gated-DeltaNet and
attention alternating as v2's `full_attention_interval` 2, heads of 64), a random-weight
checkpoint in the demo's exact layout (scripts/checkpoints/make_tiny_checkpoint.py: mlx-lm trunk, 29-tensor
`optiq/mtp.safetensors` sidecar, post-norm hidden, tied embedding, vocab 8192) at the bits v3
would ship, with models/demo's own tokenizer files (what ships: its size counts), then

  disk    every file of the folder (trunk, sidecar, tokenizer, configs), MiB
  speed   the engine's AR lane (core.AutoregressiveDecoder, T=0.6 / top_p 0.95 / top_k 20, as
          scripts/bench/bench.py's AR lane) on the 8 race prompts, 128 tokens, decode tok/s;
          rounds interleave every candidate with models/demo (v2, the paired reference), so that
          the other sessions' load on the 2 shared cores hits all alike; per candidate the median
          of its tok/s and of its per-round ratio to v2, and v2's own median

Random weights decode as fast as trained ones (the same operations), but may stop early at an
end token: runs that end before MIN_TOKENS are repeated with the next seed, and every run's token
count is recorded. A decode step's cost does not depend on which token is drawn.

    python scripts/demo_model/shape_bench.py --rounds 5 --json docs/bench/2026-12-02/demo-v3-shapes.json
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))
from adapters.runtime import preload_blas  # noqa: E402

preload_blas()
from shapes import n_params, text_config  # noqa: E402

DEMO = REPO / "models" / "demo"
CANDIDATES = HERE / "configs" / "v3_candidates.json"
MIN_TOKENS = 64
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def make(out: Path, shape: dict, bits: int, mtp_bits: int, embed_bits=None, seed=0) -> Path:
    """A random-weight checkpoint of `shape` in the demo's layout, with the demo's tokenizer."""
    from scripts.checkpoints.make_tiny_checkpoint import make_tiny_checkpoint

    h, layers = shape["hidden"], shape["layers"]
    tc = text_config(h, layers, shape["inter"], interval=shape.get("interval", 2))
    make_tiny_checkpoint(
        out, hidden_size=h, num_layers=layers, full_attention_interval=tc["full_attention_interval"],
        vocab_size=tc["vocab_size"], num_heads=tc["num_attention_heads"], num_kv_heads=tc["num_key_value_heads"],
        head_dim=64, intermediate_size=tc["intermediate_size"], linear_num_value_heads=tc["linear_num_value_heads"],
        linear_num_key_heads=tc["linear_num_key_heads"], linear_key_head_dim=64, linear_value_head_dim=64,
        bits=bits, group_size=64, mtp_bits=mtp_bits, mtp_group_size=64, hidden_variant="post_norm",
        tie_word_embeddings=True, template="qwen3_5", seed=seed, rope_theta=10000.0,
        quant_overrides={"embed_tokens": embed_bits} if embed_bits else None)
    # the demo's tokenizer (and its chat template, its ids: eos 2) instead of the tiny one
    for fn in TOKENIZER_FILES:
        shutil.copy(DEMO / fn, out / fn)
    cfg = json.loads((out / "config.json").read_text())
    demo_cfg = json.loads((DEMO / "config.json").read_text())
    cfg["eos_token_id"] = demo_cfg["eos_token_id"]
    cfg["text_config"]["eos_token_id"] = demo_cfg["eos_token_id"]
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    shutil.copy(DEMO / "generation_config.json", out / "generation_config.json")
    return out


def disk_mib(folder: Path) -> float:
    return round(sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file() and p.name != "README.md")
                 / 2**20, 2)


def decode_tps(adapter, lane, prompt_ids, seed, max_tokens=128):
    for s in range(seed, seed + 8):
        lane.seed = s
        ids, st = lane.generate(prompt_ids, max_tokens=max_tokens)
        if st.generated_tokens >= MIN_TOKENS:
            return st.tokens_per_second, st.generated_tokens
    return st.tokens_per_second, st.generated_tokens


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--candidates", default=str(CANDIDATES))
    ap.add_argument("--only", nargs="*", default=None, help="names of candidates to measure")
    ap.add_argument("--work", default=str(REPO / "artifacts" / "demo" / "v3_shapes"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    from adapters import load_adapter
    from core import AutoregressiveDecoder, SamplerConfig, chat_prompt_ids

    spec = json.loads(Path(a.candidates).read_text())
    cands = [c for c in spec["candidates"] if not a.only or c["name"] in a.only]
    work = Path(a.work)
    rows = {}
    models = {"v2": load_adapter(str(DEMO))}
    for c in cands:
        out = make(work / c["name"], c, c.get("bits", spec["bits"]), c.get("mtp_bits", spec["mtp_bits"]),
                   c.get("embed_bits"))
        tc = text_config(c["hidden"], c["layers"], c["inter"], interval=c.get("interval", 2))
        rows[c["name"]] = {**c, "params_M": round(n_params(tc) / 1e6, 2),
                           "trunk_params_M": round(n_params(tc, False) / 1e6, 2),
                           "disk_MiB": disk_mib(out), "runs": []}
        models[c["name"]] = load_adapter(str(out))
        print(c["name"], rows[c["name"]]["params_M"], "M params,", rows[c["name"]]["disk_MiB"], "MiB", flush=True)
    rows["v2"] = {"name": "v2", "disk_MiB": disk_mib(DEMO), "params_M": 13.34, "runs": []}
    prompts = [l.strip() for l in (HERE / "race_prompts.txt").read_text().splitlines() if l.strip()]
    sampler = SamplerConfig(temperature=0.6, top_p=0.95, top_k=20)
    lanes = {k: AutoregressiveDecoder(ad, sampler=sampler) for k, ad in models.items()}
    ids = {k: [chat_prompt_ids(ad, [{"role": "user", "content": p}]) for p in prompts] for k, ad in models.items()}
    for k in models:  # warm: the first decode compiles and allocates
        decode_tps(models[k], lanes[k], ids[k][0], 0, 16)
    t0 = time.time()
    names = list(models)
    for r in range(a.rounds):
        order = names[r % len(names):] + names[: r % len(names)]  # rotate who goes first
        for i, p in enumerate(prompts):
            tps = {}
            for k in order:
                tps[k], n = decode_tps(models[k], lanes[k], ids[k][i], 1000 * r + i, a.max_tokens)
                rows[k]["runs"].append({"round": r, "prompt": i, "tok_s": round(tps[k], 2), "tokens": n})
            for k in names:
                if k != "v2":
                    rows[k]["runs"][-1]["ratio_to_v2"] = round(tps[k] / tps["v2"], 4)
        print(f"round {r}: " + ", ".join(f"{k} {statistics.median(x['tok_s'] for x in rows[k]['runs']):.1f}"
                                          for k in names), flush=True)
    for k, row in rows.items():
        row["median_tok_s"] = round(statistics.median(x["tok_s"] for x in row["runs"]), 2)
        tps = sorted(x["tok_s"] for x in row["runs"])
        row["iqr_tok_s"] = [round(tps[len(tps) // 4], 2), round(tps[(3 * len(tps)) // 4], 2)]
        if k != "v2":
            row["median_ratio_to_v2"] = round(statistics.median(x["ratio_to_v2"] for x in row["runs"]), 4)
            # what it would do on a quiet machine: v2's recorded AR speed on this CPU (model card,
            # 80-101 tok/s at 128 tokens, race prompts) times the paired ratio (80: the lowest of the
            # card's paired runs, so the estimate errs low)
            row["tok_s_at_v2_80"] = round(80 * row["median_ratio_to_v2"], 1)
    res = {"what": "CPU AR decode tok/s of random-weight v3 candidate shapes, paired with models/demo (v2)",
           "machine": "2 shared x86-64 cores (other sessions running), MLX CPU + OpenBLAS",
           "bits": spec["bits"], "mtp_bits": spec["mtp_bits"], "group_size": 64, "rounds": a.rounds,
           "prompts": "scripts/demo_model/race_prompts.txt", "max_tokens": a.max_tokens,
           "sampler": sampler.__dict__, "seconds": round(time.time() - t0),
           "summary": {k: {x: v[x] for x in ("params_M", "disk_MiB", "median_tok_s", "iqr_tok_s",
                                              "median_ratio_to_v2", "tok_s_at_v2_80") if x in v}
                       for k, v in rows.items()},
           "rows": rows}
    print(json.dumps(res["summary"], indent=1))
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
