#!/usr/bin/env python3
"""Build the bundled demo checkpoint (models/demo) from scratch, offline.

Stages (run all, or any subset in order):

    corpus     chat conversations from Debian packages (WordNet, Python docs, fortunes,
               Devil's Dictionary, Jargon File, Jane Austen) -> artifacts/demo/corpus
    tokenizer  byte-level BPE, 8192 tokens, ChatML specials; pre-tokenized stream
               -> artifacts/demo/tokenizer, artifacts/demo/data (train_tokens.npy, eval prompts)
    train      PyTorch trunk + MTP head, joint (scripts/demo_model/train_torch.py); on a GPU
               in minutes, on a CPU in days (same code) -> artifacts/demo/runs/<name>-NN.safetensors
    selfdistill  the head alone, refitted to the trunk on the trunk's own replies to the training
               prompts (scripts/demo_model/self_distill.py gen/train/merge; trunk unchanged)
               -> artifacts/demo/sd/<name>_sd-NN.safetensors
    cotrain    trunk and head fine-tuned together, the head's loss reaching the trunk's own
               distribution and a KL anchor holding the trunk near the self-distilled one: round 1
               on those replies (run "U3"), then the round-1 model answers the training prompts
               itself and round 2 trains on its own replies, anchored harder (run "V2", shipped),
               so that the anchor sees the repetition loops round 1 fell into
               -> artifacts/demo/sd/<name>_co2-NN.safetensors, which export then reads
    export     -> models/demo in the Qwythos layout (8-bit trunk, 8-bit 29-tensor MTP sidecar)
    verify     MLX (mlx_lm.load, adapters.load_adapter, own MLX head) vs PyTorch logits

    python scripts/build_demo_model.py                      # everything (train on whatever device torch finds)
    python scripts/build_demo_model.py --stages corpus tokenizer
    python scripts/build_demo_model.py --stages selfdistill cotrain export verify --run artifacts/demo/carry/M1

Requirements: apt-get install wordnet-base python3.11-doc fortunes fortunes-min dict-devil
dict-jargon r-cran-janeaustenr libopenblas0-pthread; pip install torch transformers tokenizers
rdata mlx-lm.  On a CPU add `--device cpu --micro-batch 4` (the 64 x 512 batch does not fit in
24 GB with the reference Gated-DeltaNet kernels otherwise).  The shipped checkpoint was trained on one H200 (see models/demo/README.md for
the exact run); `--max-steps 1384` reproduces its step count on any device.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HERE = REPO / "scripts" / "demo_model"
sys.path.insert(0, str(HERE))

STAGES = ("corpus", "tokenizer", "train", "selfdistill", "cotrain", "export", "verify")
# The shipped recipe (run "M1"): see models/demo/README.md.
TEXT_CONFIG = HERE / "configs" / "h256_L12_i2.json"
TRAIN_ARGS = ["--depth", "2", "--mtp-w", "1.0", "--depth-w", "0.5", "--distill", "0.5", "--lr", "2e-3",
              "--batch", "64", "--seq", "512", "--variant", "post_norm"]
# The shipped head (run "S5"): KL + total variation at the sampler's temperature, 360 steps.
SELF_DISTILL_ARGS = ["--lr", "1.5e-3", "--max-steps", "360", "--seconds", "1e9"]
# Co-training round 1 (run "U3", sweep 5): 643 steps of 256 replies, trunk lr 2e-4; round 2 (run "V2",
# sweep 6, shipped): 409 steps on round 1's own replies (on one H200 the generation was cut at
# 75 s / 25 s: 52k sampled and 43.5k greedy replies), anchored to the self-distilled trunk.
COTRAIN_ARGS = ["--trunk-lr", "2e-4", "--p-grad", "--w-anchor", "1.0", "--max-steps", "643", "--seconds", "1e9"]
COTRAIN2_ARGS = ["--trunk-lr", "1e-4", "--p-grad", "--w-anchor", "2.0", "--max-steps", "409", "--seconds", "1e9"]
COTRAIN2_GEN_ARGS = ["--gen-batch", "8192", "--gen-seconds", "75", "25"]


def self_distill(steps):
    """Run scripts/demo_model/self_distill.py once per argument list, in order."""
    for step in steps:
        cmd = [sys.executable, str(HERE / "self_distill.py"), *step]
        print(" ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stages", nargs="+", default=list(STAGES), choices=STAGES)
    ap.add_argument("--work", default=str(REPO / "artifacts" / "demo"), help="git-ignored work folder")
    ap.add_argument("--out", default=str(REPO / "models" / "demo"))
    ap.add_argument("--run", default=None, help="prefix of trained shards (default: <work>/runs/demo)")
    ap.add_argument("--seconds", type=float, default=420, help="training wall-clock budget")
    ap.add_argument("--max-steps", type=int, default=None, help="stop after this many steps (1384 = shipped)")
    ap.add_argument("--device", default=None, help="torch device (default: cuda if available)")
    ap.add_argument("--eval-prompts", type=int, default=400, help="acceptance probe size after training")
    ap.add_argument("--micro-batch", type=int, default=0,
                    help="gradient accumulation for small memories (e.g. 4 on a CPU; the update is the same)")
    ap.add_argument("--mtp-bits", type=int, default=8)
    ap.add_argument("--trunk-bits", type=int, default=8, help="0 = float (bf16) trunk")
    a = ap.parse_args(argv)
    work = Path(a.work)
    run = a.run or str(work / "runs" / "demo")

    if "corpus" in a.stages:
        import corpus

        corpus.build(work / "corpus")
    if "tokenizer" in a.stages:
        import tokenizer

        tokenizer.train_tokenizer(work / "corpus", work / "tokenizer")
        tokenizer.encode_corpus(work / "corpus", work / "tokenizer", work / "data")
    if "train" in a.stages:
        cmd = [sys.executable, str(HERE / "train_torch.py"), "--data", str(work / "data"),
               "--out", str(Path(run).parent), "--name", Path(run).name, "--text-config", str(TEXT_CONFIG),
               "--seconds", str(a.seconds), "--eval-prompts", str(a.eval_prompts)] + TRAIN_ARGS
        if a.max_steps:
            cmd += ["--max-steps", str(a.max_steps), "--seconds", "1e9"]
        if a.device:
            cmd += ["--device", a.device]
        if a.micro_batch:
            cmd += ["--micro-batch", str(a.micro_batch)]
        print(" ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
    if "selfdistill" in a.stages:
        sd, name = work / "sd", Path(run).name + "_sd"
        common = ["--run", run, "--text-config", str(TEXT_CONFIG), "--data", str(work / "data")]
        common += ["--device", a.device] if a.device else []
        steps = [
            ["gen", *common, "--out", str(sd)],
            ["train", *common, "--gen", str(sd), "--out", str(sd), "--name", name, *SELF_DISTILL_ARGS],
            ["merge", "--run", run, "--text-config", str(TEXT_CONFIG), "--head", str(sd / f"{name}.head.safetensors"),
             "--out", str(sd / name)],
        ]
        self_distill(steps)
        run = str(sd / name)
    if "cotrain" in a.stages:
        sd, name = work / "sd", Path(run).name.removesuffix("_sd") + "_co"
        cfg = ["--text-config", str(TEXT_CONFIG), "--data", str(work / "data")]
        cfg += ["--device", a.device] if a.device else []
        gen2 = sd / f"{name}_gen"  # round 1's own replies (and its probe-style evaluation replies)
        steps = [
            ["train", "--run", run, *cfg, "--gen", str(sd), "--out", str(sd), "--name", name, *COTRAIN_ARGS],
            ["gen", "--run", str(sd / name), *cfg, "--out", str(gen2), *COTRAIN2_GEN_ARGS],
            ["train", "--run", str(sd / name), *cfg, "--gen", str(gen2), "--out", str(sd), "--name", name + "2",
             "--teacher", run, *COTRAIN2_ARGS],
        ]
        self_distill(steps)
        run = str(sd / (name + "2"))
    if "export" in a.stages:
        import export

        export.export(run, TEXT_CONFIG, work / "tokenizer", a.out, mtp_bits=a.mtp_bits,
                      trunk_bits=a.trunk_bits or None, hidden_variant="post_norm")
    if "verify" in a.stages:
        import verify

        r = verify.main(a.out, run, TEXT_CONFIG)
        if r["problems"]:
            sys.exit(1)


if __name__ == "__main__":
    main()
