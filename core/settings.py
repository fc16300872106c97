"""The single source of defaults for the CLI, the engine and the web app.

Every value can be set from the environment (prefix ``MTP_CHAT_``) or a ``.env`` file.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional, Union

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from .limits import IMAGE_MAX_BYTES, IMAGE_MAX_COUNT, MAX_DEPTH, MAX_TEMPERATURE, MAX_TOKENS

REPO_ROOT = Path(__file__).resolve().parent.parent
DEMO_MODEL_DIR = REPO_ROOT / "models" / "demo"


# What gpu_trials may name (adapters/qwen3_5/backends.py reads them).
GPU_TRIALS = ("submit", "swiglu", "verify-submit", "batch-verify-wait", "batch-submit", "topk-mlx", "topk-support")
# Trials that became the default once measured to pay: still accepted, they change nothing.
GPU_TRIALS_ADOPTED = ("two-tiles", "topk-kernel", "topk-draw")

class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MTP_CHAT_", env_file=".env", extra="ignore")

    model: Path = Field(DEMO_MODEL_DIR, description="checkpoint directory (Qwythos layout)")
    # A drafter kept as its own checkpoint (Gemma 4's '-assistant'); None: the family's default place.
    drafter: Optional[Path] = None
    # Sampler defaults: the Qwythos published setting.
    temperature: float = Field(0.6, ge=0.0, le=MAX_TEMPERATURE)
    top_p: float = Field(0.95, gt=0.0, le=1.0)
    top_k: int = Field(20, ge=0)
    min_p: float = Field(0.0, ge=0.0, lt=1.0)
    max_tokens: int = Field(256, ge=1, le=MAX_TOKENS)
    seed: int = 0
    depth: Union[int, Literal["auto"]] = 2  # measured best on the demo model at T=0.6 and T=0 (docs/benchmarks.md, "Measured numbers")
    max_depth: int = Field(4, ge=1, le=MAX_DEPTH)
    # Overrides the checkpoint's MTP hidden-state variant (None: from config / family default).
    hidden_variant: Optional[Literal["pre_norm", "post_norm"]] = None
    host: str = "127.0.0.1"
    port: int = Field(7860, ge=0, le=65535)
    lan: bool = False
    auth: Optional[str] = Field(None, description="USER:PASS required to open the app")
    api_key: Optional[str] = Field(None, description="bearer key required on the OpenAI-compatible API (/v1)")
    # Web origins (comma-separated, e.g. "http://localhost:3000") whose pages may call /v1 (CORS); none by default.
    cors_origins: str = ""
    # /v1/responses replies kept in memory for previous_response_id (least recently used go first); 0 = none.
    response_store: int = Field(256, ge=0)
    # Prefix cache: snapshots of recent conversations' prompt state (trunk caches, the MTP
    # head's history). 2 GiB holds ~10 turns of several conversations at the 9B shape (a
    # snapshot there is ~50 MiB of Gated-DeltaNet state plus 32 KiB of attention KV a token)
    # next to the 5 GiB of 4-bit weights on a 16 GB laptop. 0 turns it off.
    prefix_cache_mb: int = Field(2048, ge=0)
    # The prefix cache on disk (core/disk_cache.py): snapshots survive a restart. None: the user's
    # cache folder (core.disk_cache.default_dir: $XDG_CACHE_HOME or ~/.cache, then mtp-chat/prefix);
    # "" turns it off. The folder holds conversations' decoding state (docs/usage.md, "Prefix cache on
    # disk"); `mtp-chat --clear-cache` empties it. Budget and TTL: least recently used entries go
    # first; an entry unused for the TTL is removed at the next start (0: no TTL).
    cache_dir: Optional[str] = None
    disk_cache_mb: int = Field(4096, ge=0)
    disk_cache_ttl_hours: float = Field(168.0, ge=0)
    # After a reply the app snapshots the conversation, reply included, in idle time (the next
    # turn then prefills only its new message), once this many seconds have passed without a
    # request. A request that comes while it runs starts from it; one that comes before it started
    # prefills the reply itself (webapp/serving/history.py). 0: at once, so that an agent's tool
    # call and the reply's prefill overlap.
    history_grace_s: float = Field(0.0, ge=0)
    # A long prompt goes through the trunk this many tokens at a time (core/stream.py). Larger chunks
    # prefill faster and hold more memory while they run (H200, 9B shape, 8k tokens: 5,821 tok/s and
    # 8.8 GB peak at 512; 6,607 tok/s and 12.4 GB at 1024: docs/bench/2026-12-02/gpu-s4-prefill-9b.json).
    prefill_chunk: int = Field(512, ge=16, le=8192)
    # Caps the context below the model's own (max_position_embeddings), in tokens; None = the model's.
    max_context: Optional[int] = Field(None, ge=64)
    # Reasoning templates (enable_thinking): True / False, or None = the template's default.
    thinking: Optional[bool] = None
    blas: str = Field("auto", description="'auto', 'off' or a path to an OpenBLAS library")
    # Backends (adapters/qwen3_5/backends.py, cpu_runner.py, gpu_runner.py): few-token forwards compiled per layer (the CPU
    # path; on CUDA around the kernels), and the adapter's own CUDA / Metal kernels. Off: MLX's own ops.
    compiled: bool = True
    gpu_kernels: bool = True
    # The fused CUDA kernels (a Gated-DeltaNet layer's middle in one launch, the few-row attention):
    # None = the backend's default (adapters/qwen3_5/backends.py), True / False to force them.
    gpu_fused: Optional[bool] = None
    # CUDA kernel changes that lost to the defaults when paired on an H200 (2026-12-02: GPU.md
    # section 8), kept for other GPUs to measure: a comma list of "submit" (a forward's first layers handed to the GPU every 8 layers while the host builds
    # the rest), "swiglu" (the MLP's activation read inside down_proj), "verify-submit" (the same
    # as "submit" for a verify's forward alone, where the device waits for it after the cycle's
    # sync; the AR step, queued while the one before runs, keeps one submit; a verify of several
    # sequences is handed every 8 layers by default, since section 16), "batch-verify-wait" (that
    # default off, to pair it), "batch-submit" (a plain step of several sequences, AR at B > 1,
    # handed every 8 layers), "topk-mlx" (the sampler's top-k supports through MLX's ops instead of
    # the default CUDA kernel, to pair them), "topk-support" (the kernel's support with categorical's
    # draw after it, ~8 launches, where by default the kernel also draws the token by inverse CDF from
    # one uniform a row; to pair them). Each keeps every row's bits (checked at load), so it
    # only moves speed; the top-k kernel keeps the sampler's distribution (its supports checked at
    # load against MLX's ops) but orders the kept columns its own way, so a given seed draws other
    # tokens with "topk-mlx" than without. ("two-tiles", 9-16 rows in one matmul launch, is the
    # default since it was paired on the H200: 1.29x MTP's aggregate at 4 requests, section 10 of
    # docs/bench/2026-12-03/GPU.md; "topk-kernel" since section 19 of docs/bench/2026-12-04/GPU.md:
    # sampled lanes at the 9B shape AR 1.09x / 1.04x, MTP 1.09x / 1.12x in two pairs; "topk-draw"
    # since section 20: AR 1.00x / 1.06x, MTP 1.01x / 1.03x, the chi-square held.)
    gpu_trials: str = ""
    # Continuous batching (webapp/serving/batching.py, core/batch.py): requests decode together, each
    # as alone (bit for bit, or up to ties where this machine's BLAS rounds a batch's rows
    # differently: core/exactness.py, said at start-up). max_batch sequences at once (1: one at a time); max_batched_tokens caps
    # the positions of one verify forward (an MTP request at depth D counts D + 1, an AR one 1).
    # Unset: 4 on an NVIDIA GPU, where it pays, 1 elsewhere (core.batch.default_max_batch says why).
    max_batch: Optional[int] = Field(None, ge=1, le=64)
    max_batched_tokens: int = Field(64, ge=1, le=4096)
    # A newcomer's prefill runs this many tokens per batched step while others decode: what a long
    # prompt that joins holds the others back by per step (scripts/bench/bench_batch.py measures it).
    batch_prefill_chunk: int = Field(64, ge=1, le=8192)
    # Measured cost models (core/calibrate.py) are saved here per machine and model and reused
    # at the next start; None: ~/.cache/mtp-chat/costs. "" turns saving off.
    costs_dir: Optional[str] = None

    # Pictures (a checkpoint with a vision tower): the most pixels a picture is resized to (the
    # processor's way: multiples of 32 px, aspect kept; 1,003,520 is ~1,000 image tokens, ~1,000x1,000
    # px), pictures per request, and the bytes of one picture as sent.
    image_max_pixels: int = Field(1_003_520, ge=1024)
    image_max_count: int = Field(IMAGE_MAX_COUNT, ge=0, le=64)
    image_max_bytes: int = Field(IMAGE_MAX_BYTES, ge=1024)

    @field_validator("depth", mode="before")
    @classmethod
    def _depth(cls, v):
        if isinstance(v, str) and v.strip().lower() == "auto":
            return "auto"
        v = int(v)
        if v < 1:
            raise ValueError("depth must be >= 1 or 'auto'")
        return v

    @field_validator("cors_origins")
    @classmethod
    def _cors(cls, v):
        for origin in filter(None, (o.strip() for o in v.split(","))):
            if origin != "*" and (not origin.startswith(("http://", "https://")) or origin.count("/") != 2):
                raise ValueError(f"cors_origins: {origin!r} is not an origin like http://localhost:3000 (scheme, "
                                 f"host, optional port, no path)")
        return v

    @property
    def cors_list(self) -> tuple:
        return tuple(o.strip().rstrip("/") for o in self.cors_origins.split(",") if o.strip())

    @field_validator("gpu_trials")
    @classmethod
    def _gpu_trials(cls, v):
        names = [t.strip() for t in v.split(",") if t.strip() and t.strip() not in GPU_TRIALS_ADOPTED]
        wrong = [t for t in names if t not in GPU_TRIALS]
        if wrong:
            raise ValueError(f"gpu_trials: {', '.join(map(repr, wrong))} unknown; a comma list of {', '.join(GPU_TRIALS)}")
        return ",".join(names)

    @field_validator("auth")
    @classmethod
    def _auth(cls, v):
        if v is not None and (":" not in v or not v.split(":", 1)[0] or not v.split(":", 1)[1]):
            raise ValueError("auth must look like USER:PASS")
        return v


def get_settings(**overrides) -> Settings:
    return Settings(**{k: v for k, v in overrides.items() if v is not None})
