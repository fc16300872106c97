"""The API routes on the app's own server, beside the web UI: OpenAI chat and completions,
Anthropic Messages, OpenAI Responses.

``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models`` (and
``/v1/models/{id}``), ``POST /v1/messages`` (and ``/count_tokens``), ``POST /v1/responses``,
``GET|HEAD /health``, and ``GET /metrics``
(Prometheus text, webapp/serving/metrics.py) under the same rules as ``/v1``: it tells what the
server decoded, which is as private as the API itself. Decodes go through ``host.stream`` like the UI's replies: the same model
thread, the same prefix cache, one at a time (api.run.Run). Every refusal is a 4xx in the
route's own error shape (OpenAI's, or Anthropic's on /v1/messages); a client that
disconnects, a stop sequence or shutdown ends the decode within one cycle.
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import AsyncIterator, Callable, Optional, Tuple

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, Response, StreamingResponse

from core.limits import MAX_BODY_BYTES

from ..netinfo import hostname_of, is_loopback
from ..serving.metrics import CONTENT_TYPE as METRICS_TYPE
from ..serving.stops import StopRegistry
from .anthropic import MessageWriter, anthropic_error, context_refusal, count_body
from .anthropic_request import parse_messages_request
from .decode import Turns
from .errors import ApiError, decode_failure, error_body, error_response
from .format import DONE, KEEPALIVE, Reply, chat_logprobs, completion_logprobs, sse
from .openai_request import parse_chat, parse_completion
from .prompt import chat_prompt, completion_prompt
from .request import ApiRequest, loads
from .responses import ResponseWriter, too_long_refusal
from .responses_request import parse_responses_request
from .responses_store import ResponseStore
from .run import Ending, KeepAlive, Run, collect
from .text import ReplyShaper

KEEPALIVE_SECONDS = 5.0
ROUTES = {"/v1/chat/completions": "POST", "/v1/completions": "POST", "/v1/models": "GET",
          "/v1/messages": "POST", "/v1/messages/count_tokens": "POST", "/v1/responses": "POST"}
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@dataclass
class ApiConfig:
    model_id: str
    enabled: bool = True
    api_key: Optional[str] = None
    off_reason: str = ""
    keepalive: float = KEEPALIVE_SECONDS
    max_body: int = MAX_BODY_BYTES               # the pictures a request may carry are added (server.py)
    body_note: str = ""                     # what the 413 adds (the pictures a request may carry)
    cors_origins: Tuple[str, ...] = ()      # web origins whose pages may call the API (--cors-origins)
    response_store: int = 256               # /v1/responses kept for previous_response_id (LRU)
    log: Callable[[str], None] = lambda line: None


def model_id_of(host) -> str:
    path = getattr(host, "path", None)
    return path.name if path is not None and path.name else "mtp-chat"


class OpenAIApi:
    def __init__(self, host, stops: StopRegistry, config: ApiConfig):
        self.host, self.stops, self.config = host, stops, config
        self.settings = host.settings
        self.turns = Turns(host.batch_width)
        self.responses = ResponseStore(config.response_store)

    # --- gatekeeping -----------------------------------------------------------------------
    def authorize(self, request: Request) -> None:
        """The key as ``Authorization: Bearer KEY`` or ``x-api-key: KEY`` (Anthropic's header;
        Claude Code sends either)."""
        cfg = self.config
        if not cfg.enabled:
            raise ApiError(403, f"The API is off: {cfg.off_reason}", code="api_disabled")
        if cfg.api_key is None:
            return self.local_only(request)
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        token = token.strip() if scheme.lower() == "bearer" else request.headers.get("x-api-key", "").strip()
        if not secrets.compare_digest(token.encode(), cfg.api_key.encode()):
            raise ApiError(401, "Missing or wrong API key: send the header 'Authorization: Bearer KEY' (or "
                                "'x-api-key: KEY') with the key the server was started with (--api-key).",
                           code="invalid_api_key", headers={"WWW-Authenticate": 'Bearer realm="mtp-chat"'})

    def local_only(self, request: Request) -> None:
        """Without a key the API is open only to programs on this machine: a web page cannot
        use the visitor's browser to reach it, neither by a cross-site request (its Origin is
        another site, unless --cors-origins lets it) nor by DNS rebinding (its Host is another
        name)."""
        host, origin = hostname_of(request.headers.get("host", "")), request.headers.get("origin")
        if not is_loopback(host) or (origin is not None and origin not in self.config.cors_origins
                                     and not is_loopback(hostname_of(origin))):
            raise ApiError(403, "Without --api-key the API answers only programs on this machine (Host and Origin "
                                "127.0.0.1 or localhost); start the server with --api-key KEY to use it otherwise.",
                           code="local_only")

    async def read_body(self, request: Request) -> bytes:
        limit = self.config.max_body
        too_big = ApiError(413, f"The request body is larger than {limit // 1024} KiB.{self.config.body_note}",
                           code="request_too_large")
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

    def refuse(self, request: Request, exc: ApiError, shape: Callable[[ApiError], dict] = None) -> Response:
        client = request.client.host if request.client else "?"
        self.config.log(f"API {exc.status} {request.method} {request.url.path} from {client}: {exc.message[:200]}")
        if shape is None:
            return error_response(exc)
        return JSONResponse(shape(exc), status_code=exc.status, headers=exc.headers)

    @property
    def pictures(self) -> bool:
        """The model reads pictures (it has a vision tower): the chat parsers refuse them otherwise."""
        return getattr(getattr(self.host, "adapter", None), "vision", None) is not None

    async def read_request(self, request: Request, parse, **kw) -> ApiRequest:
        """Key, size, JSON, fields, model: the checks every decoding request passes."""
        self.authorize(request)
        req = parse(loads(await self.read_body(request)), self.settings, self.host.max_depth, self.settings.max_tokens,
                    **kw)
        self.check_model(req.model)
        return req

    async def constraint(self, req: ApiRequest):
        """The request's grammar compiled for this tokenizer (None without one); 400 if it cannot be.
        Offered tools' lazy call grammar (tool_choice "auto") never refuses a request: where it
        cannot be held (a schema the grammar library refuses, a tag that is not one token) the
        calls go unheld, as before."""
        if not req.grammar:
            if req.call_grammar is None:
                return None
            return await run_in_threadpool(self.host.lazy_constraint, req.call_grammar)
        from core import GrammarError

        try:
            return await run_in_threadpool(self.host.constraint, req.grammar)
        except GrammarError as exc:
            raise ApiError(400, f"The requested structure cannot be enforced: {exc}.",
                           param="response_format", code="invalid_schema") from None

    # --- routes ----------------------------------------------------------------------------
    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def models(self, request: Request) -> Response:
        try:
            self.authorize(request)
        except ApiError as exc:
            return self.refuse(request, exc)
        return JSONResponse({"object": "list", "data": [self.model_object()]})

    def model_object(self) -> dict:
        created = int(self.host.path.stat().st_mtime) if getattr(self.host, "path", None) else 0
        # Pictures only where the checkpoint has a vision tower (OpenRouter's and LM Studio's key).
        return {"id": self.config.model_id, "object": "model", "created": created, "owned_by": "mtp-chat",
                "input_modalities": ["text", "image"] if self.pictures else ["text"]}

    async def model(self, request: Request) -> Response:
        try:
            self.authorize(request)
            self.check_model(request.path_params["model_id"])
        except ApiError as exc:
            return self.refuse(request, exc)
        return JSONResponse(self.model_object())

    async def metrics(self, request: Request) -> Response:
        try:
            self.authorize(request)
        except ApiError as exc:
            return self.refuse(request, exc)
        return Response(self.host.metrics.render(), media_type=METRICS_TYPE)

    async def chat_completions(self, request: Request) -> Response:
        try:
            req = await self.read_request(request, parse_chat, pictures=self.pictures)
            prompt, in_reasoning = await run_in_threadpool(chat_prompt, self.host, req)
            constraint = await self.constraint(req)
        except ApiError as exc:
            return self.refuse(request, exc)
        shaper = ReplyShaper(req.stops, tools=bool(req.tools), reasoning=True, in_reasoning=in_reasoning,
                             markers=self.host.reasoning)
        reply = Reply("chat", self.config.model_id)
        run = Run(self, req, prompt, shaper, in_reasoning, constraint=constraint, id=reply.id)
        return await self.respond(request, run, reply)

    async def completions(self, request: Request) -> Response:
        try:
            req = await self.read_request(request, parse_completion)
            ids = await run_in_threadpool(completion_prompt, self.host, req)
            echoed = await run_in_threadpool(self.host.prompt_logprobs, ids, req.logprobs or 0) if req.echo else None
        except ApiError as exc:
            return self.refuse(request, exc)
        reply = Reply("text", self.config.model_id)
        if req.params.max_tokens == 0:               # echo alone: lm-eval's log-likelihood requests
            return JSONResponse(reply.whole([], [], "length", {"prompt_tokens": len(ids), "completion_tokens": 0,
                                                                "total_tokens": len(ids)}, {},
                                            self.echo_logprobs(req, ids, echoed, []), self.text_of(ids)))
        run = Run(self, req, ids, ReplyShaper(req.stops), kind="text", id=reply.id)
        return await self.respond(request, run, reply, echoed=(ids, echoed) if req.echo else None)

    async def messages(self, request: Request) -> Response:
        try:
            req = await self.read_request(request, parse_messages_request, pictures=self.pictures)
            prompt, in_reasoning = await run_in_threadpool(chat_prompt, self.host, req, True)
            constraint = await self.constraint(req)
        except ApiError as exc:
            return self.refuse(request, context_refusal(exc), anthropic_error)
        shaper = ReplyShaper(req.stops, tools=bool(req.tools), reasoning=True, in_reasoning=in_reasoning,
                             markers=self.host.reasoning)
        writer = MessageWriter(self.config.model_id, len(prompt), req.clamped)
        run = Run(self, req, prompt, shaper, in_reasoning, constraint=constraint, keep_reasoning=True, id=writer.id)
        if req.stream:
            return StreamingResponse(writer.stream(run, self.config.keepalive), media_type="text/event-stream",
                                     headers=SSE_HEADERS)
        return await self.whole(request, run, writer.whole, anthropic_error)

    async def count_tokens(self, request: Request) -> Response:
        try:
            req = await self.read_request(request, parse_messages_request, count_only=True, pictures=self.pictures)
            prompt, _ = await run_in_threadpool(chat_prompt, self.host, req, True)
            await self.constraint(req)              # a schema that would be refused is refused here too
        except ApiError as exc:
            return self.refuse(request, context_refusal(exc), anthropic_error)
        return JSONResponse(count_body(len(prompt)))

    async def responses_create(self, request: Request) -> Response:
        try:
            req = await self.read_request(request, parse_responses_request, store=self.responses, pictures=self.pictures)
            prompt, in_reasoning = await run_in_threadpool(chat_prompt, self.host, req)
            constraint = await self.constraint(req)
        except ApiError as exc:
            return self.refuse(request, too_long_refusal(exc))
        shaper = ReplyShaper(req.stops, tools=bool(req.tools), reasoning=True, in_reasoning=in_reasoning,
                             markers=self.host.reasoning)
        writer = ResponseWriter(self.config.model_id, req, self.responses)
        run = Run(self, req, prompt, shaper, in_reasoning, constraint=constraint, keep_reasoning=True, id=writer.id)
        if req.stream:
            return StreamingResponse(writer.stream(run, self.config.keepalive), media_type="text/event-stream",
                                     headers=SSE_HEADERS)
        return await self.whole(request, run, lambda w: writer.whole(run, w))

    async def unknown(self, request: Request) -> Response:
        path = request.url.path.rstrip("/")
        if path in ROUTES:
            exc = ApiError(405, f"{request.method} is not allowed on {path}: use {ROUTES[path]}.",
                           code="method_not_allowed")
        else:
            exc = ApiError(404, f"Unknown route {request.method} {path[:100]}: this server has "
                                f"{', '.join(ROUTES)} and /health.", code="unknown_url")
        return self.refuse(request, exc, anthropic_error if path.startswith("/v1/messages") else None)

    # --- OpenAI chat and completions replies ----------------------------------------------------
    def text_of(self, ids) -> str:
        return self.host.tokenizer.decode(list(ids))

    def token_text(self, token: int) -> str:
        return self.host.tokenizer.decode([token])

    def echo_logprobs(self, req: ApiRequest, ids, echoed, generated) -> Optional[dict]:
        if req.logprobs is None:
            return None
        pairs = (list(zip(echoed, ids)) if echoed is not None else []) + [(lp, lp.token) for lp in generated]
        return completion_logprobs(pairs, self.token_text)

    def logprobs_body(self, req: ApiRequest, reply: Reply, lps: list) -> Optional[dict]:
        if req.logprobs is None or not lps:
            return None
        if reply.kind == "chat":
            return chat_logprobs(lps, self.token_text)
        return completion_logprobs([(lp, lp.token) for lp in lps], self.token_text)

    def logprobs_of(self, run: Run, reply: Reply) -> Optional[dict]:
        """The logprobs of the tokens decoded since the last chunk, for the next chunk."""
        return self.logprobs_body(run.req, reply, run.take_logprobs())

    async def respond(self, request: Request, run: Run, reply: Reply, echoed=None) -> Response:
        if run.req.stream:
            return StreamingResponse(self.stream(run, reply), media_type="text/event-stream", headers=SSE_HEADERS)

        def write(w) -> dict:
            e = w.ending
            if echoed is not None:
                ids, lps = echoed
                return reply.whole(w.deltas, e.calls, e.finish, e.usage, e.mtp,
                                   self.echo_logprobs(run.req, ids, lps, w.logprobs), self.text_of(ids))
            return reply.whole(w.deltas, e.calls, e.finish, e.usage, e.mtp, self.logprobs_body(run.req, reply, w.logprobs))

        return await self.whole(request, run, write)

    async def whole(self, request: Request, run: Run, write, shape=None) -> Response:
        """A whole reply written by `write(Whole) -> dict`; refusals and failures in `shape`."""
        try:
            return JSONResponse(write(await collect(run, request)))
        except ApiError as exc:
            return self.refuse(request, exc, shape)
        except Exception as exc:   # noqa: BLE001 - the engine failed; the server goes on
            return self.refuse(request, decode_failure(exc), shape)

    async def stream(self, run: Run, reply: Reply) -> AsyncIterator[bytes]:
        if reply.kind == "chat":
            yield sse(reply.role_chunk())
        keep, ending = KeepAlive(self.config.keepalive), None
        try:
            async for ev in run.events():
                if ev is None:
                    if keep.due():
                        yield KEEPALIVE
                elif isinstance(ev, Ending):
                    ending = ev
                else:
                    keep.sent()
                    yield sse(reply.delta_chunk(ev, self.logprobs_of(run, reply)))
        except ApiError as exc:
            yield sse(error_body(exc.status, exc.message, code=exc.code))
            yield DONE
            return
        except Exception as exc:   # noqa: BLE001 - the engine failed: say so in the stream
            yield sse(decode_failure(exc).body())
            yield DONE
            return
        for delta in ending.deltas:
            yield sse(reply.delta_chunk(delta, self.logprobs_of(run, reply)))
        if ending.calls:
            yield sse(reply.calls_chunk(ending.calls))
        yield sse(reply.finish_chunk(ending.finish, ending.mtp, self.logprobs_of(run, reply)))
        if run.req.include_usage:
            yield sse(reply.usage_chunk(ending.usage, ending.mtp))
        yield DONE

    def router(self) -> APIRouter:
        r = APIRouter()
        r.add_api_route("/health", self.health, methods=["GET", "HEAD"], include_in_schema=False)
        r.add_api_route("/v1/models", self.models, methods=["GET"], include_in_schema=False)
        r.add_api_route("/v1/models/{model_id:path}", self.model, methods=["GET"], include_in_schema=False)
        r.add_api_route("/metrics", self.metrics, methods=["GET"], include_in_schema=False)
        r.add_api_route("/v1/chat/completions", self.chat_completions, methods=["POST"], include_in_schema=False)
        r.add_api_route("/v1/completions", self.completions, methods=["POST"], include_in_schema=False)
        r.add_api_route("/v1/messages", self.messages, methods=["POST"], include_in_schema=False)
        r.add_api_route("/v1/messages/count_tokens", self.count_tokens, methods=["POST"], include_in_schema=False)
        r.add_api_route("/v1/responses", self.responses_create, methods=["POST"], include_in_schema=False)
        r.add_api_route("/v1/{rest:path}", self.unknown, include_in_schema=False,
                        methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"])
        r.add_api_route("/v1", self.unknown, include_in_schema=False,
                        methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"])
        return r
