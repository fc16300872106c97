"""Chat tab event functions: submit, respond (streamed), stop, regenerate, undo, clear.

History is a list of ``{"role", "content", "metadata"?}`` messages (Gradio 6 messages
format, content as text blocks). Each reply is followed by a stats message: an assistant
message whose ``metadata.title`` carries the figures; such messages never reach the prompt.
Only text ever leaves these functions, and a user's pictures as file blocks whose paths lie in
Gradio's upload folder (webapp/ui/pictures.py), so a crafted history cannot make the server serve
or read any other file.
"""
from __future__ import annotations

import contextlib
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple

import gradio as gr

from . import pictures
from ..serving.inputs import clean_text, history_problem
from ..serving.model import ModelHost
from ..serving.params import ParamError, parse_params
from .refusals import refusal
from .render import THINKING_TITLE, reply_stats
from ..serving.stops import StopRegistry

UPDATE_INTERVAL = 0.1      # seconds between streamed UI updates (~10/s: the browser keeps up)
# How long Clear/Undo's settle step waits for the reply they withdrew to end: a stop lands within a
# token or a prefill chunk, seconds at worst on a busy CPU; past this the page is left as it is.
SETTLE_SECONDS = 30.0
MODES = {"mtp": "mtp", "ar": "ar", "mtp (speculative)": "mtp", "ar (plain)": "ar"}


def text_of(content: Any) -> str:
    """Flatten message content (str, text blocks, a dict block) to plain text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        return str(content.get("text", "")) if content.get("type", "text") == "text" else ""
    if isinstance(content, (list, tuple)):
        return "".join(text_of(c) for c in content)
    return ""


def block(text: str) -> List[dict]:
    return [{"type": "text", "text": text}]


def assistant(text: str, title: Optional[str] = None, duration: Optional[float] = None) -> dict:
    """An assistant message; with a title it is a stats/notice message (never prompted)."""
    msg = {"role": "assistant", "content": block(text)}
    if title:
        msg["metadata"] = {"title": title, "status": "done"}
        if duration is not None:
            msg["metadata"]["duration"] = duration
    return msg


def is_stats(msg: dict) -> bool:
    meta = msg.get("metadata") or {}
    return bool(meta.get("title"))


def clean_history(history: Optional[List[Any]]) -> List[dict]:
    """A history as a client sent it, made safe: text, and a user's pictures only where they are
    files this page uploaded (drops other files and unknown roles)."""
    out: List[dict] = []
    for m in history or []:
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            continue
        files = pictures.picture_paths(m.get("content")) if m["role"] == "user" else []
        msg = {"role": m["role"], "content": [pictures.file_block(p) for p in files]
               + block(clean_text(text_of(m.get("content"))))}
        meta = m.get("metadata")
        if isinstance(meta, dict) and meta.get("title"):
            msg["metadata"] = {k: clean_text(meta[k]) if isinstance(meta[k], str) else meta[k]
                               for k in ("title", "status", "duration", "log", "id") if meta.get(k) is not None}
        out.append(msg)
    return out


def prompt_messages(history: List[dict], system_prompt: str, picture=None) -> List[dict]:
    """The messages the model reads; `picture(path)` -> a core.images.Picture puts a user's
    pictures before their text (None: the text alone)."""
    msgs = [{"role": "system", "content": system_prompt.strip()}] if system_prompt and system_prompt.strip() else []
    for m in history:
        if is_stats(m):
            continue
        paths = pictures.picture_paths(m["content"]) if picture is not None and m["role"] == "user" else []
        if paths:
            msgs.append({"role": m["role"], "content": [{"type": "image", "picture": picture(p)} for p in paths]
                         + [{"type": "text", "text": text_of(m["content"])}]})
        else:
            msgs.append({"role": m["role"], "content": text_of(m["content"])})
    return msgs


def message_parts(message: Any) -> Tuple[str, List[str]]:
    """(text, file paths) of what the chat box sends: a string, or the multimodal box's
    {"text", "files"} (each file a path or Gradio's {"path": ...})."""
    if isinstance(message, dict):
        files = [f.get("path") if isinstance(f, dict) else f for f in message.get("files") or []]
        return clean_text(message.get("text")), [f for f in files if isinstance(f, str)]
    return clean_text(message), []


class Reply:
    """A streamed reply split into its thinking (a collapsible section) and its answer."""

    def __init__(self, thinking: bool, markers=None):
        from core import THINK, ThinkSplitter   # core imports mlx: not at import time (BLAS preload first)

        self.splitter = ThinkSplitter(inside=thinking, markers=markers or THINK)
        self.reasoning, self.answer, self.done = "", "", False

    def feed(self, text: str, finished: bool = False) -> None:
        for kind, piece in self.splitter.feed(text) + (self.splitter.flush() if finished else []):
            if kind == "reasoning":
                self.reasoning += piece
            else:
                self.answer += piece
        self.done = finished

    def messages(self) -> List[dict]:
        out = []
        if self.reasoning:
            thinking_now = self.splitter.inside and not self.done
            msg = assistant(self.reasoning.strip(), title=THINKING_TITLE)
            msg["metadata"]["status"] = "pending" if thinking_now else "done"
            out.append(msg)
        if self.answer or not out:
            out.append(assistant(self.answer))
        return out


def sharing(stream) -> List[dict]:
    """While a reply decodes in a batch (webapp/serving/batching.py), a line that says with how many
    others: where a request that waits its turn would show its queue position."""
    n = getattr(stream, "batched_with", 0)
    if not n:
        return []
    msg = assistant("", title=f"👥 batched with {n} other{'s' if n > 1 else ''}")
    msg["metadata"]["status"] = "pending"
    return [msg]


def until_last_question(history: List[dict]) -> List[dict]:
    """The history up to and including its last user message ([] if it has none)."""
    last = max((i for i, m in enumerate(history) if m["role"] == "user"), default=-1)
    return history[:last + 1]


def session_of(request: Optional[gr.Request]) -> str:
    return getattr(request, "session_hash", None) or "local"


class ChatHandlers:
    def __init__(self, host: ModelHost, stops: StopRegistry, update_interval: float = UPDATE_INTERVAL):
        self.host = host
        self.stops = stops
        self.settled: Dict[str, Tuple[Any, List[dict]]] = {}   # session -> (withdrawn reply, what to show)
        self.taken_back: set = set()   # sessions whose last reply Clear/Undo took back (its save is theirs)
        self.update_interval = update_interval

    def key(self, request) -> str:
        return f"{session_of(request)}:chat"

    @property
    def multimodal(self) -> bool:
        """The chat box takes pictures (the model has a vision tower)."""
        return getattr(self.host.adapter, "vision", None) is not None

    def box(self, text: str = ""):
        """The chat box's value holding `text`."""
        return {"text": text, "files": []} if self.multimodal else text

    def picture_loader(self):
        """Reads a history's pictures (each file once per reply)."""
        seen = {}

        def load(path):
            if path not in seen:
                seen[path] = pictures.read(path, self.host.settings.image_max_bytes)
            return seen[path]
        return load

    # --- checks before a reply: queued (only then do warnings reach the page), never behind
    # the model; a refusal raises, so the chain stops there and /respond never sees it ------
    def refused_message(self, message: str, request, files=()) -> Optional[Tuple[str, str]]:
        """(why, title) when Send must refuse ``message`` (with pictures `files`); None when it may go."""
        if not message.strip() and not files:
            return "Type a message first.", "Nothing to send"
        if files:
            from core.chat import NO_TOWER
            from core.images import ImageError

            if not self.multimodal:
                return ImageError(NO_TOWER).sentence(), "Picture refused"
            try:
                pictures.checked(list(files), self.host.settings)
            except ImageError as exc:
                return f"{exc.sentence()} Pictures: {pictures.limits_text(self.host)}.", "Picture refused"
        if self.stops.busy(self.key(request)):
            return "A reply is still being generated: wait for it or press Stop.", "Busy"
        too_long = self.host.too_long(message)
        if too_long:   # refused here, before the queue: nobody waits behind it, nothing is lost
            return too_long, "Message too long"
        return None

    def check_message(self, message, request: gr.Request = None) -> None:
        text, files = message_parts(message)
        refused = self.refused_message(text, request, files)
        if refused:
            raise refusal(*refused, where="send", warn=True)

    def check_regenerate(self, history) -> None:
        if not until_last_question(clean_history(history)):
            raise refusal("Nothing to regenerate yet.", "Nothing to regenerate", where="regenerate", warn=True)

    # --- un-queued steps (instant) ---------------------------------------------------
    def submit(self, message, history, request: gr.Request = None) -> Tuple[Any, List[dict]]:
        history, (message, files) = clean_history(history), message_parts(message)
        refused = self.refused_message(message, request, files)
        if refused:   # check_message let it through a moment ago, or a direct call
            raise refusal(*refused, where="submit")
        self.arm(request)
        return self.box(), history + [{"role": "user", "content": [pictures.file_block(f) for f in files]
                                       + block(message)}]

    def prepare_regenerate(self, history, request: gr.Request = None) -> List[dict]:
        history = until_last_question(clean_history(history))
        if not history:
            raise refusal("Nothing to regenerate yet.", "Nothing to regenerate", where="regenerate")
        self.arm(request)
        return history

    def arm(self, request) -> None:
        """A new reply: Stop from now on stops it, and a Clear/Undo before it has nothing left to settle."""
        key = self.key(request)
        self._nothing_withdrawn(key)
        self.stops.arm(key)

    def undo(self, history) -> Tuple[List[dict], str]:
        """Remove the last exchange; its question goes back into the input box."""
        history = clean_history(history)
        last_user = max((i for i, m in enumerate(history) if m["role"] == "user"), default=None)
        if last_user is None:
            return [], self.box()
        return history[:last_user], self.box(text_of(history[last_user]["content"]))

    def undo_and_stop(self, history, request: gr.Request = None) -> Tuple[List[dict], str]:
        """Undo that also ends a reply still streaming: that reply is the exchange it removes."""
        history, box = self.undo(history)
        self.take_back(request, history)
        return history, box

    def clear(self) -> Tuple[List[dict], Any]:
        return [], self.box()

    def clear_and_stop(self, request: gr.Request = None) -> Tuple[List[dict], str]:
        self.take_back(request, [])
        return self.clear()

    def withdraw(self, request: gr.Request = None) -> None:
        """The chatbot's own trash icon (it empties itself): end and take back the reply in flight."""
        self.take_back(request, [])

    def take_back(self, request, history: List[dict]) -> None:
        """Withdraw the reply in flight, if any: it shows nothing more, and `settle` puts back
        `history` once it has ended."""
        key = self.key(request)
        withdrawn = self.stops.stop(key, take_back=True)
        if withdrawn is not None:
            self.settled[key] = (withdrawn, history)

    def settle(self, request: gr.Request = None):
        """Queued after Clear and Undo. A reply's updates travel the page's event stream, Clear's
        answer its own request, so on a busy server a reply's update sent before the stop can land
        after Clear and bring the conversation back. This step waits for the withdrawn reply to
        end and answers on the same stream, after the reply's last update."""
        key = self.key(request)
        withdrawn, history = self.settled.get(key, (None, None))
        if withdrawn is None:
            return gr.skip()
        deadline = time.monotonic() + SETTLE_SECONDS
        while self.stops.holds(key, withdrawn) and time.monotonic() < deadline:
            time.sleep(0.02)
        # Late (a busy server) after a newer reply began, or a newer Clear/Undo: setting the chat
        # now would cut into that reply's stream (its updates are diffs of what it sent last).
        if self.settled.get(key, (None,))[0] is not withdrawn or self.stops.busy(key):
            return gr.skip()
        self.settled.pop(key, None)
        return history

    def forget(self, request) -> None:
        """Tab closed (the page's unload): no settle step comes for its withdrawn reply any more."""
        self._nothing_withdrawn(self.key(request))

    def _nothing_withdrawn(self, key: str) -> None:
        self.settled.pop(key, None)
        self.taken_back.discard(key)

    def save_reply(self, history, request: gr.Request = None):
        """What the page saves after a reply: the chat, unless Clear or Undo took the reply back.
        Then their own save (after `settle`) is the one that counts; this one, asked for when the
        reply ended, could carry the withdrawn exchange and land last (CI, 2026-12-03)."""
        key = self.key(request)
        if key in self.taken_back:
            self.taken_back.discard(key)
            return gr.skip()
        return history

    def stop(self, request: gr.Request = None) -> None:
        self.stops.stop(self.key(request))

    # --- the queued, model-using step ------------------------------------------------
    def respond(self, history, mode, system_prompt, temperature, top_p, top_k, min_p,
                max_tokens, seed, depth, thinking=None, request: gr.Request = None) -> Iterator[List[dict]]:
        """Stream the assistant's reply to the conversation, whose last message is the user's."""
        # as the client sent it; with a tower a message may be a picture alone
        problem = history_problem(history, (lambda c: text_of(c) or ("(picture)" if pictures.picture_paths(c) else ""))
                                  if self.multimodal else text_of)
        key = self.key(request)
        stop = self.stops.claim(key)
        try:
            with contextlib.closing(self._reply(stop, problem, history, mode, system_prompt, temperature, top_p,
                                                top_k, min_p, max_tokens, seed, depth, thinking)) as updates:
                for update in updates:
                    if stop.withdrawn:     # Clear or Undo took this reply back: show nothing more
                        return
                    yield update
        finally:
            if stop.withdrawn:
                self.taken_back.add(key)
            self.stops.release(key, stop)

    def _reply(self, stop, problem, history, mode, system_prompt, temperature, top_p, top_k, min_p,
               max_tokens, seed, depth, thinking) -> Iterator[List[dict]]:
        history, system_prompt = clean_history(history), clean_text(system_prompt)
        text, stats, stream, reply = "", None, None, None
        try:
            try:
                params = parse_params(temperature, top_p, top_k, min_p, max_tokens, seed, depth,
                                      max_depth=self.host.max_depth)
            except ParamError as exc:
                raise refusal(str(exc), "Invalid setting", where="/respond") from None
            mode = MODES.get(str(mode or "mtp").strip().lower())
            if mode is None:
                raise refusal("Mode must be 'mtp' or 'ar'.", "Invalid setting", where="/respond")
            if problem:
                raise refusal(problem, "Invalid history", where="/respond")
            if stop.is_set():     # stopped while waiting in the queue
                yield history + [assistant("(stopped before it started)", title="⏹ stopped")]
                return
            from core import ContextError
            from core.images import ImageError

            load = self.picture_loader() if self.multimodal else None
            try:
                fitted = self.host.fit(prompt_messages(history, system_prompt, load), params.max_tokens,
                                       enable_thinking=None if thinking is None else bool(thinking))
            except ContextError as exc:
                yield history + [assistant(str(exc), title="⚠️ too long for the model's context")]
                return
            except ImageError as exc:   # a picture gone from the upload folder, or one the limits refuse
                yield history + [assistant(f"{exc.sentence()} Pictures: {pictures.limits_text(self.host)}.",
                                           title="⚠️ picture refused")]
                return
            if fitted.notice:
                history = history + [assistant(fitted.notice, title="ℹ️ older messages left out")]
            reply = Reply(self.host.opens_thinking(fitted.prompt), self.host.reasoning)
            stream = self.host.stream(mode, params, fitted.prompt, stop=stop, thinking=reply.splitter.inside,
                                      source="chat")
            last = 0.0
            for ev in stream:
                reply.feed(ev.text, ev.finished)
                stats = ev.stats
                now = time.monotonic()
                if not ev.finished and now - last >= self.update_interval:
                    last = now
                    yield history + reply.messages() + sharing(stream)
            text = reply.answer
            out = history + reply.messages()
            if stats is not None:
                s = stats.as_dict()
                context = len(fitted.prompt.ids)
                if mode == "ar" and s.get("finish_reason") != "stopped":
                    self.host.note_ar_speed(params, context, s.get("tokens_per_second", 0.0), s.get("generated_tokens", 0))
                reference = self.host.ar_reference(params, context, s.get("generated_tokens", 0))
                title, details = reply_stats(s, mode, reference, params.depth,
                                             batched_with=getattr(stream, "most_batched_with", 0))
                out.append(assistant(details, title=title, duration=round(s.get("compute_seconds") or 0.0, 3)))
            if self.stops.closing:   # Ctrl+C / SIGTERM on the server (webapp/server.py)
                out.append(assistant(self.stops.closing, title="⏹ server shutting down"))
            elif text and not fitted.dropped:   # the next turn then prefills only its new message
                self.host.remember(prompt_messages(out, system_prompt, load),
                                   enable_thinking=None if thinking is None else bool(thinking))
            yield out
        except gr.Error:
            raise
        except Exception as exc:   # the request fails, the app keeps serving
            gr.Warning(f"Generation failed: {exc}")
            text = reply.answer if reply is not None else text
            yield history + ([assistant(text)] if text else []) + [
                assistant(f"{type(exc).__name__}: {exc}", title="⚠️ error")]
        finally:
            if stream is not None:
                stream.close()
