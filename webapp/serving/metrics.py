"""Prometheus metrics: what the server decoded, and how speculation paid, for monitoring tools.

`GET /metrics` (same auth rules as `/v1`) serves this registry in Prometheus' text format. Every
decode — chat, race lane, API — is counted once, when it ends, from its final GenerationStats,
labelled by lane (`ar`, `mtp`), the depth asked (`0` for AR, `1`..`8`, `auto`) and where it came
from (`chat`, `race`, `api`). The speculative counters carry vLLM's names, so dashboards built
for vLLM read them: a *draft* is one cycle that drafted (its depth tokens are the draft tokens),
accepted tokens are drafts the target confirmed, and `..._per_pos` splits them by draft position.
"""
from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LABELS = ("lane", "depth", "source")
# Time to first token is mostly prefill (seconds at long contexts on a CPU); time per output token
# is 1-100 ms on the machines this runs on.
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 0.6, 1.2)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("mtp_chat_requests", "Decodes that ended, by why they ended",
                                LABELS + ("finish_reason",), registry=r)
        self.prompt_tokens = Counter("mtp_chat_prompt_tokens", "Prompt tokens of ended decodes", LABELS, registry=r)
        self.cached_tokens = Counter("mtp_chat_cached_prompt_tokens",
                                     "Prompt tokens restored from the prefix cache instead of prefilled", LABELS,
                                     registry=r)
        self.generation_tokens = Counter("mtp_chat_generation_tokens", "Tokens generated", LABELS, registry=r)
        self.ttft = Histogram("mtp_chat_time_to_first_token_seconds", "Time to first token (prefill included)",
                              LABELS, buckets=TTFT_BUCKETS, registry=r)
        self.tpot = Histogram("mtp_chat_time_per_output_token_seconds",
                              "Decode time per output token after the first", LABELS, buckets=TPOT_BUCKETS,
                              registry=r)
        self.drafts = Counter("vllm:spec_decode_num_drafts", "Speculative cycles that drafted", LABELS, registry=r)
        self.draft_tokens = Counter("vllm:spec_decode_num_draft_tokens", "Drafted tokens", LABELS, registry=r)
        self.accepted_tokens = Counter("vllm:spec_decode_num_accepted_tokens", "Drafted tokens the target accepted",
                                       LABELS, registry=r)
        self.accepted_per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                                        "Accepted drafted tokens by draft position (0 = first draft)",
                                        LABELS + ("position",), registry=r)
        # Continuous batching (webapp/serving/batching.py), as of its latest step; vLLM's names.
        self.running = Gauge("vllm:num_requests_running", "Requests decoding together in the batch", registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests waiting for room in the batch", registry=r)

    def batch(self, running: int, waiting: int) -> None:
        self.running.set(running)
        self.waiting.set(waiting)

    def observe(self, stats, *, depth, source: str) -> None:
        """Count one ended decode from its final GenerationStats."""
        lane = "mtp" if stats.mode == "mtp" else "ar"
        labels = (lane, "0" if lane == "ar" else str(depth), source)
        self.requests.labels(*labels, stats.finish_reason or "unknown").inc()
        self.prompt_tokens.labels(*labels).inc(stats.prompt_tokens)
        self.cached_tokens.labels(*labels).inc(stats.cached_tokens)
        self.generation_tokens.labels(*labels).inc(stats.generated_tokens)
        if stats.generated_tokens:
            self.ttft.labels(*labels).observe(stats.time_to_first_token)
        if stats.generated_tokens > 1 and stats.decode_seconds > 0:
            self.tpot.labels(*labels).observe(stats.decode_seconds / (stats.generated_tokens - 1))
        if lane == "mtp":
            drafting_cycles = stats.proposed_per_depth[0] if stats.proposed_per_depth else 0
            self.drafts.labels(*labels).inc(drafting_cycles)
            self.draft_tokens.labels(*labels).inc(stats.proposed)
            self.accepted_tokens.labels(*labels).inc(stats.accepted)
            for pos, n in enumerate(stats.accepted_per_depth):
                self.accepted_per_pos.labels(*labels, str(pos)).inc(n)

    def render(self) -> bytes:
        return generate_latest(self.registry)


CONTENT_TYPE = CONTENT_TYPE_LATEST
