"""The one loaded model the whole app shares, and the decoders made from it.

The checkpoint path comes only from the command line (never from the UI). Model work is
serialised by Gradio's queue (one ``concurrency_id`` for every event that decodes).
Data flows webapp -> core -> adapters: nothing here imports mlx.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, List, Optional, Tuple

from .ar_reference import ArReferences, Reference
from .calibration import Calibration
from .history import HistorySnapshots
from .metrics import Metrics
from .params import RunParams
from .worker import ModelWorker, WorkerStream

WARMUP_PROMPT = "Hello!"
# A prompt answered at length: the race's default, and the warm-up's AR reference (which needs a
# reply of >= 32 tokens, webapp/serving/ar_reference.py). The demo model answers a greeting in ~12
# tokens, the race's old default ("what a noun is") in 12-32, this in 103-256 (seeds 0-4, both
# lanes, T=0.6 top-p 0.95 top-k 20).
LONG_REPLY_PROMPT = "Tell me about Python lists."


def describe_runtime() -> str:
    """Device and BLAS, from the adapters' runtime probe when it exists."""
    try:
        from adapters.runtime import describe_runtime as probe
    except ImportError:
        return "device: unknown (adapters.runtime not available)"
    try:
        return str(probe())
    except Exception as exc:  # a probe failure must not stop the app
        return f"device: unknown ({exc})"


class ModelHost:
    """The loaded adapter plus the decoder factory, warm-up and a running AR speed reference."""

    def __init__(self, adapter, settings, path: Optional[Path] = None, worker: Optional[ModelWorker] = None,
                 log: Callable[[str], None] = lambda m: None):
        self.worker = worker or ModelWorker()
        self.adapter = adapter
        self.settings = settings
        self.path = Path(path) if path is not None else None
        self.tokenizer = adapter.tokenizer
        try:
            self.description = str(adapter.describe())
        except Exception:
            self.description = str(self.path or "model")
        self.max_depth = int(settings.max_depth)
        self.ar_references = ArReferences()
        from core import PrefixCache, context_window, markers_for
        from core.stream import set_prefill_chunk

        set_prefill_chunk(int(getattr(settings, "prefill_chunk", 512)))

        mb = int(getattr(settings, "prefix_cache_mb", 0) or 0)
        self.prefix_cache = PrefixCache(mb * 2**20, disk=self._disk_cache(log),
                                        defer=self._in_idle_time) if mb > 0 else None
        self.context_length = context_window(adapter, getattr(settings, "max_context", None))
        self.metrics = Metrics()
        template = getattr(self.tokenizer, "chat_template", None) or ""
        self.has_thinking = "enable_thinking" in template
        self.reasoning = markers_for(template)   # <think> ... </think>, or Gemma 4's thought channel
        self.scheduler = None
        if getattr(settings, "max_batch", 1) is None:
            from core.batch import default_max_batch

            settings.max_batch = default_max_batch()   # unset: batched where it pays (the GPU)
            if settings.max_batch > 1:
                log(f"batching: up to {settings.max_batch} replies decode together, each as alone "
                    "(the default on an NVIDIA GPU; MTP_CHAT_MAX_BATCH=1 decodes one at a time)")
        # replies decoding together: the model queue's width, the API's turns, what warm-up prepares
        self.batch_width = int(getattr(settings, "max_batch", 1) or 1)
        if self.batch_width > 1:
            from .batching import BatchScheduler

            self.scheduler = BatchScheduler(self.worker, adapter, self.batch_width,
                                            int(getattr(settings, "max_batched_tokens", 64)),
                                            on_finish=self._batched_done,
                                            prefill_chunk=int(getattr(settings, "batch_prefill_chunk", 64)),
                                            on_step=self.metrics.batch)
        self._exactness: Optional[str] = None
        self._memory: Optional[str] = None
        self.calibration = Calibration(adapter, self.worker, self.path, getattr(settings, "costs_dir", None),
                                       self.max_depth, log=log,
                                       max_batch=self.batch_width)
        # Conversations' snapshots after their replies (webapp/serving/history.py).
        self.histories = HistorySnapshots(adapter, self.prefix_cache, self.worker,
                                          float(getattr(settings, "history_grace_s", 0.0)))

    @property
    def exactness(self) -> str:
        """Which exactness this machine gives (core/exactness.py), measured on the model thread
        the first time it is asked for (the start-up banner): greedy MTP against AR, batched
        replies against alone, each bit for bit or up to ties."""
        if self._exactness is None:
            from core.exactness import probe

            widths = tuple(range(2, min(self.max_depth, 7) + 2))   # every verify a reply may run
            try:
                self._exactness = self.worker.call(lambda: probe(self.adapter, widths).describe())
            except Exception as exc:  # noqa: BLE001 - a probe failure must not stop the app
                self._exactness = f"not measured ({type(exc).__name__}: {exc})"
        return self._exactness

    @property
    def memory(self) -> str:
        """What a conversation's caches cost (core/memory.py), measured on the model thread the
        first time it is asked for (the start-up banner)."""
        if self._memory is None:
            from core.memory import footprint

            try:
                self._memory = self.worker.call(lambda: footprint(self.adapter).describe(self.context_length))
            except Exception as exc:  # noqa: BLE001 - a probe failure must not stop the app
                self._memory = f"not measured ({type(exc).__name__}: {exc})"
        return self._memory

    def _disk_cache(self, log: Callable[[str], None]):
        """The prefix cache's disk store (settings cache_dir, disk_cache_mb, disk_cache_ttl_hours),
        or None: off, or no checkpoint folder to tie the entries to."""
        from core.disk_cache import DiskCache, default_dir, model_identity

        where = getattr(self.settings, "cache_dir", "")
        mb = int(getattr(self.settings, "disk_cache_mb", 0) or 0)
        if where == "" or mb <= 0 or self.path is None:
            return None
        # Whatever decides a snapshot's numbers: the checkpoint, tokenizer, compute dtype, hidden
        # variant and backend are all in describe(); a change of any starts a folder of its own.
        identity = model_identity(self.path, [self.description])
        return DiskCache(default_dir() if where is None else where, identity, mb * 2**20,
                         float(getattr(self.settings, "disk_cache_ttl_hours", 0) or 0) * 3600, say=log)

    def _in_idle_time(self, write: Callable[[], int]) -> None:
        self.worker.in_idle_time(write() for _ in range(1))   # one slice: the writes waiting now

    def flush_cache(self, timeout: float = 10.0) -> None:
        """At shutdown: the conversations' snapshots still in their grace taken now (a restart's
        next turn then prefills only its new message), and every snapshot written to disk."""
        if self.prefix_cache is not None and self.prefix_cache.disk is not None:
            self.histories.now()
            self.histories.wait(timeout)
            self.worker.later(self.prefix_cache.flush, timeout).result(2 * timeout)

    def preload(self) -> Tuple[int, int, int]:
        """At start-up, after the warm-up: the newest disk snapshots into memory, then a turn after
        the newest rehearsed (core.stream.rehearse: a restart's next turn then runs warm).
        Returns (snapshots, bytes, tokens rehearsed)."""
        if self.prefix_cache is None or self.prefix_cache.disk is None:
            return 0, 0, 0
        from core.stream import rehearse

        def run():
            n, nbytes = self.prefix_cache.preload()
            snap = self.prefix_cache.newest()
            return n, nbytes, rehearse(self.adapter, snap) if n and snap is not None else 0
        return self.worker.call(run)

    @classmethod
    def load(cls, path, settings, log: Callable[[str], None] = print, load=None) -> "ModelHost":
        """`load(path, settings=, log=)` -> adapter, on the model thread: load_adapter, or rank 0's
        part of a pipeline (webapp/serving/distributed.py)."""
        from adapters import load_adapter

        path = Path(path)
        log(f"Loading model from {path} ...")
        t0 = time.perf_counter()
        worker = ModelWorker()   # the model lives on its own thread (see worker.py)
        adapter = worker.call(load or load_adapter, path, settings=settings, log=log)
        log(f"Loaded in {time.perf_counter() - t0:.1f} s")
        return cls(adapter, settings, path, worker, log=log)

    # --- decoding -----------------------------------------------------------------
    def decoder(self, mode: str, params: RunParams, constraint=None):
        from core import AutoregressiveDecoder, SpeculativeDecoder

        sampler = params.sampler()
        if mode == "ar":
            return AutoregressiveDecoder(self.adapter, sampler=sampler, seed=params.seed,
                                         prefix_cache=self.prefix_cache, constraint=constraint)
        return SpeculativeDecoder(self.adapter, sampler=sampler, seed=params.seed, depth=params.depth,
                                  max_depth=self.max_depth, prefix_cache=self.prefix_cache, constraint=constraint)

    def stream(self, mode: str, params: RunParams, prompt_ids, stop=None, stop_strings=(),
               thinking: Optional[bool] = None, constraint=None, logprobs: Optional[int] = None,
               source: str = "chat") -> WorkerStream:
        """The engine's event stream for one reply, stepped on the model thread. `prompt_ids`:
        what prompt_ids / fit return (keeps the prefix-cache marks) or plain ids; `thinking`:
        the reply starts inside a think block (None: find out from the prompt); `constraint`:
        a core.Constraint (structured output); `logprobs`: events carry their tokens'
        log-probabilities with this many alternatives; `source` ("chat", "race", "api") labels
        the decode in /metrics, counted once when it ends."""
        if thinking is None:
            thinking = self.opens_thinking(prompt_ids)
        self.histories.drop_within(prompt_ids)
        if mode == "mtp" and params.depth == "auto":
            # Never measured inside a request: this one decodes with what is known, the rest in idle time.
            self.calibration.when_idle(len(getattr(prompt_ids, "ids", prompt_ids)))
        if self.scheduler is not None and source != "race":
            # Decoded with whoever else is being served (webapp/serving/batching.py); the race runs alone.
            import threading

            stop = stop or threading.Event()
            stream = self.scheduler.submit(self.decoder(mode, params, constraint), prompt_ids, params.max_tokens,
                                           stop=stop, stop_strings=stop_strings, thinking=thinking,
                                           logprobs=logprobs, think_end=self.reasoning.close)
            stream.seq.source, stream.seq.depth_setting = source, params.depth
            return stream
        stream = self.worker.stream(lambda: self._counted(self.decoder(mode, params, constraint).stream(
            prompt_ids, max_tokens=params.max_tokens, stop=stop, stop_strings=stop_strings, thinking=thinking,
            logprobs=logprobs, think_end=self.reasoning.close), params.depth, source))
        stream.stop_event = stop
        return stream

    def _batched_done(self, seq, ev) -> None:
        self.metrics.observe(ev.stats, depth=getattr(seq, "depth_setting", None),
                             source=getattr(seq, "source", "api"))

    def _counted(self, events, depth, source: str):
        """The events, and the decode counted in the metrics when it ends: at its last event, or
        when its reader closes it early (then its finish reason is 'unknown')."""
        stats = None
        try:
            for ev in events:
                stats = ev.stats
                yield ev
                if ev.finished:
                    return
        finally:
            if stats is not None:
                self.metrics.observe(stats, depth=depth, source=source)

    def remember(self, messages: List[dict], *, tools=None, enable_thinking: Optional[bool] = None) -> None:
        """After a reply: the conversation, reply included, rendered as the next turn's prompt
        will begin, snapshotted when nobody is waiting (webapp/serving/history.py); the next
        turn then prefills only its new message."""
        if self.prefix_cache is None:
            return
        from core import history_prompt

        if enable_thinking is None:
            enable_thinking = getattr(self.settings, "thinking", None)
        try:
            history = history_prompt(self.adapter, messages, tools=tools,
                                     enable_thinking=enable_thinking if self.has_thinking else None)
        except Exception:  # noqa: BLE001 - a history the template refuses is simply not cached
            return
        if len(history.ids) + 1 < self.context_length:
            self.histories.remember(history)

    def constraint(self, grammar):
        """A fresh core.Constraint for `grammar` (a grammar, or a function of the tokenizer that
        gives one); raises core.GrammarError saying why it cannot be used."""
        from core import Constraint

        if callable(grammar):
            grammar = grammar(self.tokenizer)
        return Constraint(self.tokenizer, grammar, self.adapter.vocab_size)

    def lazy_constraint(self, grammar):
        """A core.constraints.Triggered for `grammar` (a function of the tokenizer giving a
        core.constraints.Lazy), or None where it cannot be held: its trigger is not one token,
        or the grammar library refuses it (then the reply goes as it would without)."""
        from core import GrammarError
        from core.constraints import held

        try:
            return held(self.tokenizer, grammar(self.tokenizer), self.adapter.vocab_size)
        except GrammarError:   # the call's schema cannot compile
            return None

    def prompt_logprobs(self, ids, top: int) -> list:
        """Each prompt token's log-probability (the first has none), from one forward on the model thread."""
        from core import prompt_logprobs

        return self.worker.call(prompt_logprobs, self.adapter, list(ids), top)

    def cache_prompt(self, prompt, stop=None) -> int:
        """Put all but the prompt's last token into the prefix cache (on the model thread), so
        that lanes started on it next (the race's) start from the same state; returns the
        tokens cached (0 without a prefix cache)."""
        if self.prefix_cache is None:
            return 0
        from core.stream import as_prompt, cache_prompt

        return self.worker.call(cache_prompt, self.adapter, as_prompt(prompt), self.prefix_cache, stop)

    def opens_thinking(self, prompt_ids) -> bool:
        """Does the prompt end inside a think block (the template opened it for the reply)?"""
        from core import opens_thinking

        ids = list(getattr(prompt_ids, "ids", prompt_ids))
        return self.has_thinking and opens_thinking(self.tokenizer.decode(ids[-16:]), self.reasoning)

    def fit(self, messages: List[dict], max_tokens: int, *, trim: bool = True, tools=None,
            enable_thinking: Optional[bool] = None):
        """The conversation fitted to the context (core.limits.fit_chat): .prompt, .dropped, .notice.
        Raises core.ContextError (or its InputTooLarge) with a message for the user."""
        from core import fit_chat

        if enable_thinking is None:
            enable_thinking = getattr(self.settings, "thinking", None)
        return fit_chat(self.adapter, messages, max_tokens, trim=trim, tools=tools,
                        enable_thinking=enable_thinking if self.has_thinking else None, cap=self.context_length)

    def too_long(self, text: str) -> Optional[str]:
        """A message for the user when `text` alone could never fit the context (checked before
        it is queued or tokenised), else None."""
        from core.limits import CHARS_PER_TOKEN

        budget = self.context_length * CHARS_PER_TOKEN
        if len(text) <= budget:
            return None
        return (f"This message is {len(text):,} characters; the model's context of {self.context_length:,} "
                f"tokens holds about {budget:,}. Shorten it or split it into several messages.")

    def prompt_ids(self, messages: List[dict], *, max_tokens: Optional[int] = None, tools=None,
                   enable_thinking: Optional[bool] = None):
        """The prompt for the next reply, refused (core.ContextError) rather than trimmed when it
        does not fit. A core.Prompt: `.ids` are the tokens, its marks feed the prefix cache."""
        return self.fit(messages, max_tokens or 1, trim=False, tools=tools, enable_thinking=enable_thinking).prompt

    def warmup(self, params: RunParams, tokens: int = 32, log: Callable[[str], None] = print) -> None:
        """Short AR and MTP generations that compile/cache kernels, then one AR reply measured
        warm for the chat's AR reference at the default sampler."""
        ids = self.prompt_ids([{"role": "user", "content": WARMUP_PROMPT}])
        t0 = time.perf_counter()
        from core import prepare_tokenizer

        prepare_tokenizer(self.tokenizer)   # grammars' view of the vocabulary: not in the first tool request
        prepare = getattr(self.adapter, "prepare_kernels", None)   # a GPU's long-context and batch kernels
        if prepare is not None:
            self.worker.call(lambda: prepare(range(2, self.max_depth + 2), self.batch_width))
        for mode in ("ar", "mtp"):
            self.worker.call(lambda: self.decoder(mode, params).generate(ids, max_tokens=tokens))
        ref = self.prompt_ids([{"role": "user", "content": LONG_REPLY_PROMPT}])
        _, stats = self.worker.call(lambda: self.decoder("ar", params).generate(ref, max_tokens=2 * tokens))
        self.note_ar_speed(params, len(ref), stats.tokens_per_second, stats.generated_tokens)
        # The cost model ('auto', and the predicted speed-up of fixed depths): saved, or measured now.
        t1 = time.perf_counter()
        if self.calibration.needed(64):
            log(f"Warm-up: replies done in {t1 - t0:.1f} s; measuring the cost model ...")
        measured = self.calibration.measure_now(64)
        log(f"Warm-up done in {time.perf_counter() - t0:.1f} s (AR {stats.tokens_per_second:.1f} tok/s"
            + (f"; the cost model measured in {time.perf_counter() - t1:.1f} s)" if measured else ")"))

    # --- the AR speed the chat's speedup estimate compares against (webapp/serving/ar_reference.py) --
    def note_ar_speed(self, params: RunParams, prompt_tokens: int, tokens_per_second: float, tokens: int) -> None:
        self.ar_references.note(params, prompt_tokens, tokens_per_second, tokens)

    def ar_reference(self, params: RunParams, prompt_tokens: int, reply_tokens: int) -> Optional[Reference]:
        return self.ar_references.get(params, prompt_tokens, reply_tokens)
