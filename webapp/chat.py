"""Chat tab event functions: submit, respond (streamed), stop, regenerate, undo, clear.

History is a list of ``{"role", "content", "metadata"?}`` messages (Gradio 6 messages
format, content as text blocks). Each reply is followed by a stats message: an assistant
message whose ``metadata.title`` carries the figures; such messages never reach the prompt.
Only text ever leaves these functions, so a crafted history cannot make the server serve
a file.
"""
from __future__ import annotations

import time
from typing import Any, Iterator, List, Optional, Tuple

import gradio as gr

from .inputs import clean_text, history_problem
from .model import ModelHost
from .params import ParamError, parse_params
from .refusals import refusal
from .render import THINKING_TITLE, reply_stats
from .stops import StopRegistry

UPDATE_INTERVAL = 0.1      # seconds between streamed UI updates (~10/s: the browser keeps up)
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
    """Text-only copy of a history as a client sent it (drops files and unknown roles)."""
    out: List[dict] = []
    for m in history or []:
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            continue
        msg = {"role": m["role"], "content": block(clean_text(text_of(m.get("content"))))}
        meta = m.get("metadata")
        if isinstance(meta, dict) and meta.get("title"):
            msg["metadata"] = {k: clean_text(meta[k]) if isinstance(meta[k], str) else meta[k]
                               for k in ("title", "status", "duration", "log", "id") if meta.get(k) is not None}
        out.append(msg)
    return out


def prompt_messages(history: List[dict], system_prompt: str) -> List[dict]:
    msgs = [{"role": "system", "content": system_prompt.strip()}] if system_prompt and system_prompt.strip() else []
    for m in history:
        if not is_stats(m):
            msgs.append({"role": m["role"], "content": text_of(m["content"])})
    return msgs


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
        self.update_interval = update_interval

    def key(self, request) -> str:
        return f"{session_of(request)}:chat"

    # --- checks before a reply: queued (only then do warnings reach the page), never behind
    # the model; a refusal raises, so the chain stops there and /respond never sees it ------
    def refused_message(self, message: str, request) -> Optional[Tuple[str, str]]:
        """(why, title) when Send must refuse ``message``; None when it may go."""
        if not message.strip():
            return "Type a message first.", "Nothing to send"
        if self.stops.busy(self.key(request)):
            return "A reply is still being generated: wait for it or press Stop.", "Busy"
        too_long = self.host.too_long(message)
        if too_long:   # refused here, before the queue: nobody waits behind it, nothing is lost
            return too_long, "Message too long"
        return None

    def check_message(self, message: str, request: gr.Request = None) -> None:
        refused = self.refused_message(clean_text(message), request)
        if refused:
            raise refusal(*refused, where="send", warn=True)

    def check_regenerate(self, history) -> None:
        if not until_last_question(clean_history(history)):
            raise refusal("Nothing to regenerate yet.", "Nothing to regenerate", where="regenerate", warn=True)

    # --- un-queued steps (instant) ---------------------------------------------------
    def submit(self, message: str, history, request: gr.Request = None) -> Tuple[str, List[dict]]:
        history, message = clean_history(history), clean_text(message)
        refused = self.refused_message(message, request)
        if refused:   # check_message let it through a moment ago, or a direct call
            raise refusal(*refused, where="submit")
        self.stops.arm(self.key(request))
        return "", history + [{"role": "user", "content": block(message)}]

    def prepare_regenerate(self, history, request: gr.Request = None) -> List[dict]:
        history = until_last_question(clean_history(history))
        if not history:
            raise refusal("Nothing to regenerate yet.", "Nothing to regenerate", where="regenerate")
        self.stops.arm(self.key(request))
        return history

    def undo(self, history) -> Tuple[List[dict], str]:
        """Remove the last exchange; its question goes back into the input box."""
        history = clean_history(history)
        last_user = max((i for i, m in enumerate(history) if m["role"] == "user"), default=None)
        if last_user is None:
            return [], ""
        return history[:last_user], text_of(history[last_user]["content"])

    def clear(self) -> Tuple[List[dict], str]:
        return [], ""

    def clear_and_stop(self, request: gr.Request = None) -> Tuple[List[dict], str]:
        self.stop(request)
        return self.clear()

    def stop(self, request: gr.Request = None) -> None:
        self.stops.stop(self.key(request))

    # --- the queued, model-using step ------------------------------------------------
    def respond(self, history, mode, system_prompt, temperature, top_p, top_k, min_p,
                max_tokens, seed, depth, thinking=None, request: gr.Request = None) -> Iterator[List[dict]]:
        """Stream the assistant's reply to the conversation, whose last message is the user's."""
        problem = history_problem(history, text_of)     # as the client sent it
        history, system_prompt = clean_history(history), clean_text(system_prompt)
        key = self.key(request)
        stop = self.stops.claim(key)
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

            try:
                fitted = self.host.fit(prompt_messages(history, system_prompt), params.max_tokens,
                                       enable_thinking=None if thinking is None else bool(thinking))
            except ContextError as exc:
                yield history + [assistant(str(exc), title="⚠️ too long for the model's context")]
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
                    yield history + reply.messages()
            text = reply.answer
            out = history + reply.messages()
            if stats is not None:
                s = stats.as_dict()
                context = len(fitted.prompt.ids)
                if mode == "ar" and s.get("finish_reason") != "stopped":
                    self.host.note_ar_speed(params, context, s.get("tokens_per_second", 0.0), s.get("generated_tokens", 0))
                title, details = reply_stats(s, mode, self.host.ar_reference(params, context), params.depth)
                out.append(assistant(details, title=title, duration=round(s.get("compute_seconds") or 0.0, 3)))
            if self.stops.closing:   # Ctrl+C / SIGTERM on the server (webapp/server.py)
                out.append(assistant(self.stops.closing, title="⏹ server shutting down"))
            elif text and not fitted.dropped:   # the next turn then prefills only its new message
                self.host.remember(prompt_messages(out, system_prompt),
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
            self.stops.release(key, stop)
