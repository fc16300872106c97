"""OpenAI-compatible routes on the app's own server, beside the web UI.

``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models``, ``GET /health``, and
``GET /metrics`` (Prometheus text, webapp/metrics.py) under the same rules as ``/v1``: it tells
what the server decoded, which is as private as the API itself.
Decodes go through ``host.stream`` like the UI's replies: the same model thread, the same
prefix cache. Every refusal is a 4xx in OpenAI's error shape (``api_errors``); a client
that disconnects, a stop sequence or shutdown ends the decode within one cycle.
"""
from __future__ import annotations

import contextlib
import secrets
import time
from dataclasses import dataclass
from urllib.parse import urlsplit
from typing import AsyncIterator, Callable, List, Optional

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, Response, StreamingResponse

from .api_decode import DecodeJob, Piece, Turns
from .api_errors import ApiError, error_body, error_response
from .api_format import DONE, KEEPALIVE, Reply, figures, finish_reason, sse, usage
from .api_prompt import chat_prompt, completion_prompt
from .api_request import ApiRequest, loads, parse_chat, parse_completion
from .api_text import ReplyShaper
from .metrics import CONTENT_TYPE as METRICS_TYPE
from .netinfo import is_loopback
from .stops import StopRegistry

MAX_BODY = 4 * 1024 * 1024          # bytes; a chat's text limit is the engine's (InputTooLarge)
KEEPALIVE_SECONDS = 5.0
TICK = 0.25                         # how often a waiting request looks at its client
ROUTES = {"/v1/chat/completions": "POST", "/v1/completions": "POST", "/v1/models": "GET"}


@dataclass
class ApiConfig:
    model_id: str
    enabled: bool = True
    api_key: Optional[str] = None
    off_reason: str = ""
    keepalive: float = KEEPALIVE_SECONDS
    max_body: int = MAX_BODY
    log: Callable[[str], None] = lambda line: None


def model_id_of(host) -> str:
    path = getattr(host, "path", None)
    return path.name if path is not None and path.name else "mtp-chat"


class OpenAIApi:
    def __init__(self, host, stops: StopRegistry, config: ApiConfig):
        self.host, self.stops, self.config = host, stops, config
        self.settings = host.settings
        self.turns = Turns()

    # --- gatekeeping -----------------------------------------------------------------------
    def authorize(self, request: Request) -> None:
        cfg = self.config
        if not cfg.enabled:
            raise ApiError(403, f"The API is off: {cfg.off_reason}", code="api_disabled")
        if cfg.api_key is None:
            return self.local_only(request)
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), cfg.api_key.encode()):
            raise ApiError(401, "Missing or wrong API key: send the header 'Authorization: Bearer KEY' with the "
                                "key the server was started with (--api-key).", code="invalid_api_key",
                           headers={"WWW-Authenticate": 'Bearer realm="mtp-chat"'})

    @staticmethod
    def local_only(request: Request) -> None:
        """Without a key the API is open only to programs on this machine: a web page cannot
        use the visitor's browser to reach it, neither by a cross-site request (its Origin is
        another site) nor by DNS rebinding (its Host is another name)."""
        host = urlsplit("//" + request.headers.get("host", "")).hostname or ""
        origin = request.headers.get("origin")
        if not is_loopback(host) or (origin is not None and not is_loopback(urlsplit(origin).hostname or "")):
            raise ApiError(403, "Without --api-key the API answers only programs on this machine (Host and Origin "
                                "127.0.0.1 or localhost); start the server with --api-key KEY to use it otherwise.",
                           code="local_only")

    async def read_body(self, request: Request) -> bytes:
        limit = self.config.max_body
        too_big = ApiError(413, f"The request body is larger than {limit // 1024} KiB.", code="request_too_large")
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            raise too_big
        parts, size = [], 0
        async for part in request.stream():
            size += len(part)
            if size > limit:
                raise too_big
            parts.append(part)
        return b"".join(parts)

    def check_model(self, model: Optional[str]) -> None:
        if model is not None and model != self.config.model_id:
            raise ApiError(404, f"The model '{model[:100]}' does not exist: this server serves "
                                f"'{self.config.model_id}'.", param="model", code="model_not_found")

    def refuse(self, request: Request, exc: ApiError) -> Response:
        client = request.client.host if request.client else "?"
        self.config.log(f"API {exc.status} {request.method} {request.url.path} from {client}: {exc.message[:200]}")
        return error_response(exc)

    # --- routes ----------------------------------------------------------------------------
    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def models(self, request: Request) -> Response:
        try:
            self.authorize(request)
        except ApiError as exc:
            return self.refuse(request, exc)
        created = int(self.host.path.stat().st_mtime) if getattr(self.host, "path", None) else 0
        return JSONResponse({"object": "list", "data": [
            {"id": self.config.model_id, "object": "model", "created": created, "owned_by": "mtp-chat"}]})

    async def metrics(self, request: Request) -> Response:
        try:
            self.authorize(request)
        except ApiError as exc:
            return self.refuse(request, exc)
        return Response(self.host.metrics.render(), media_type=METRICS_TYPE)

    async def read_request(self, request: Request, parse) -> ApiRequest:
        """Key, size, JSON, fields, model: the checks every completion request passes."""
        self.authorize(request)
        req = parse(loads(await self.read_body(request)), self.settings, self.host.max_depth, self.settings.max_tokens)
        self.check_model(req.model)
        return req

    async def chat_completions(self, request: Request) -> Response:
        try:
            req = await self.read_request(request, parse_chat)
            prompt, in_reasoning = await run_in_threadpool(chat_prompt, self.host, req)
        except ApiError as exc:
            return self.refuse(request, exc)
        shaper = ReplyShaper(req.stops, tools=bool(req.tools), reasoning=True, in_reasoning=in_reasoning)
        return await self.respond(request, Reply("chat", self.config.model_id), req, prompt, shaper, in_reasoning)

    async def completions(self, request: Request) -> Response:
        try:
            req = await self.read_request(request, parse_completion)
            ids = await run_in_threadpool(completion_prompt, self.host, req)
        except ApiError as exc:
            return self.refuse(request, exc)
        return await self.respond(request, Reply("text", self.config.model_id), req, ids, ReplyShaper(req.stops))

    async def unknown(self, request: Request) -> Response:
        path = request.url.path.rstrip("/")
        if path in ROUTES:
            exc = ApiError(405, f"{request.method} is not allowed on {path}: use {ROUTES[path]}.",
                           code="method_not_allowed")
        else:
            exc = ApiError(404, f"Unknown route {request.method} {path[:100]}: this server has "
                                f"{', '.join(ROUTES)} and /health.", code="unknown_url")
        return self.refuse(request, exc)

    # --- decoding ------------------------------------------------------------------------------
    async def respond(self, request: Request, reply: Reply, req: ApiRequest, prompt, shaper: ReplyShaper,
                      thinking: bool = False) -> Response:
        run = _Run(self, reply, req, prompt, shaper, thinking)
        if req.stream:
            return StreamingResponse(run.stream(), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            return JSONResponse(await run.whole(request))
        except ApiError as exc:
            return self.refuse(request, exc)
        except Exception as exc:   # noqa: BLE001 - the engine failed; the server goes on
            return self.refuse(request, ApiError(500, f"The decode failed: {type(exc).__name__}: {exc}",
                                                 code="decode_failed"))

    def router(self) -> APIRouter:
        r = APIRouter()
        r.add_api_route("/health", self.health, methods=["GET"], include_in_schema=False)
        r.add_api_route("/v1/models", self.models, methods=["GET"], include_in_schema=False)
        r.add_api_route("/metrics", self.metrics, methods=["GET"], include_in_schema=False)
        r.add_api_route("/v1/chat/completions", self.chat_completions, methods=["POST"], include_in_schema=False)
        r.add_api_route("/v1/completions", self.completions, methods=["POST"], include_in_schema=False)
        r.add_api_route("/v1/{rest:path}", self.unknown, include_in_schema=False,
                        methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"])
        r.add_api_route("/v1", self.unknown, include_in_schema=False,
                        methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"])
        return r


SHUTDOWN = "The server is shutting down: the reply was cut short."


class _Run:
    """One request's decode: waits for its turn, decodes, shapes the text into a reply."""

    def __init__(self, api: OpenAIApi, reply: Reply, req: ApiRequest, prompt, shaper: ReplyShaper,
                 thinking: bool):
        self.api, self.reply, self.req, self.prompt, self.shaper = api, reply, req, prompt, shaper
        self.thinking = thinking
        self.engine_reason: Optional[str] = None
        self.stats: Optional[dict] = None
        self.content: List[str] = []   # the answer as the client will send it back next turn

    def shape(self, text: str):
        deltas = self.shaper.feed(text)
        self.content += [t for kind, t in deltas if kind == "content"]
        return deltas

    async def pieces(self) -> AsyncIterator[Optional[Piece]]:
        """The decode's pieces; ``None`` every TICK while waiting (for the turn or a piece)."""
        api, key = self.api, f"api:{self.reply.id}"
        async with contextlib.aclosing(api.turns.take(TICK)) as waiting:
            async for _ in waiting:
                yield None
        stop = api.stops.claim(key)
        job = None
        try:
            if api.stops.closing:
                raise ApiError(503, SHUTDOWN, code="server_shutdown")
            job = DecodeJob(api.host, self.req.mode, self.req.params, self.prompt, stop, thinking=self.thinking,
                            on_done=api.turns.give_back)
            async for piece in job.events(TICK):
                if piece is not None and piece.finished:
                    self.engine_reason, self.stats = piece.finish_reason, piece.stats
                yield piece
                if self.shaper.stopped:
                    stop.set()              # a stop sequence: end the decode, show nothing more
        finally:
            stop.set()                      # no-op if it ended; else (client gone) end it within a cycle
            api.stops.release(key, stop)
            if job is None:
                api.turns.give_back()

    def cut_by_shutdown(self) -> bool:
        return self.engine_reason == "stopped" and not self.shaper.stopped and bool(self.api.stops.closing)

    def ending(self):
        deltas, calls = self.shaper.finish()
        self.content += [t for kind, t in deltas if kind == "content"]
        if self.reply.kind == "chat" and self.engine_reason in ("eos", "max_tokens", "stop_string", "stopped") \
                and not self.cut_by_shutdown():
            # The next turn's prompt will hold this reply: snapshot the conversation with it now
            # (idle time), so that turn prefills only its new messages.
            said = {"role": "assistant", "content": "".join(self.content)}
            if calls:
                said["tool_calls"] = [c.as_openai() for c in calls]
            self.api.host.remember(list(self.req.messages) + [said], tools=self.req.tools,
                                   enable_thinking=self.req.enable_thinking)
        finish = finish_reason(self.engine_reason, self.shaper.stopped, calls)
        mtp = figures(self.req.mode, self.req.params.depth, self.stats)
        return deltas, calls, finish, usage(len(self.prompt), self.stats), mtp

    async def whole(self, request: Request) -> dict:
        deltas, looked = [], time.monotonic()
        async with contextlib.aclosing(self.pieces()) as pieces:
            async for piece in pieces:
                if time.monotonic() - looked >= TICK:
                    looked = time.monotonic()
                    if await request.is_disconnected():   # closing pieces() stops the decode
                        raise ApiError(499, "The client went away.", code="client_closed")
                if piece is not None:
                    deltas += self.shape(piece.text)
        if self.cut_by_shutdown():
            raise ApiError(503, SHUTDOWN, code="server_shutdown")
        more, calls, finish, use, mtp = self.ending()
        return self.reply.whole(deltas + more, calls, finish, use, mtp)

    async def stream(self) -> AsyncIterator[bytes]:
        reply = self.reply
        if reply.kind == "chat":
            yield sse(reply.role_chunk())
        quiet_since = time.monotonic()
        try:
            async with contextlib.aclosing(self.pieces()) as pieces:
                async for piece in pieces:
                    if piece is None:
                        if time.monotonic() - quiet_since >= self.api.config.keepalive:
                            quiet_since = time.monotonic()
                            yield KEEPALIVE
                        continue
                    for delta in self.shape(piece.text):
                        quiet_since = time.monotonic()
                        yield sse(reply.delta_chunk(delta))
        except ApiError as exc:
            yield sse(error_body(exc.status, exc.message, code=exc.code))
            yield DONE
            return
        except Exception as exc:   # noqa: BLE001 - the engine failed: say so in the stream
            yield sse(error_body(500, f"The decode failed: {type(exc).__name__}: {exc}", code="decode_failed"))
            yield DONE
            return
        deltas, calls, finish, use, mtp = self.ending()
        for delta in deltas:
            yield sse(reply.delta_chunk(delta))
        if self.cut_by_shutdown():
            yield sse(error_body(503, SHUTDOWN, code="server_shutdown"))
            yield DONE
            return
        if calls:
            yield sse(reply.calls_chunk(calls))
        yield sse(reply.finish_chunk(finish, mtp))
        if self.req.include_usage:
            yield sse(reply.usage_chunk(use, mtp))
        yield DONE
