#!/usr/bin/env python3
"""Build the bundled demo checkpoint (models/demo) from scratch, offline.

Stages (run all, or any subset in order):

    corpus     conversations from Debian packages (WordNet, Python docs, fortunes, Devil's
               Dictionary, Jargon File, Jane Austen) and generated everyday questions, tool calls
               and thinking, rendered with the demo's Qwen3.5 chat template
               (scripts/demo_model/conversations.py) -> artifacts/demo/corpus
    tokenizer  byte-level BPE, 8192 tokens, ChatML specials and the Qwen3.5 tags; tokens, a mask of
               what the model writes, evaluation prompts -> artifacts/demo/tokenizer, artifacts/demo/data
    train      PyTorch trunk + MTP head, joint, whole conversations packed into 4,096-token windows,
               the acceptance term reaching the trunk in the second part of training
               (scripts/demo_model/train_torch.py), in two phases as shipped; on a GPU in minutes,
               on a CPU in days (same code) -> artifacts/demo/runs/<name>-NN.safetensors
    export     -> models/demo in the Qwythos layout (8-bit trunk, 8-bit 29-tensor MTP sidecar)
    verify     MLX (mlx_lm.load, adapters.load_adapter, own MLX head) vs PyTorch logits

    python scripts/demo_model/build.py                      # everything (train on whatever device torch finds)
    python scripts/demo_model/build.py --stages corpus tokenizer
    python scripts/demo_model/build.py --stages export verify --run artifacts/demo/runs/F1
    python scripts/demo_model/build.py --variant large --stages train export   # ~300M, for GPU measurements

The larger variant (--variant large: hidden 1024, 20 layers, 15 Gated-DeltaNet + 5 attention as
Qwythos' 3:1, 294M parameters with its MTP layer) trains on the same data at 4,096-token windows
and is exported 4-bit (as Qwythos) to artifacts/demo/large, not to models/demo: it is for measuring
MTP on trained weights on a GPU (scripts/demo_model/gpu_calls.sh large_eval), not shipped.

Requirements: apt-get install wordnet-base python3.11-doc fortunes fortunes-min dict-devil
dict-jargon r-cran-janeaustenr libopenblas0-pthread; pip install torch transformers tokenizers
rdata mlx-lm (and this project, for the app's own prompt rendering and the verify stage).
Everything is seeded (corpus, tokenizer, data order, initialisation); the shipped run's schedule
is reproduced by steps (see TRAIN_PHASES), on a GPU up to its nondeterministic kernels.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HERE = REPO / "scripts" / "demo_model"
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

STAGES = ("corpus", "tokenizer", "train", "export", "verify")
TEXT_CONFIG = HERE / "configs" / "h256_L12_i2.json"
# The shipped run (models/demo/README.md, "How it was trained"), on one H200 with the reference
# Gated-DeltaNet kernels. Phase 1 ("E1"): 392 steps of 8 x 4,096 tokens, the acceptance term from
# half-way (ramped over 30 % to 0.4); its wall-clock schedule was 420 s long and the call stopped
# it at 364 s, so the schedule here is 452 steps long and stops at 392. Phase 2 ("F1"): from E1,
# 165 steps of 16 x 4,096 tokens, lr 1e-3, the acceptance term on throughout; its 200 s schedule
# was stopped at 132 s (250 steps, stopped at 165).
COMMON = ["--depth", "2", "--mtp-w", "1.0", "--depth-w", "0.5", "--distill", "0.5", "--seq", "4096",
          "--variant", "post_norm", "--other-w", "0.3", "--accept-w", "0.4"]
LARGE_CONFIG = HERE / "configs" / "h1024_L20_i4.json"
# ~15 minutes of one H200 with flash-linear-attention's kernels; with transformers' reference
# kernels (fla refuses Hopper with Triton < 3.7.1) it ran ~4k tokens/s next to two demo runs.
LARGE_PHASES = [("L1", ["--batch", "8", "--micro-batch", "4", "--lr", "1e-3", "--warmup", "100", "--accept-start", "0.5",
                        "--accept-ramp", "0.3", "--accept-w", "0.3", "--max-steps", "1500"])]
TRAIN_PHASES = [
    ("E1", ["--batch", "8", "--micro-batch", "8", "--lr", "2e-3", "--warmup", "100", "--accept-start", "0.5",
            "--accept-ramp", "0.3", "--max-steps", "392", "--schedule-steps", "452"]),
    ("F1", ["--batch", "16", "--micro-batch", "16", "--lr", "1e-3", "--warmup", "20", "--accept-start", "0",
            "--accept-ramp", "0.01", "--max-steps", "165", "--schedule-steps", "250"]),
]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stages", nargs="+", default=list(STAGES), choices=STAGES)
    ap.add_argument("--variant", default="demo", choices=["demo", "large"])
    ap.add_argument("--work", default=str(REPO / "artifacts" / "demo"), help="git-ignored work folder")
    ap.add_argument("--out", default=str(REPO / "models" / "demo"))
    ap.add_argument("--run", default=None, help="prefix of the trained shards to export (default: the last phase)")
    ap.add_argument("--device", default=None, help="torch device (default: cuda if available)")
    ap.add_argument("--micro-batch", type=int, default=0,
                    help="gradient accumulation for small memories (e.g. 1 on a CPU; the update is the same)")
    ap.add_argument("--mtp-bits", type=int, default=8)
    ap.add_argument("--trunk-bits", type=int, default=8, help="0 = float (bf16) trunk")
    a = ap.parse_args(argv)
    work = Path(a.work)
    runs = work / "runs"
    large = a.variant == "large"
    phases, text_config = (LARGE_PHASES, LARGE_CONFIG) if large else (TRAIN_PHASES, TEXT_CONFIG)
    out = work / "large" if large and a.out == ap.get_default("out") else Path(a.out)
    bits = 4 if large else None
    run = a.run or str(runs / phases[-1][0])

    if "corpus" in a.stages:
        import conversations

        conversations.build(work / "corpus")
    if "tokenizer" in a.stages:
        import tokenizer

        tokenizer.train_tokenizer(work / "corpus", work / "tokenizer")
        tokenizer.encode_corpus(work / "corpus", work / "tokenizer", work / "data")
    if "train" in a.stages:
        prev = None
        for name, args in phases:
            cmd = [sys.executable, str(HERE / "train_torch.py"), "--data", str(work / "data"), "--out", str(runs),
                   "--name", name, "--text-config", str(text_config), "--seconds", "1e9", *COMMON, *args]
            cmd += ["--resume", str(runs / prev)] if prev else []
            cmd += ["--device", a.device] if a.device else []
            if a.micro_batch:
                cmd += ["--micro-batch", str(a.micro_batch)]
            print(" ".join(cmd), flush=True)
            subprocess.run(cmd, check=True)
            prev = name
    if "export" in a.stages:
        import export

        export.export(run, text_config, work / "tokenizer", out, mtp_bits=bits or a.mtp_bits,
                      trunk_bits=bits or a.trunk_bits or None, hidden_variant="post_norm")
    if "verify" in a.stages:
        import verify

        r = verify.main(out, run, text_config)
        if r["problems"]:
            sys.exit(1)


if __name__ == "__main__":
    main()
