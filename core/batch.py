"""Several sequences decoded together, in both lanes, with each one's output exactly its own.

Why: a decode step reads every weight to make one token per sequence, so stepping B sequences
in one forward costs little more than one (issue 22). Each sequence keeps what makes its output
its own: its caches, sampler, PRNG stream, grammar and depth policy; the decisions taken on
them (sampling, acceptance, rollback) are the same code the lanes run alone (core/decoders.py),
one sequence at a time, except where they are the same for every row: greedy sequences without
a grammar take their argmax in one launch for the batch, and the adapter may roll every
sequence back at once (`rollback_batch`), each row moved as its own rollback would. What the
batch shares is the target's forward and the head's output projection (the adapter's
`forward_batch` / `draft_batch`; core falls back to a loop over sequences for an adapter
without them).

A sequence joins with its prefill run a chunk per step after the others' cycle (its first token
comes out of the step that ends it), or whole at once; it leaves between two steps (finished,
stopped, cancelled): nothing else in the batch changes.

One step of the batch (`Batch.step`):

    AR group (AR lane, and MTP sequences priced out or one token from their end):
        one forward of every pending token -> each sequence samples its next token
    MTP group, one per draft depth D:
        D draft steps (one shared output projection each) -> each sequence draws its drafts
        one verify forward of [pending, d1..dD] per sequence -> each accepts its own prefix,
        takes its correction or bonus, and its caches roll back to what it kept
"""
from __future__ import annotations

import collections
import threading
from typing import Dict, List, Optional, Sequence as Seq

import mlx.core as mx

from .acceptance import accepted_prefix, verify_drafts
from .constraints import allowed_after, lazy_free
from .costs import DepthPolicy
from .sampling import KeyStream, all_finite, check_finite, greedy_rows_or_flag, sample_or_flag
from .stats import WallClock
from .stream import Lane


def default_max_batch() -> int:
    """Sequences decoded together when `max_batch` is not set: 4 on an NVIDIA GPU, 1 elsewhere.
    On CUDA a forward of 4 sequences reads the weights once for all (the row kernel), so 4 requests
    at the 9B shape gave 2.68x one request's aggregate with AR and 2.58x with MTP at depth 2, each
    reply equal to its reply alone (H100, docs/bench/2026-12-05/gpu-s28-targets2-batch_4.json). On
    the CPU a batch of 4 gave 1.19x through the server, not worth a reply shown as shared; on Apple
    GPUs it has not been measured."""
    from .disk_cache import on_cuda

    return 4 if on_cuda() else 1


class Sequence:
    """One request in a batch: its decoder's settings, its decoding state between steps, and
    its event stream (`events`: the lane's own StreamEvents: stop strings, EOS, max_tokens, text)."""

    def __init__(self, decoder: Lane, prompt, max_tokens: int, stop: Optional[threading.Event] = None,
                 **stream_kwargs):
        self.adapter, self.sampler, self.constraint = decoder.adapter, decoder.sampler, decoder.constraint
        self.mode = decoder.mode
        self.keys = KeyStream(decoder.seed, active=not decoder.sampler.greedy)
        self.max_tokens, self.stop = max_tokens, stop
        self.decoder = decoder
        self.outbox: collections.deque = collections.deque()   # (tokens, origins, rows) the batch made
        self.cache = self.draft = self.stats = self.policy = None
        self.pending: int = -1       # the last token out, not yet through the trunk
        # The AR lane, pipelined: (the next token, sampled but not read yet, and its logits row);
        # `pending` has been through the trunk then.
        self.ahead = None
        self.feed_h = self.feed_t = None   # what the head has not seen yet (MTP)
        self.free = False            # this step is free text of a triggered grammar (core.constraints.Triggered)
        self.produced = 0
        self.last = None             # the latest StreamEvent
        self.chunk = 0               # prefill chunk (0: the lanes' own, core.stream.PREFILL_CHUNK)
        self.prefilled = 0           # prompt tokens prefilled so far
        self.events = _Fed(self).stream(prompt, max_tokens=max_tokens, stop=stop, **stream_kwargs)

    @property
    def finished(self) -> bool:
        return self.last is not None and self.last.finished

    # -- joining: prefill, then the first token ------------------------------------------------
    def start(self, prefilled) -> tuple:
        done = prefilled
        self.stats.target_forwards += 1
        self.produced = 1
        if self.mode != "mtp":
            # As the AR lane starts: the first decode step is queued before the first token is
            # read, and from then on each step queues the next before reading its own (take_ahead).
            first = self._sample(done.logits, allowed_after(self.constraint))
            self.free = lazy_free(self.constraint)
            if self.max_tokens > 1:
                self._queue_ahead(first)
            self.pending = first.item()
            check_finite(self.pending >= 0, "target model")
            self._opened(self.pending)
            return [self.pending], ["target"], done.logits
        first = self.sampler.sample(done.logits, self.keys.next(), allowed_after(self.constraint))
        check_finite(all_finite(done.logits).item(), "target model")
        self.pending = first.item()
        if self.constraint is not None:
            self.constraint.advance([self.pending])
        d = self.decoder
        self.policy = DepthPolicy(d.depth, d.max_depth, d.costs_at(self.stats.prompt_tokens))
        self.feed_h, self.feed_t = done.hidden, first
        return [self.pending], ["target"], done.logits

    def _sample(self, logits: mx.array, allowed) -> mx.array:
        return sample_or_flag(self.sampler, logits, self.keys.next(), allowed)

    def _queue_ahead(self, y: mx.array) -> None:
        """Alone (the AR lane's own start): the forward of `y` and the token after it, queued
        on the device without waiting; a batch's later steps take it from there."""
        logits, _, _ = self.adapter.forward(y[None], self.cache, all_logits=False)
        row = logits[:, -1]
        self.ahead = (self._sample(row, None if self.free else allowed_after(self.constraint, y)), row)
        mx.async_eval(self.ahead[0])

    def _opened(self, token: int) -> None:
        """Free text: if `token` opened the grammar, the token after it (sampled ahead, free)
        is drawn again under the grammar."""
        if self.free and self.constraint.take([token]) and self.ahead is not None:
            row = self.ahead[1]
            self.ahead = (self._sample(row, self.constraint.allowed()), row)
            mx.async_eval(self.ahead[0])

    def depth(self, batch: int = 1) -> int:
        """This step's draft depth among `batch` sequences: 0 for the AR lane, priced out (at
        this batch size: core.costs.Costs.at_batch), or one token from the end."""
        self.free = lazy_free(self.constraint)
        if self.mode != "mtp":
            return 0
        self.stats.depth = self.policy.choose(self.stats, batch)
        return max(0, min(self.stats.depth, self.max_tokens - self.produced - 1))

    # -- the decisions of one step, on this sequence alone ---------------------------------------
    def feeds(self) -> bool:
        """Does this AR step need a forward of this sequence? Not for the last token of one
        pipelined: it was sampled in the step before."""
        return self.ahead is None or self.produced + 1 < self.max_tokens

    def next_input(self) -> mx.array:
        """[1] int32: the token this AR step puts through the trunk (lazy when pipelined)."""
        return self.ahead[0] if self.ahead is not None else mx.array([self.pending], dtype=mx.int32)

    def sample_ahead(self, logits: Optional[mx.array]) -> Optional[mx.array]:
        """Pipelined: sample the token after the one ahead from its logits [1, V] (None: its
        last token, nothing to sample); not read yet."""
        if logits is None:
            self._next = None
            return None
        y = self._sample(logits, None if self.free else allowed_after(self.constraint, self.ahead[0]))
        self._next = (y, logits)
        return y

    def greedy_plain(self) -> bool:
        """Is this sequence's next token argmax of its logits with no mask (no grammar)? Such
        sequences' AR steps sample in one launch for the batch (Batch._ar_step)."""
        return self.sampler.greedy and self.constraint is None

    def take_ahead(self) -> None:
        """Pipelined: read the token sampled in the step before (its successor is on its way)."""
        (y, row), self.ahead = self.ahead, self._next
        token = y.item()
        check_finite(token >= 0, "target model")
        self._opened(token)
        self.stats.record_cycle(0, 0)
        self._emit([token], ["target"], row)

    def take_ar(self, logits: mx.array, hidden: mx.array) -> None:
        """logits [1, V], hidden [1, 1, H] of the pending token: sample the next one."""
        y = self._sample(logits, allowed_after(self.constraint))
        token = y.item()
        check_finite(token >= 0, "target model")
        if self.mode == "mtp":
            self.feed_h = mx.concatenate([self.feed_h, hidden], axis=1)
            self.feed_t = mx.concatenate([self.feed_t, y.astype(self.feed_t.dtype)])
        self.stats.record_cycle(0, 0)
        if self.constraint is not None:
            self.constraint.advance([token])
        self._emit([token], ["target"], logits)

    def draw(self, logits: mx.array, masks: list):
        """A draft token from the head's logits [1, V] (and the mask for the next one)."""
        t, q = self.sampler.draw(logits, self.keys.next(), masks[-1])
        masks.append(None if self.free else allowed_after(self.constraint, t))
        return t, q

    def accept(self, drafts: mx.array, qs: list, logits: mx.array, masks: list):
        """The exact acceptance test of this sequence's drafts against its verify rows [D+1, V]
        (lazy: the batch reads every sequence's outcome in one sync)."""
        q = None if self.sampler.greedy else _stack(qs)
        allowed = None if self.constraint is None or self.free else mx.stack(masks)
        p = self.sampler.mask(logits, allowed) if self.sampler.greedy else self.sampler.support(logits, allowed)
        return verify_drafts(p, q, drafts, self.keys.next(3), self.sampler.greedy)

    def verified(self, drafts: List[int], accepted: List[bool], replacement, finite: bool) -> tuple:
        """What this sequence keeps of its cycle, from its outcome as the batch's sync computed
        it: (n drafts accepted, the tokens kept, their origins). `replacement(n)`: the token after
        n accepted drafts (the correction, or the bonus after all), read only then; `finite`: were
        its verify and draft logits all finite."""
        check_finite(finite, "target model or MTP head")
        depth = len(drafts)
        n = accepted_prefix(accepted)
        tokens = drafts[:n] + [replacement(n)]
        origins = ["draft"] * n + ["bonus" if n == depth else "correction"]
        kept = self.constraint.take(tokens) if self.free else None
        if kept is not None and kept < len(tokens):   # draft `kept` opened the grammar: end the cycle there (as the lane)
            n, tokens, origins = kept - 1, tokens[:kept], origins[:kept]
        return n, tokens, origins

    def commit(self, depth: int, verified: tuple, logits, hidden) -> None:
        """Keep the verified prefix (its caches rolled back to it already, by the batch): feed it
        to the head next cycle, emit its tokens."""
        n, tokens, origins = verified
        self.adapter.end_cycle(self.draft, depth)
        self.feed_h, self.feed_t = hidden[:, :n + 1], mx.array(tokens, dtype=self.feed_t.dtype)
        self.stats.record_cycle(depth, n)
        if self.constraint is not None and not self.free:
            self.constraint.rollback(depth - n)
            self.constraint.advance(tokens[-1:])
        self._emit(tokens, origins, logits[:n + 1])

    def _emit(self, tokens: List[int], origins: List[str], rows: mx.array) -> None:
        self.pending = tokens[-1]
        self.produced += len(tokens)
        self.outbox.append((tokens, origins, rows))

    def release(self) -> None:
        """Drop the caches now (a cancelled sequence's memory goes at once, not when its reader does)."""
        self.cache = self.draft = self.feed_h = self.feed_t = self.ahead = None
        self.outbox.clear()
        self.events.close()


class _Fed(Lane):
    """The lane's `stream` around a sequence whose tokens the batch makes: the same stopping
    rules, text and statistics as decoding alone."""

    def __init__(self, seq: Sequence):
        d = seq.decoder
        super().__init__(d.adapter, d.sampler, d.seed, d.prefix_cache, d.constraint)
        self.mode, self.needs_head, self.seq = d.mode, d.needs_head, seq
        self.waterfall_every = 0
        self.clock = WallClock   # its steps run outside this generator: the request's own time is wall time

    def _steps(self, prompt, max_tokens, stats, stop, wf=None):
        seq = self.seq
        seq.stats = stats
        chunks = self._prefill_chunks(prompt, stats, stop, wf, seq.chunk)
        while True:
            try:
                seq.prefilled = next(chunks)
            except StopIteration as end:
                seq.cache, seq.draft, done = end.value
                break
            yield [], [], None   # a chunk done, no token yet: the batch does not pass this on
        yield seq.start(done)
        while True:
            yield seq.outbox.popleft()


class Batch:
    """The sequences being decoded together; `step` advances each by one cycle.

    A newcomer either joins at once (`join`: its whole prefill now, as when it decodes alone) or
    is admitted (`admit`): then each step runs one chunk of its prefill (`prefill_chunk` tokens)
    after the others' cycle, so that a long prompt holds the others back one chunk at a time
    instead of its whole prefill; its first token comes out of the step that ends its prefill.
    One newcomer prefills at a time, in the order admitted. Chunked attention sums in another
    order than one long prefill (fp32 rounding in the last bits, as any two chunkings:
    tests/test_engine_behaviour.py), so a newcomer admitted while nobody decodes prefills whole,
    exactly as alone."""

    def __init__(self, adapter, prefill_chunk: int = 64):
        self.adapter = adapter
        self.prefill_chunk = prefill_chunk
        self.running: List[Sequence] = []
        self.joining: List[Sequence] = []

    def join(self, seq: Sequence):
        """Prefill `seq` whole and take it in; returns its first event (its first token)."""
        seq.last = next(seq.events)
        while not (seq.last.tokens or seq.last.finished):
            seq.last = next(seq.events)
        if not seq.finished:
            self.running.append(seq)
        return seq.last

    def admit(self, seq: Sequence) -> None:
        """Take `seq` in: its prefill runs a chunk per step from the next step on."""
        self.joining.append(seq)

    def leave(self, seq: Sequence) -> None:
        if seq in self.running:
            self.running.remove(seq)
        if seq in self.joining:
            self.joining.remove(seq)
        seq.release()

    def step(self) -> Dict[Sequence, object]:
        """One cycle of every running sequence, in as few forwards as there are draft depths
        in use, then one prefill chunk of the first newcomer; returns each sequence's new event
        (a newcomer's once its prefill is done: its first token; an exception if its prefill
        failed, after which it has left). Finished ones leave."""
        groups: Dict[int, List[Sequence]] = {}
        live = [s for s in self.running if s.stop is None or not s.stop.is_set()]   # a stopped one only needs its 'stopped' event
        for s in live:
            groups.setdefault(s.depth(len(live)), []).append(s)
        for depth, group in sorted(groups.items()):
            if depth == 0:
                self._ar_step(group)
            else:
                self._mtp_step(group, depth)
        out = {}
        for s in list(self.running):
            s.last = out[s] = next(s.events)
            if s.finished:
                self.leave(s)
        if self.joining:
            s = self.joining[0]
            if s.last is None and not self.running:
                s.chunk = 0   # nobody to hold back: the whole prefill, as alone
            elif s.last is None:
                s.chunk = self.prefill_chunk
            try:
                s.last = next(s.events)
            except Exception as exc:  # noqa: BLE001 - that newcomer fails, the batch goes on
                self.leave(s)
                out[s] = exc
            else:
                if s.last.tokens or s.last.finished:
                    self.joining.remove(s)
                    out[s] = s.last
                    if s.finished:
                        s.release()
                    else:
                        self.running.append(s)
        return out

    def _ar_step(self, seqs: Seq[Sequence]) -> None:
        """One forward of every sequence's next input. The AR lane's sequences are pipelined as
        the lane is: their next step is queued before this step's token is read (what they put
        through the trunk is the token sampled in the step before, still on the device); the MTP
        lane's sequences that decode a plain step read theirs at once (their head needs it)."""
        fed = [s for s in seqs if s.feeds()]
        rows = {}
        if fed:
            tokens = mx.concatenate([s.next_input() for s in fed])[:, None]
            logits, hidden, _ = forward_batch(self.adapter, tokens, [s.cache for s in fed])
            rows = {id(s): b for b, s in enumerate(fed)}
        ahead = [s for s in seqs if s.ahead is not None]
        # Greedy sequences without a grammar sample in one launch (each row as sample_or_flag
        # alone: greedy_rows_or_flag); the host builds and submits a few ops, not a few a sequence.
        alike = [s for s in ahead if id(s) in rows and s.greedy_plain()]
        alike = alike if len(alike) > 1 else []
        queued = []
        if alike:
            at = [rows[id(s)] for s in alike]
            last = logits[:, -1] if at == list(range(len(fed))) else logits[mx.array(at), -1]
            ys = mx.split(greedy_rows_or_flag(last), len(alike))
            for s, y, row in zip(alike, ys, mx.split(last, len(alike))):
                s._next = (y, row)
            queued += ys   # each row evaluated with the launch: reading one later waits for nothing more
        queued += [s.sample_ahead(logits[rows[id(s)]:rows[id(s)] + 1, -1] if id(s) in rows else None)
                   for s in ahead if s not in alike]
        mx.async_eval([y for y in queued if y is not None])
        for s in seqs:
            if s.ahead is not None:
                s.take_ahead()
            else:
                b = rows[id(s)]
                s.take_ar(logits[b:b + 1, -1], hidden[b:b + 1])

    def _mtp_step(self, seqs: Seq[Sequence], depth: int) -> None:
        ad, B = self.adapter, len(seqs)
        # Greedy sequences without a grammar draw, accept and are read for the whole batch at once
        # (each row's argmax is its own: the same tokens as each alone, fewer launches and reads).
        plain = B > 1 and all(s.greedy_plain() for s in seqs)
        # 1. Draft: each head catches up on its sequence's new positions, then runs recursively.
        drafts, qs, draft_logits = ([] if plain else [[] for _ in seqs]), [[] for _ in seqs], []
        masks = [[allowed_after(s.constraint)] for s in seqs]
        hs, ts = [s.feed_h for s in seqs], [s.feed_t[None] for s in seqs]
        for _ in range(depth):
            g, logits = draft_batch(ad, [s.draft for s in seqs], [s.cache for s in seqs], hs, ts)
            draft_logits.append(logits)
            hs = mx.split(g, B) if B > 1 else [g]
            if plain:   # one column of the batch's drafts [B]
                drafts.append(mx.argmax(logits, axis=-1))
                ts = mx.split(drafts[-1][:, None], B)
                continue
            for b, s in enumerate(seqs):
                t, q = s.draw(logits[b:b + 1], masks[b])
                drafts[b].append(t)
                qs[b].append(q)
            ts = [d[-1][None] for d in drafts]
        drafts = drafts if plain else [mx.concatenate(d) for d in drafts]   # columns, or each sequence's
        drafted = mx.stack(drafts, axis=1 if plain else 0)   # [B, D]
        mx.async_eval(drafted)   # the head computes while the verify graph is built (as the lane does)

        # 2. Verify every sequence's [pending, d1..dD] in one target forward, keeping per-position state.
        tokens = mx.concatenate([mx.array([[s.pending] for s in seqs], dtype=mx.int32),
                                 drafted.astype(mx.int32)], axis=1)
        logits, vh, captured = forward_batch(ad, tokens, [s.cache for s in seqs], capture=True)

        # 3. Accept: each sequence its own prefix; every outcome (and finiteness) read in one sync.
        read = _accept(seqs, plain, tokens, logits, mx.concatenate(draft_logits).reshape(depth, B, -1),
                       drafts, qs, masks)
        # 4. Commit: each keeps what it verified (the caches rolled back together).
        kept = [s.verified(*r) for s, r in zip(seqs, read)]
        rollback_batch(ad, [s.cache for s in seqs], captured, [k[0] + 1 for k in kept])
        for b, s in enumerate(seqs):
            s.commit(depth, kept[b], logits[b], vh[b:b + 1])


def _accept(seqs, plain: bool, tokens, logits, draft_logits, drafts, qs, masks) -> list:
    """Each sequence's (drafts, accepted flags, replacement(n), finite) for Sequence.verified
    (`drafts`: each sequence's [D], where not plain; the tokens' columns 1.. hold them too):
    computed on the device, then read after one sync. A plain greedy batch runs verify_drafts'
    greedy test on every row at once (a draft is accepted iff it is the target's argmax; the
    correction, or the bonus after all, is the argmax at n) and reads each array once for the
    batch; otherwise each sequence's test runs, and is read, as the lane's alone."""
    depth = tokens.shape[1] - 1
    if plain:
        accepted, corrections, bonus = verify_drafts(logits, None, tokens[:, 1:], None, greedy=True)
        best = mx.concatenate([corrections, bonus], axis=-1)   # the target's argmax at each position
        ok = mx.isfinite(logits.sum(axis=(1, 2))) & mx.isfinite(draft_logits.sum(axis=(0, 2)))
        mx.eval(accepted, best, tokens, ok)
        rows = zip(tokens.tolist(), accepted.tolist(), best.tolist(), ok.tolist())
        return [(t[1:], a, row.__getitem__, f) for t, a, row, f in rows]
    outcomes = [s.accept(drafts[b], qs[b], logits[b], masks[b]) for b, s in enumerate(seqs)]
    ok = [mx.logical_and(all_finite(logits[b]), all_finite(draft_logits[:, b])) for b in range(len(seqs))]
    mx.eval(outcomes, tokens, ok)
    return [(t[1:], a.tolist(), lambda n, c=c, bonus=bonus: int(bonus.item() if n == depth else c.tolist()[n]), f.item())
            for t, (a, c, bonus), f in zip(tokens.tolist(), outcomes, ok)]


def forward_batch(adapter, tokens: mx.array, caches: list, capture: bool = False):
    """The adapter's batched forward, or one forward per sequence for an adapter without one."""
    fn = getattr(adapter, "forward_batch", None)
    if fn is not None:
        return fn(tokens, caches, capture=capture)
    outs = [adapter.forward(tokens[b:b + 1], c, capture=capture) for b, c in enumerate(caches)]
    return (mx.concatenate([o[0] for o in outs]), mx.concatenate([o[1] for o in outs]), [o[2] for o in outs])


def rollback_batch(adapter, caches: list, captured: list, keeps: list) -> None:
    """The adapter's rollback of a forward_batch's sequences together, or one at a time."""
    fn = getattr(adapter, "rollback_batch", None)
    if fn is not None:
        return fn(caches, captured, keeps)
    for cache, cap, keep in zip(caches, captured, keeps):
        adapter.rollback(cache, cap, keep)


def draft_batch(adapter, drafts: list, caches: list, hiddens: list, tokens: list):
    fn = getattr(adapter, "draft_batch", None)
    if fn is not None:
        return fn(drafts, caches, hiddens, tokens)
    outs = [adapter.draft_step(d, c, h, t) for d, c, h, t in zip(drafts, caches, hiddens, tokens)]
    return mx.concatenate([o[0] for o in outs]), mx.concatenate([o[1] for o in outs])


def _stack(supports):
    idx = None if supports[0][0] is None else mx.concatenate([i for i, _ in supports])
    return idx, mx.concatenate([p for _, p in supports])
