#!/usr/bin/env python3
"""Build the bundled demo checkpoint (models/demo) from scratch, offline.

Stages (run all, or any subset in order):

    corpus     conversations from Debian packages (WordNet, Python docs, fortunes, Devil's
               Dictionary, Jargon File, Jane Austen) and generated everyday questions, notes, drills,
               JSON answers, tool calls and thinking, rendered with the demo's Qwen3.5 chat template.
               v3: prepare_v3.py --variant v3m and v3n (conversations_v3.py) -> artifacts/demo/v3{m,n}/corpus;
               v2: conversations.py -> artifacts/demo/corpus
    tokenizer  v3: the bundled tokenizer as the app tokenizes, the corpus encoded and checked
               (prepare_v3.py's data step) -> artifacts/demo/v3m/{tokenizer,data}; v2: byte-level
               BPE, 8192 tokens, ChatML specials and the Qwen3.5 tags -> artifacts/demo/{tokenizer,data}
    train      PyTorch trunk + MTP head, joint, whole conversations packed into 4,096-token windows,
               the acceptance term reaching the trunk (scripts/demo_model/train_torch.py), in the
               phases as shipped (V3_BUILDS, TRAIN_PHASES); on a GPU in minutes, on a CPU in days
               (same code) -> <work>/runs/<phase>-NN.safetensors
    export     -> models/demo in the Qwythos layout (8-bit trunk, 8-bit 29-tensor MTP sidecar)
    verify     MLX (mlx_lm.load, adapters.load_adapter, own MLX head) vs PyTorch logits

    python scripts/demo_model/build.py                      # v3, everything (train on whatever device torch finds)
    python scripts/demo_model/build.py --stages corpus tokenizer
    python scripts/demo_model/build.py --variant v2 --stages export verify --run artifacts/demo/runs/F1
    python scripts/demo_model/build.py --variant large --stages train export   # ~300M, for GPU measurements

--variant v3 (the default) is the demo shipped since 2026-12-06: shape configs/v3.json (28.4M
parameters), six phases that are the H100 calls that made it, by the steps they took: v3m's four on
the v3m corpus (--variant v3m, shipped 2026-12-05 until 2026-12-06), then a lean of the whole model on
a 4.2M-token tool-leaning draw of the v3n corpus and its head alone on the whole v3n corpus (V3_PLAN
section 35); it prepares the v3n corpus beside v3m's. --variant v3l is v3's first build (the v3l
corpus, shipped on 2026-12-05); --variant v2 is the demo shipped before (configs/h256_L12_i2.json,
13.3M). --variant v3n-ft is v3m leaned on a 2-core CPU instead (V3_PLAN section 32: a candidate
measured, not shipped).

The larger variant (--variant large: hidden 1024, 20 layers, 15 Gated-DeltaNet + 5 attention as
Qwythos' 3:1, 294M parameters with its MTP layer) trains on the same data at 4,096-token windows
and is exported 4-bit (as Qwythos) to artifacts/demo/large, not to models/demo: it is for measuring
MTP on trained weights on a GPU (scripts/demo_model/gpu_calls.sh large_eval), not shipped.

Requirements: apt-get install wordnet-base python3.11-doc fortunes fortunes-min dict-devil
dict-jargon r-cran-janeaustenr libopenblas0-pthread; pip install torch transformers tokenizers
rdata mlx-lm (and this project, for the app's own prompt rendering and the verify stage).
Everything is seeded (corpus, tokenizer, data order, initialisation); the shipped runs' schedules
are reproduced by steps (V3_BUILDS, TRAIN_PHASES), on a GPU up to its nondeterministic kernels.
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
# The shipped v3 (models/demo/README.md, "How it was trained"): three calls on one warm H100 whose
# schedules ran by seconds and were each trained to their end, reproduced here by the steps they
# took, on the v3m corpus. V3A from scratch; V3B from V3A (the acceptance term on throughout); V3C
# the head alone (trunk and tied embedding frozen); V3D the head alone again, from V3C, the
# acceptance term at 1.0.
V3_CONFIG = HERE / "configs" / "v3.json"
V3_COMMON = ["--batch", "16", "--micro-batch", "16", "--gdn-chunk", "256"]
V3_RESUMED = V3_COMMON + ["--warmup", "20", "--accept-start", "0", "--accept-ramp", "0"]   # the term on at once


def v3_phases(steps):
    """The four v3 phases (V3A-V3D) by the steps each call's phase took."""
    a, b, c, d = (str(n) for n in steps)
    return [
        ("V3A", V3_COMMON + ["--lr", "2e-3", "--warmup", "60", "--accept-start", "0.4", "--accept-ramp", "0.3",
                             "--seed", "35", "--max-steps", a]),
        ("V3B", V3_RESUMED + ["--lr", "1e-3", "--seed", "36", "--max-steps", b]),
        ("V3C", V3_RESUMED + ["--head-only", "--lr", "1e-4", "--seed", "36", "--max-steps", c]),
        ("V3D", V3_RESUMED + ["--head-only", "--accept-w", "1.0", "--lr", "3e-4", "--seed", "35", "--max-steps", d]),
    ]


# Phases that read another prepared corpus than their build's: (prepare_v3.py's variant, folder,
# finetune_mix.py's arguments when the folder is its draw from that variant's data/, else None).
V3N_TOOLS_MIX = ["--shares", "tools=0.6,drill=0.1,rest=0.3", "--seed", "41"]   # + --tokens: the draw's size
PHASE_DATA = {"V3E": ("v3n", "ft_data", V3N_TOOLS_MIX + ["--tokens", "1300000"]),
              "V3F": ("v3n", "data", None),
              "V3G": ("v3n", "ft_data4", V3N_TOOLS_MIX + ["--tokens", "4200000"]),
              "V3H": ("v3n", "data", None)}
CPU_SHAPE = ["--batch", "4", "--micro-batch", "2", "--seq", "2048", "--gdn-chunk", "256"]


def lean_phases(lean_steps, head_steps):
    """v3m leaned on v3n's tool conversations on a 2-core CPU (V3_PLAN section 32): V3E the whole
    model on finetune_mix.py's draw, resumed from V3D packed int8 per row (as bundled); V3F the head
    alone on the whole v3n corpus, the acceptance term at 1.0."""
    resumed = CPU_SHAPE + ["--warmup", "10", "--accept-start", "0", "--accept-ramp", "0"]
    return [
        ("V3E", resumed + ["--lr", "1e-4", "--seed", "43", "--max-steps", str(lean_steps)]),
        ("V3F", resumed + ["--head-only", "--accept-w", "1.0", "--lr", "2e-4", "--seed", "44",
                           "--max-steps", str(head_steps)]),
    ]


def gpu_lean_phases(lean_steps, head_steps):
    """v3m leaned on v3n's tool conversations on one H100 (V3_PLAN section 35; gpu_v3.sh's leans
    stage): V3G the whole model on finetune_mix.py's 4.2M-token draw, resumed from V3D packed int8
    per row (the call's init.q8), the acceptance term on the trunk at 1.5 (0.4 lost the drafts:
    section 34); V3H the head alone on the whole v3n corpus, the term at 1.0."""
    return [
        ("V3G", V3_RESUMED + ["--warmup", "10", "--lr", "2e-4", "--accept-w", "1.5", "--seed", "38",
                           "--max-steps", str(lean_steps)]),
        ("V3H", V3_RESUMED + ["--head-only", "--accept-w", "1.0", "--lr", "3e-4", "--seed", "36",
                           "--max-steps", str(head_steps)]),
    ]


# variant: (prepare_v3.py's corpus, phases, phases resumed from the previous one packed int8 per row,
# as a call on a fresh machine resumed it). v3l is v3's first build, shipped on 2026-12-05 until v3m
# replaced it the same day: the same recipe on the v3l corpus, V3D on a fresh machine.
V3M = v3_phases((667, 499, 308, 1462))
V3_BUILDS = {"v3": ("v3m", V3M + gpu_lean_phases(91, 500), {"V3G"}),
             "v3m": ("v3m", V3M, set()),
             "v3l": ("v3l", v3_phases((658, 492, 296, 1426)), {"V3D"}),
             "v3n-ft": ("v3m", V3M + lean_phases(127, 57), {"V3E"})}
TRAIN_PHASES = [
    ("E1", ["--batch", "8", "--micro-batch", "8", "--lr", "2e-3", "--warmup", "100", "--accept-start", "0.5",
            "--accept-ramp", "0.3", "--max-steps", "392", "--schedule-steps", "452"]),
    ("F1", ["--batch", "16", "--micro-batch", "16", "--lr", "1e-3", "--warmup", "20", "--accept-start", "0",
            "--accept-ramp", "0.01", "--max-steps", "165", "--schedule-steps", "250"]),
]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stages", nargs="+", default=list(STAGES), choices=STAGES)
    ap.add_argument("--variant", default="v3", choices=["v3", "v3m", "v3l", "v3n-ft", "v2", "large"],
                    help="v3: the shipped demo (v3m leaned on v3n's tool conversations); v3m: the v3 shipped "
                         "until 2026-12-06; v3l: its first build (the v3l corpus); v3n-ft: v3m leaned on the CPU "
                         "(a candidate); v2: the demo shipped until 2026-12-05 (its corpus and "
                         "phases); large: the ~300M variant")
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
    large, v3 = a.variant == "large", a.variant in V3_BUILDS
    corpus_v3, phases, via_int8 = V3_BUILDS.get(a.variant, (None, TRAIN_PHASES, set()))
    phases, text_config = (LARGE_PHASES, LARGE_CONFIG) if large else (phases, V3_CONFIG if v3 else TEXT_CONFIG)
    beside = {"large": work / "large", "v3n-ft": work / "v3n-ft" / "model"}   # not shipped: not into models/demo
    out = beside.get(a.variant, Path(a.out)) if a.out == ap.get_default("out") else Path(a.out)
    bits = 4 if large else None
    if v3:   # prepare_v3.py's folders: corpus/, tokenizer/ (the app's ids), data/
        work = work / corpus_v3 if a.work == ap.get_default("work") else work
        runs = work / "runs"
    run = a.run or str(runs / phases[-1][0])

    if v3 and {"corpus", "tokenizer"} & set(a.stages):
        steps = [s for s, stage in (("corpus", "corpus"), ("data", "tokenizer")) if stage in a.stages]
        subprocess.run([sys.executable, str(HERE / "prepare_v3.py"), "--variant", corpus_v3, "--work", str(work),
                        "--steps", *steps], check=True)
    if "corpus" in a.stages and not v3:
        import conversations

        conversations.build(work / "corpus")
    if "tokenizer" in a.stages and not v3:
        import tokenizer

        tokenizer.train_tokenizer(work / "corpus", work / "tokenizer")
        tokenizer.encode_corpus(work / "corpus", work / "tokenizer", work / "data")
    if v3 and {"corpus", "tokenizer"} & set(a.stages):   # the other corpora some phases read
        reads = [PHASE_DATA[n] for n, _ in phases if n in PHASE_DATA]
        for variant in sorted({v for v, _, _ in reads}):
            steps = [s for s, stage in (("corpus", "corpus"), ("data", "tokenizer")) if stage in a.stages]
            subprocess.run([sys.executable, str(HERE / "prepare_v3.py"), "--variant", variant, "--work",
                            str(Path(a.work) / variant), "--steps", *steps], check=True)
        for variant, folder, mix in reads:
            other = Path(a.work) / variant   # artifacts/demo/<variant>, beside the build's own corpus
            if mix and "tokenizer" in a.stages:
                subprocess.run([sys.executable, str(HERE / "finetune_mix.py"), "--data", str(other / "data"), "--corpus",
                                str(other / "corpus" / "docs.jsonl"), *mix, "--out", str(other / folder)], check=True)
    if "train" in a.stages:
        prev = None
        for name, args in phases:
            variant, folder, _ = PHASE_DATA.get(name, (None, "data", None))
            data = Path(a.work) / variant / folder if variant else work / "data"
            cmd = [sys.executable, str(HERE / "train_torch.py"), "--data", str(data), "--out", str(runs),
                   "--name", name, "--text-config", str(text_config), "--seconds", "1e9", *COMMON, *args]
            if prev and name in via_int8:
                packed = runs / f"{prev}.q8.safetensors"
                subprocess.run([sys.executable, str(HERE / "shards_q8.py"), "pack", str(runs / prev), str(packed)], check=True)
                subprocess.run([sys.executable, str(HERE / "shards_q8.py"), "unpack", str(packed), str(runs / f"{prev}q8")],
                               check=True)
                prev = f"{prev}q8"
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
