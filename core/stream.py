"""What both lanes share around their decode loop: prompt handling, prefill, stopping, text, timing."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import Iterator, List, Optional, Sequence, Tuple

import mlx.core as mx

from .images import ImageSpan, key_ids
from .logprobs import token_logprobs
from .prefix_cache import PrefixCache, Snapshot, marks_within
from .stats import GenerationStats, OwnClock
from .waterfall import SAMPLE_EVERY, Waterfall

PREFILL_CHUNK = 512


def set_prefill_chunk(tokens: int) -> None:
    """The process's prefill chunk (settings.prefill_chunk): every prefill that does not pass its
    own. Both lanes prefill alike whatever it is, so greedy MTP == AR holds at any size."""
    global PREFILL_CHUNK
    if not 16 <= int(tokens) <= 8192:
        raise ValueError(f"a prefill chunk of {tokens} tokens: give 16-8192 (MTP_CHAT_PREFILL_CHUNK)")
    PREFILL_CHUNK = int(tokens)


# A chunk this short (a turn's generation prompt after its history's mark, typically ~5 tokens)
# takes the adapter's few-token path, as a verify of as many positions does: through the long
# path it cost ~0.035 s at 20k tokens of depth on the H200, a verify of 5 ~0.008 s
# (docs/bench/2026-12-03/GPU.md, section 12). Which path a chunk takes depends only on its
# length, and both lanes prefill alike, so greedy MTP == AR is untouched. Five: a verify's width at
# depth 4, whose kernels a GPU's warm-up has built (wider ones would compile on first use).
SHORT_CHUNK = 5
# Chunks overlap: the device runs one while the host builds the next (prefill_chunks). None: on a
# GPU only (on the CPU the "device" is the host's own cores: 2.4 % slower on the demo model, 2k
# tokens on 2 cores); True / False force it either way.
PIPELINE: Optional[bool] = None
THINK_END = "</think>"


@dataclass
class StreamEvent:
    tokens: List[int]  # newly committed token ids
    origins: List[str]  # per token: "target" | "draft" | "correction" | "bonus"
    text: str  # decoded text of these tokens (a stop string and what follows are cut)
    stats: GenerationStats
    finished: bool = False
    finish_reason: Optional[str] = None  # "eos" | "stop_string" | "max_tokens" | "stopped"
    logprobs: Optional[list] = None  # per token a core.logprobs.TokenLogprob, when the stream was asked


def synchronize() -> None:
    """Wait until the device has finished all queued work (a lane's clock can then be settled)."""
    mx.synchronize()


@dataclass(frozen=True)
class Prompt:
    """Prompt token ids plus the positions worth a prefix-cache snapshot (see core.chat), and the
    pictures whose embeddings replace the image tokens' (core.images.ImageSpan, in order)."""

    ids: Tuple[int, ...]
    marks: Tuple[int, ...] = ()
    images: Tuple[ImageSpan, ...] = ()

    @cached_property
    def key(self) -> Tuple[int, ...]:
        """What the prefix cache matches on: the ids, an image's positions keyed by its picture."""
        return key_ids(self.ids, self.images)

    def images_within(self, a: int, b: int) -> Tuple[ImageSpan, ...]:
        return tuple(s for s in self.images if a <= s.start and s.end <= b)

    def head(self, n: int, marks=()) -> "Prompt":
        """The first n tokens (no image may straddle n), with `marks` added."""
        assert not any(s.start < n < s.end for s in self.images), "a prompt cut inside a picture"
        return Prompt(self.ids[:n], tuple(sorted(set(m for m in self.marks if m < n) | set(marks))),
                      tuple(s for s in self.images if s.end <= n))

    def __len__(self) -> int:
        return len(self.ids)

    def __iter__(self):
        return iter(self.ids)


class PrefillStopped(Exception):
    """The stop event was set between two prefill chunks."""


def as_prompt(prompt_ids) -> Prompt:
    images = ()
    if isinstance(prompt_ids, Prompt):
        ids, marks, images = prompt_ids.ids, prompt_ids.marks, prompt_ids.images
    else:
        ids, marks = prompt_ids, ()
    if isinstance(ids, mx.array):
        ids = ids.reshape(-1).tolist()
    ids = tuple(int(t) for t in ids)
    if not ids:
        raise ValueError("the prompt is empty: give at least one token")
    return Prompt(ids, tuple(marks), images)


@dataclass
class Prefilled:
    logits: mx.array          # of the prompt's last position [1, V]
    hidden: mx.array          # trunk hidden at the last position [1, 1, H]: the head's next input
    cached_tokens: int        # prompt tokens restored from the prefix cache
    prefilled_tokens: int     # prompt tokens run through the trunk
    # seconds: finding (and loading) the snapshot, running the chunks (a restore's deferred work
    # lands in the first), building their graphs on the host, storing snapshots at marks; the
    # chunks; the last chunk's tokens and seconds. With chunks overlapping (PIPELINE), a chunk's
    # seconds are its building and the wait for the one before it: for a whole chunk amid others,
    # the device's time for one (the prefill's rate at the prompt's depth).
    parts: dict = field(default_factory=dict)


def prefill(adapter, prompt: Prompt, cache, draft, prefix_cache=None,
            stop: Optional[threading.Event] = None, chunk: int = 0) -> Prefilled:
    """Run the prompt through the trunk, and the drafter over it, in chunks (all of them now;
    `prefill_chunks` runs them one at a time)."""
    return run_through(prefill_chunks(adapter, prompt, cache, draft, prefix_cache, stop, chunk))


def run_through(steps: Iterator):
    """Run a generator to its end; returns its return value."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def prefill_chunks(adapter, prompt: Prompt, cache, draft, prefix_cache=None,
                   stop: Optional[threading.Event] = None, chunk: int = 0) -> Iterator[int]:
    """Run the prompt through the trunk, and the drafter over it, one chunk per next() (it
    yields the tokens done so far; its return value is the Prefilled).

    The drafter's history of the prompt belongs to prefill: after it the drafter has seen
    positions 0..L-2 (hidden n with token n+1) and the first decode cycle only adds the last
    position. `draft` None: nothing will draft (the AR lane without a prefix cache), so the
    drafter is skipped. Chunks end every `chunk` tokens (0: PREFILL_CHUNK; a batch passes a
    smaller one, so that a newcomer's prefill stalls the others for one short chunk at a time,
    core/batch.py) and at the prompt's marks, where snapshots go into `prefix_cache`; before
    each chunk the stop event is checked, so a long prompt can be abandoned within one chunk.
    """
    ids, L = prompt.ids, len(prompt.ids)
    key = prompt.key   # the ids, with each picture's positions keyed by the picture (core.images)
    chunk = chunk or PREFILL_CHUNK
    start, h_last = 0, None
    t = time.perf_counter()
    snap = prefix_cache.lookup(key) if prefix_cache is not None and draft is not None else None
    if snap is not None:
        adapter.restore(snap.state, cache, draft)
        h_last, start = snap.hidden, snap.length
    parts = {"lookup_s": time.perf_counter() - t, "chunks_s": 0.0, "build_s": 0.0, "snapshots_s": 0.0, "chunks": 0}
    tokens = mx.array(ids, dtype=mx.int32)
    ends = chunk_ends(start, L, marks_within(list(prompt.marks), start, L), chunk)   # lookup leaves >= 1 token
    # A picture enters whole: no chunk ends inside one (its tower output and grid positions are one piece).
    ends = [e for e in ends if not any(s.start < e < s.end for s in prompt.images)]
    a, flight = start, None
    overlap = PIPELINE if PIPELINE is not None else mx.default_device() != mx.cpu
    for b in ends:
        if stop is not None and stop.is_set():
            raise PrefillStopped()
        pictures = prompt.images_within(a, b)
        t = time.perf_counter()
        logits, hidden, _ = adapter.forward(tokens[None, a:b], cache, all_logits=False, fast=b - a <= SHORT_CHUNK,
                                            **({"images": pictures} if pictures else {}))
        # Drafter positions a-1 .. b-2: (hidden n, token n+1).
        hs = hidden[:, :-1] if h_last is None else mx.concatenate([h_last, hidden[:, :-1]], axis=1)
        if draft is not None and hs.shape[1]:
            adapter.absorb(draft, cache, hs, tokens[None, b - hs.shape[1] : b])
        h_last = hidden[:, -1:] + 0  # its own buffer, not a view that keeps the chunk alive
        parts["build_s"] += time.perf_counter() - t
        # The device runs this chunk while the host builds the next one (values are the same;
        # the host's graph building no longer adds to each chunk's time), one chunk ahead at
        # most: the previous chunk is waited for here, which bounds the graph and the memory
        # in flight to two chunks' worth.
        done = [h_last, logits, adapter.state_arrays(cache, draft)]
        if overlap:
            mx.async_eval(done)
            done, flight = flight, done
        if done is not None:
            mx.eval(done)
        took = time.perf_counter() - t
        parts["chunks_s"] += took
        parts["chunks"] += 1
        parts["last_chunk_tokens"], parts["last_chunk_s"] = b - a, took
        if b - a == chunk:   # the last whole chunk: the prefill's rate at the prompt's depth
            parts["full_chunk_tokens"], parts["full_chunk_s"] = b - a, took
        if prefix_cache is not None and draft is not None and b in prompt.marks:
            t = time.perf_counter()
            prefix_cache.store(Snapshot(tuple(key[:b]), adapter.snapshot(cache, draft), h_last))
            parts["snapshots_s"] += time.perf_counter() - t
        a = b
        if b < L:
            yield b
    if flight is not None:
        t = time.perf_counter()
        mx.eval(flight)
        took = time.perf_counter() - t
        parts["chunks_s"] += took
        parts["last_chunk_s"] += took
    return Prefilled(logits[:, -1], h_last, start, L - start, parts)


def chunk_ends(start: int, end: int, marks: Sequence[int], chunk: int) -> List[int]:
    """Where a prefill's chunks end, from `start` to `end`: at every mark and at `end`, and between
    two of them every `chunk` tokens counted from the first (a restored prompt's chunks after a
    mark are then the ones a fresh prefill runs there)."""
    ends, a = [], start
    for b in sorted(set(marks) | {end}):
        ends += range(a + chunk, b, chunk)
        ends.append(b)
        a = b
    return ends


def rehearse(adapter, snap: Snapshot, new: int = 64) -> int:
    """A turn's continuation of `snap` run through the engine's own prefill and dropped: `new`
    tokens on the long path, then SHORT_CHUNK on the few-token path, as an agent's next turn after
    a restart runs them. Why: a process's first long chunk at a deep restored context cost
    ~0.2 s more of host time than later ones on the H200 (docs/bench/2026-12-03/GPU.md, section
    13), paid by the first turn after a restart unless paid here, before the server listens.
    Nothing of it stays: its caches and the one-snapshot prefix cache go. Returns the tokens run."""
    if snap.length < 1:
        return 0
    # The snapshot's own last tokens again (never a picture's positions: their key ids are negative).
    pool = [t for t in snap.ids[-4 * new:] if t >= 0] or [0]
    filler = (pool * ((new + SHORT_CHUNK) // len(pool) + 1))[:new + SHORT_CHUNK]
    prompt = Prompt(tuple(snap.ids) + tuple(filler), (snap.length + new,))
    held = PrefixCache(1 << 62)
    held.store(snap)
    cache = adapter.make_cache()
    draft = adapter.make_draft(cache)
    done = prefill(adapter, prompt, cache, draft, held)
    mx.eval(done.logits)
    return done.prefilled_tokens


def _partial_match(text: str, stop_strings: Sequence[str]) -> int:
    """Length of the longest end of `text` that begins some stop string (0 if none)."""
    longest = 0
    for stop in stop_strings:
        for k in range(min(len(stop) - 1, len(text)), longest, -1):
            if stop.startswith(text[-k:]):
                longest = k
                break
    return longest


def cache_prompt(adapter, prompt: Prompt, prefix_cache, stop: Optional[threading.Event] = None) -> int:
    """Prefill all but the prompt's last token into `prefix_cache` (a snapshot there), so that
    lanes started on this prompt afterwards all start from the same state; returns the tokens
    now cached."""
    if len(prompt.ids) < 2:
        return 0
    head = prompt.head(len(prompt.ids) - 1, (len(prompt.ids) - 1,))
    snap = prefix_cache.lookup(prompt.key)
    if snap is not None and snap.length == len(head.ids):
        return snap.length
    cache = adapter.make_cache()
    prefill(adapter, head, cache, adapter.make_draft(cache), prefix_cache, stop)
    return len(head.ids)


def cache_history(adapter, history: Prompt, prefix_cache) -> int:
    """Snapshot the state after a conversation as the next turn's prompt will begin
    (core.chat.history_prompt: the template's rendering, reply included, thinking dropped), so
    that the next turn prefills only its new message. Run after a reply, in idle time; it
    prefills from the longest snapshot there is (the one before this reply's generation
    prompt). Returns the tokens snapshotted."""
    return run_through(history_steps(adapter, history, prefix_cache))


def history_steps(adapter, history: Prompt, prefix_cache, stop: Optional[threading.Event] = None) -> Iterator[int]:
    """cache_history one prefill chunk per next() (its return value: the tokens snapshotted); a
    set `stop` ends it between chunks (PrefillStopped)."""
    n = len(history.ids)
    cache = adapter.make_cache()
    yield from prefill_chunks(adapter, Prompt(tuple(history.ids), (n,), history.images), cache,
                              adapter.make_draft(cache), prefix_cache, stop)
    return n


class Lane:
    """Base of both decoders: `stream` wraps the lane's `_steps` generator.

    `_steps(prompt, max_tokens, stats, stop)` yields (tokens, origins, rows): the tokens, their
    origins and the target's logits each was sampled from ([len(tokens), V], read only for
    logprobs); its first yield is the token sampled from the prompt's last position. With a
    `prefix_cache` (core.prefix_cache.PrefixCache) the prefill starts from the longest stored
    prefix; with a `constraint` (core.constraints.Constraint) every token obeys its grammar.
    """

    mode = "ar"

    def __init__(self, adapter, sampler, seed: int = 0, prefix_cache=None, constraint=None):
        self.adapter = adapter
        self.sampler = sampler
        self.seed = seed
        self.prefix_cache = prefix_cache
        self.constraint = constraint

    waterfall_every = SAMPLE_EVERY   # 1 cycle in N is timed phase by phase (core/waterfall.py); 0: off
    clock = OwnClock   # what the stats' seconds count: the lane's own compute (paused between events)

    def _steps(self, prompt: Prompt, max_tokens: int, stats: GenerationStats,
               stop: Optional[threading.Event], wf: Optional[Waterfall] = None,
               ) -> Iterator[Tuple[List[int], List[str], mx.array]]:
        raise NotImplementedError

    def _make_caches(self):
        cache = self.adapter.make_cache()
        return cache, self.adapter.make_draft(cache)

    needs_head = True  # the drafter's history of the prompt; the AR lane needs it only for snapshots

    def _prefill(self, prompt: Prompt, stats: GenerationStats, stop, wf: Waterfall) -> Tuple[object, object, Prefilled]:
        """Fresh caches, filled with the prompt (from the prefix cache where it can)."""
        return run_through(self._prefill_chunks(prompt, stats, stop, wf))

    def _prefill_chunks(self, prompt: Prompt, stats: GenerationStats, stop, wf: Waterfall, chunk: int = 0):
        """`_prefill` one chunk per next() (core.stream.prefill_chunks); returns what it returns."""
        t0 = time.perf_counter()
        cache, draft = self._make_caches()
        if not self.needs_head and self.prefix_cache is None:
            draft = None   # nothing will read it: AR's first token does not wait for the drafter
        steps = prefill_chunks(self.adapter, prompt, cache, draft, self.prefix_cache, stop, chunk)
        while True:
            try:
                done_so_far = next(steps)
            except StopIteration as end:
                done = end.value
                break
            wf.add("prefill", time.perf_counter() - t0)
            yield done_so_far
            t0 = time.perf_counter()
        stats.cached_tokens, stats.prefilled_tokens = done.cached_tokens, done.prefilled_tokens
        stats.prefill_parts = dict(done.parts)
        wf.add("prefill", time.perf_counter() - t0)   # prefill ends with an eval: its work is done
        return cache, draft, done

    def generate(self, prompt_ids, max_tokens: int = 256, stop_strings: Sequence[str] = ()) -> Tuple[List[int], GenerationStats]:
        ids: List[int] = []
        stats = None
        for event in self.stream(prompt_ids, max_tokens=max_tokens, stop_strings=stop_strings):
            ids += event.tokens
            stats = event.stats
        return ids, stats

    def stream(
        self,
        prompt_ids,
        max_tokens: int = 256,
        stop: Optional[threading.Event] = None,
        stop_strings: Sequence[str] = (),
        thinking: bool = False,
        logprobs: Optional[int] = None,
        think_end: str = THINK_END,
    ) -> Iterator[StreamEvent]:
        """Events of one reply. `thinking`: the reply starts inside a think block (the template
        opened it), which `think_end` closes (the template's marker, core.reasoning); stop
        strings then apply to the answer only, not to the reasoning.
        `logprobs`: each event also carries its tokens' log-probabilities with this many
        alternatives (core.logprobs)."""
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        prompt = as_prompt(prompt_ids)
        tokenizer = self.adapter.tokenizer
        eos = set(tokenizer.eos_token_ids)
        detok = tokenizer.detokenizer
        detok.reset()
        stats = GenerationStats(mode=self.mode, prompt_tokens=len(prompt.ids))
        clock = self.clock()
        clock.resume()
        wf = self.last_waterfall = Waterfall(self.waterfall_every)   # kept for benchmarks
        steps = self._steps(prompt, max_tokens, stats, stop, wf)
        text_so_far = ""
        answer_from = None if thinking else 0
        seen = charged = 0.0   # the lane's clock and the phases' seconds at the last event
        try:
            while True:
                rows = None
                if stop is not None and stop.is_set():
                    reason, tokens, origins = "stopped", [], []
                else:
                    try:
                        tokens, origins, rows = next(steps)
                        reason = None
                    except PrefillStopped:
                        tokens, origins, reason = [], [], "stopped"
                    for i, t in enumerate(tokens):
                        if t in eos:
                            tokens, origins, reason = tokens[:i], origins[:i], "eos"
                            break
                    room = max_tokens - stats.generated_tokens
                    if len(tokens) >= room and reason is None:
                        reason = "max_tokens"
                    tokens, origins = tokens[:room], origins[:room]
                first = stats.generated_tokens == 0
                stats.generated_tokens += len(tokens)
                for t in tokens:
                    detok.add_token(t)
                if reason in ("eos", "max_tokens", "stopped"):
                    detok.finalize()
                new_text = detok.text[len(text_so_far):]
                if stop_strings:
                    full = text_so_far + new_text
                    if thinking and answer_from is None and think_end in full:
                        answer_from = full.index(think_end) + len(think_end)
                    since = answer_from if answer_from is not None else len(full)
                    hits = [full.find(s, max(since, len(text_so_far) - len(s))) for s in stop_strings if s]
                    hits = [h for h in hits if h >= 0]
                    if hits:
                        new_text = full[: min(hits)][len(text_so_far):]
                        reason = "stop_string"
                    elif reason is None:
                        # Hold back a tail that may be the start of a stop string: once sent,
                        # text cannot be taken back if the next tokens complete the match.
                        hold = _partial_match(full[max(since, len(text_so_far)):], stop_strings)
                        new_text = full[len(text_so_far): len(full) - hold]
                text_so_far += new_text
                now = clock.now()
                if first and tokens:
                    stats.time_to_first_token = stats.prefill_seconds = now
                elif first:  # stopped before any token: it was all prefill
                    stats.prefill_seconds = now
                stats.compute_seconds = now
                stats.decode_seconds = now - stats.prefill_seconds
                stats.finish_reason = reason
                # the host's own work: whatever of the lane's clock since the last event no phase
                # timed (detokenising, stop strings, the generator's bookkeeping and resumes), so
                # the parts add up to the clock exactly, a thread switch included wherever it falls
                accounted = wf.accounted()
                host = (now - seen) - (accounted - charged)
                wf.add("host", host)
                seen, charged = now, accounted + host
                stats.waterfall = wf.parts()
                clock.pause()
                lps = None if logprobs is None else token_logprobs(rows, tokens, logprobs)   # [] for no tokens
                yield StreamEvent(tokens, origins, new_text, stats, reason is not None, reason, lps)
                if reason is not None:
                    return
                clock.resume()
        finally:
            steps.close()
