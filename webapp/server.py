"""The one HTTP server: the OpenAI-compatible API and the Gradio UI in one FastAPI app.

``/v1/...`` and ``/health`` are registered first, then the Blocks are mounted at ``/``
(Gradio's password guards only Gradio's routes, so the API has its own bearer key and is
off when the UI is shared without one). Guards sit in front of everything: Gradio's own
routes answer only requests whose Host and Origin name this machine (no DNS rebinding, no
cross-site use of a visitor's browser), failed sign-ins are throttled per client address,
and file uploads are refused (the app takes none), except a chat's pictures when the model has
a vision tower (within the pictures' byte budget). uvicorn runs on a thread of ours; the main thread waits for Ctrl+C / SIGTERM, stops
every decode within a cycle, and ends the process with ``os._exit(0)``: MLX's threads
must not be torn down by the interpreter's exit (see serving/worker.py).
"""
from __future__ import annotations

import json
import math
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Sequence, Tuple

from .netinfo import host_allowed, hostname_of, is_loopback, same_host

LOGIN_PATHS = ("/login",)
UPLOAD_PATHS = ("/gradio_api/upload", "/upload")
SHUTDOWN_NOTICE = "The server is shutting down: this reply was cut short."


# --- guards (pure ASGI, so streamed responses and disconnects pass through untouched) -------
async def _send_json(send, status: int, body: dict, headers: Tuple[Tuple[bytes, bytes], ...] = ()) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": data})


class RefuseUploads:
    """Without a vision tower the app has no file inputs: ``/gradio_api/upload`` gets 403 before
    its body is read. With one (`max_bytes`: what a message's pictures may weigh, with the form's
    overhead) a larger upload gets 413, by its Content-Length or, without one, as it streams."""

    def __init__(self, app, max_bytes: Optional[int] = None):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"].rstrip("/") not in UPLOAD_PATHS:
            return await self.app(scope, receive, send)
        if self.max_bytes is None:
            return await _send_json(send, 403, {"detail": "This app takes no file uploads."})
        too_big = {"detail": f"Pictures are at most {self.max_bytes // 2**20} MiB an upload."}
        length = dict(scope.get("headers") or []).get(b"content-length", b"")
        if length and (not length.isdigit() or int(length) > self.max_bytes):
            return await _send_json(send, 413, too_big)
        seen = 0

        async def bounded():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise ValueError("upload over its budget")
            return message

        try:
            return await self.app(scope, bounded, send)
        except ValueError:
            if seen > self.max_bytes:
                return await _send_json(send, 413, too_big)
            raise


class SameHostOnly:
    """Gradio's routes answer only requests whose Host names this server (``host_allowed``)
    and whose Origin, when sent, is the page's own: the rule that guards ``/v1`` without a key. ``/v1`` and
    ``/metrics`` keep their own rules (a key, or this machine only); ``/health`` tells nothing."""

    def __init__(self, app, network: bool = False, exempt: Sequence[str] = ("/v1", "/metrics", "/health")):
        self.app, self.network, self.exempt = app, network, tuple(exempt)

    async def __call__(self, scope, receive, send):
        if scope["type"] in ("http", "websocket") and not _under(scope["path"], self.exempt):
            headers = dict((k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in scope.get("headers", []))
            host, origin = hostname_of(headers.get("host", "")), headers.get("origin")
            # A page may call us only from our own origin (its Origin names the same host).
            if not host_allowed(host, self.network) or (origin is not None and not same_host(hostname_of(origin), host)):
                if scope["type"] == "websocket":
                    return await send({"type": "websocket.close", "code": 1008})
                return await _send_json(send, 403, {"detail": "This server answers only requests addressed to it "
                                                              "by this machine's name or address (Host and Origin)."})
        return await self.app(scope, receive, send)


def _under(path: str, prefixes: Sequence[str]) -> bool:
    return any(path == p or path.startswith(p + "/") for p in prefixes)


@dataclass
class _Failures:
    count: int = 0
    locked_until: float = 0.0
    last: float = 0.0


class LoginThrottle:
    """Failed sign-ins per client address: the first ``free`` are answered as usual, then the
    address is locked out for 1, 2, 4 ... seconds (at most ``max_lock``) after each further
    failure, with 429 and Retry-After. Other addresses are not affected; a success or
    ``forget`` quiet seconds clear the count."""

    def __init__(self, app, free: int = 3, max_lock: float = 60.0, forget: float = 900.0,
                 clock: Callable[[], float] = time.monotonic, max_addresses: int = 10_000):
        self.app, self.free, self.max_lock, self.forget, self.clock = app, free, max_lock, forget, clock
        self.max_addresses = max_addresses
        self._by_address: Dict[str, _Failures] = {}
        self._lock = threading.Lock()

    def wait(self, address: str) -> float:
        with self._lock:
            f = self._by_address.get(address)
            return max(0.0, f.locked_until - self.clock()) if f else 0.0

    def record(self, address: str, ok: bool) -> None:
        now = self.clock()
        with self._lock:
            if ok:
                self._by_address.pop(address, None)
                return
            if len(self._by_address) >= self.max_addresses:     # bounded memory: forget the stale
                self._by_address = {a: f for a, f in self._by_address.items() if now - f.last < self.forget}
            f = self._by_address.get(address)
            if f is None or now - f.last >= self.forget:
                f = self._by_address[address] = _Failures()
            f.count += 1
            f.last = now
            if f.count >= self.free:
                f.locked_until = now + min(self.max_lock, 2.0 ** (f.count - self.free))

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"].rstrip("/") not in LOGIN_PATHS:
            return await self.app(scope, receive, send)
        address = (scope.get("client") or ("?", 0))[0]
        wait = self.wait(address)
        if wait > 0:
            seconds = str(math.ceil(wait))
            return await _send_json(send, 429, {"detail": f"Too many failed sign-ins from your address: "
                                                          f"try again in {seconds} s."},
                                    ((b"retry-after", seconds.encode()),))
        status = {}

        async def watch(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        await self.app(scope, receive, watch)
        code = status.get("code")
        if code == 200:
            self.record(address, ok=True)
        elif code in (400, 401, 403):
            self.record(address, ok=False)


# --- the app ---------------------------------------------------------------------------------
def api_policy(host: str, auth, api_key: Optional[str]) -> Tuple[bool, str]:
    """(API on?, why not). Open on this machine without a password, as local model servers
    are; shared (network or password) only with its own key, so /v1 never bypasses --auth."""
    if api_key:
        return True, ""
    if auth is not None:
        return False, "the app requires a password (--auth) and no API key was set; restart with --api-key KEY."
    if not is_loopback(host):
        return False, "the app listens on the network (--lan or --host) and no API key was set; restart with --api-key KEY."
    return True, ""


def build_server(model_host, demo, *, auth=None, api=None, network: bool = False, cors_origins: Sequence[str] = ()):
    """FastAPI app: guards, /v1 routes, then the Blocks at /. `network`: shared beyond this
    machine (--lan, --host); `cors_origins`: web origins whose pages may call /v1."""
    import gradio as gr
    from fastapi import FastAPI
    from starlette.middleware.cors import CORSMiddleware

    from .api.routes import OpenAIApi
    from .ui.theme import AUTH_MESSAGE, THEME
    from .ui.render import CSS

    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    st = getattr(model_host, "settings", None)
    pictures = getattr(getattr(model_host, "adapter", None), "vision", None) is not None and st is not None
    app.add_middleware(RefuseUploads, max_bytes=st.image_max_count * st.image_max_bytes + 2**20 if pictures else None)
    app.add_middleware(LoginThrottle)
    app.add_middleware(SameHostOnly, network=network)
    if cors_origins:       # outermost: a preflight carries no key and must be answered as such
        app.add_middleware(CORSMiddleware, allow_origins=list(cors_origins), allow_methods=["GET", "POST", "OPTIONS"],
                           allow_headers=["*"], expose_headers=["*"])
    if api is not None:
        app.include_router(OpenAIApi(model_host, demo.stops, api).router())
    return gr.mount_gradio_app(app, demo, path="/", auth=auth, auth_message=AUTH_MESSAGE, show_error=True,
                               ssr_mode=False, theme=THEME, css=CSS, footer_links=["api", "settings"])


def launch(demo: gr.Blocks, model_host: ModelHost, *, host: str = "127.0.0.1", port: int = 7860, auth=None,
           api_key=None, log=lambda line: None, keepalive=None, cors_origins=()):
    """Serve the UI and the OpenAI-compatible API on one port; returns
    the running server (``.url``, ``.port``, ``.stop()``; ``.api``: the API's ApiConfig)."""
    from .api.routes import ApiConfig, model_id_of

    enabled, why_not = api_policy(host, auth, api_key)
    api = ApiConfig(model_id_of(model_host), enabled=enabled, api_key=api_key or None, off_reason=why_not, log=log,
                    cors_origins=tuple(cors_origins), response_store=model_host.settings.response_store)
    if getattr(model_host.adapter, "vision", None) is not None:   # room for the pictures a request may carry
        st = model_host.settings
        api.max_body += st.image_max_count * (st.image_max_bytes * 4 // 3 + 64)
        api.body_note = (f" A request may carry {st.image_max_count} picture(s) of at most "
                         f"{st.image_max_bytes / 1e6:.1f} MB each (PNG, JPEG, WebP, GIF or BMP, base64).")
    if keepalive is not None:
        api.keepalive = keepalive
    app = build_server(model_host, demo, auth=auth, api=api, network=not is_loopback(host), cors_origins=cors_origins)
    running = RunningServer(app, host, port).start()
    running.api = api
    return running



# --- running it -------------------------------------------------------------------------------
def _bind(host: str, port: int) -> socket.socket:
    """A listening-ready socket (bind errors surface here, as OSError, before anything starts)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and
    # accepted sockets inherit this one's. With proto 0 every reply on a kept-alive connection
    # (the openai and anthropic clients keep theirs) waited ~40 ms for a delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


class RunningServer:
    """uvicorn serving ``app`` on a thread of ours (so it installs no signal handlers)."""

    def __init__(self, app, host: str, port: int, grace: float = 1.0):
        import uvicorn

        self.host = host
        self.sock = _bind(host, port)
        self.port = self.sock.getsockname()[1]
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                                timeout_graceful_shutdown=grace)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       name="mtp-http", daemon=True)

    @property
    def url(self) -> str:
        shown = "127.0.0.1" if self.host in ("0.0.0.0", "") else (f"[{self.host}]" if ":" in self.host else self.host)
        return f"http://{shown}:{self.port}"

    def start(self, timeout: float = 60.0) -> "RunningServer":
        self.thread.start()
        t0 = time.monotonic()
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() - t0 > timeout:
                raise RuntimeError(f"the web server did not start on {self.url}")
            time.sleep(0.02)
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)


class Shutdown:
    """Ctrl+C / SIGTERM: stop every decode, give streams a moment to send their last
    message, log one line, exit 0. Before the app serves (loading, warm-up) there is nothing
    to stop: it exits at once. A second signal exits at once too."""

    def __init__(self, log: Callable[[str], None] = print, grace: float = 5.0):
        self.log, self.grace = log, grace
        self.stops = None
        self.requested = threading.Event()
        self.signal_name = ""
        self.before_exit: list = []   # callables run after the decodes stopped (the disk cache's writes)

    def install(self) -> "Shutdown":
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)
        return self

    def _on_signal(self, signum, frame) -> None:
        self.signal_name = signal.Signals(signum).name
        if self.stops is None:
            self.log(f"{self.signal_name}: stopped before the app was serving")
            _exit(0)
        if self.requested.is_set():
            _exit(0)
        self.requested.set()

    def serve(self, stops) -> None:
        """Block the main thread until a signal, then shut down (never returns)."""
        self.stops = stops
        while not self.requested.wait(0.5):
            pass
        running = stops.stop_all(SHUTDOWN_NOTICE)
        self.log(f"{self.signal_name}: stopping {running} running decode{'s' if running != 1 else ''} "
                 f"and shutting down")
        deadline = time.monotonic() + self.grace
        while stops.active() and time.monotonic() < deadline:
            time.sleep(0.02)
        if stops.active():
            self.log(f"{self.signal_name}: {stops.active()} decode(s) still running after {self.grace:g} s; exiting anyway")
        time.sleep(min(0.3, max(0.0, deadline - time.monotonic())))   # last updates go out
        for fn in self.before_exit:
            try:
                fn()
            except Exception as exc:   # noqa: BLE001 - exiting anyway; say what was lost
                self.log(f"{self.signal_name}: {type(exc).__name__} before exit: {exc}")
        _exit(0)


def _exit(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:   # noqa: BLE001
            pass
    os._exit(code)
