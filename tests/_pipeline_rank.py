"""One rank of a pipeline test (tests/test_pipeline.py starts two with MLX_RANK + MLX_HOSTFILE).

    python tests/_pipeline_rank.py JOB.json

JOB: {"model": dir, "load": {load_adapter kwargs}, "prompts": [[ids]], "depths": [...],
"max_tokens": n, "out": file, "sampled_seeds": [...], "prefix_depth": d,
"chi_square": {"prompt", "runs", "top_k"}}. Rank 0 decodes every prompt greedily with AR and with MTP at each
depth through the pipeline, samples at depth 2 with each seed, runs chat turns through the prefix
cache (tests/_prefix_checks: cached == fresh), and writes the tokens to "out"; the other ranks serve
until it stops.
"""
import inspect
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from adapters.pipeline.launch import start  # noqa: E402
from core import Adapter, AutoregressiveDecoder, SamplerConfig, SpeculativeDecoder  # noqa: E402
from tests._prefix_checks import turns_through_the_cache  # noqa: E402


def main() -> int:
    job = json.loads(Path(sys.argv[1]).read_text())
    ad = start(job["model"], log=lambda m: print(m, flush=True), **job.get("load", {}))
    if ad is None:
        return 0
    try:
        mismatched = [name for name, want in vars(Adapter).items() if callable(want) and not name.startswith("_")
                      and list(inspect.signature(getattr(ad, name)).parameters)
                      != [q for q in inspect.signature(want).parameters if q != "self"]]
        assert isinstance(ad, Adapter) and not mismatched, mismatched   # core sees one adapter
        greedy, out = SamplerConfig(temperature=0), {"ar": [], "mtp": {}, "describe": ad.describe(),
                                                      "ranks": ad.ranks(),
                                                      "held": sum(p is not None for p in ad.local.stack.layers)}
        for prompt in job["prompts"]:
            ar, _ = AutoregressiveDecoder(ad, sampler=greedy).generate(prompt, max_tokens=job["max_tokens"])
            out["ar"].append(ar)
            for d in job["depths"]:
                toks, stats = SpeculativeDecoder(ad, sampler=greedy, depth=d).generate(prompt, max_tokens=job["max_tokens"])
                out["mtp"].setdefault(str(d), []).append([toks, stats.accepted, stats.proposed])
        for seed in job.get("sampled_seeds", []):
            toks, _ = SpeculativeDecoder(ad, sampler=SamplerConfig(temperature=1.0), seed=seed, depth=2).generate(
                job["prompts"][0], max_tokens=32)
            out.setdefault("sampled", []).append(toks)
        chi = job.get("chi_square")
        if chi:   # sampled runs for a chi-square against the exact distribution (computed by the test)
            sampler, runs = SamplerConfig(temperature=1.0, top_p=1.0, top_k=chi["top_k"]), []
            for seed in range(chi["runs"]):
                ids, stats = SpeculativeDecoder(ad, sampler=sampler, seed=seed, depth=2).generate(chi["prompt"], max_tokens=4)
                runs.append([ids, stats.accepted, stats.proposed])
            out["chi_square"] = runs
        if job.get("prefix_depth"):
            out["prefix_cached_tokens"] = turns_through_the_cache(ad, job["prefix_depth"]).cached_tokens
        Path(job["out"]).write_text(json.dumps(out))
    finally:
        ad.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
