"""`mtp-chat` / `python -m webapp`: load the model once, then serve the web app.

Defaults come from core.settings (environment ``MTP_CHAT_*`` or ``.env``); flags override.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import List, Optional, Tuple

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")   # no calls out, before gradio loads

SHARE_NOTE = ("Public share links (gradio.live tunnels) need internet access and are not "
              "available offline; use --lan (with --auth) to share on your local network.")


def build_parser(defaults) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mtp-chat",
        description="Local web chat for multi-token-prediction (MTP) speculative decoding on MLX.",
        epilog="Every flag also reads MTP_CHAT_<NAME> from the environment (e.g. MTP_CHAT_AUTH=user:pass).")
    p.add_argument("--model", default=str(defaults.model),
                   help="checkpoint directory (default: the bundled demo model, %(default)s)")
    p.add_argument("--drafter", default=defaults.drafter and str(defaults.drafter), metavar="DIR",
                   help="the drafter's checkpoint when it is kept apart from the model (Gemma 4's '-assistant'; "
                        "default: MODEL/assistant/)")
    p.add_argument("--host", default=defaults.host, help="address to listen on (default %(default)s)")
    p.add_argument("--port", type=int, default=defaults.port, help="port (default %(default)s)")
    p.add_argument("--lan", action="store_true", default=defaults.lan,
                   help="listen on all interfaces and print the LAN URLs to open from other devices")
    p.add_argument("--auth", default=defaults.auth, metavar="USER:PASS",
                   help="require this user and password to open the app (default: $MTP_CHAT_AUTH)")
    p.add_argument("--api-key", default=defaults.api_key, metavar="KEY",
                   help="require 'Authorization: Bearer KEY' on the OpenAI-compatible API (/v1); needed to "
                        "keep the API on with --lan or --auth (default: $MTP_CHAT_API_KEY)")
    p.add_argument("--cors-origins", default=defaults.cors_origins, metavar="ORIGINS",
                   help="comma-separated web origins whose pages may call the API from a browser, e.g. "
                        "http://localhost:3000 (default: none; $MTP_CHAT_CORS_ORIGINS)")
    p.add_argument("--response-store", type=int, default=defaults.response_store, metavar="N",
                   help="/v1/responses replies kept in memory for previous_response_id (default %(default)s; 0 = none)")
    p.add_argument("--depth", default=str(defaults.depth),
                   help="default MTP draft depth: 1..%d or 'auto' (default %%(default)s)" % defaults.max_depth)
    p.add_argument("--share", action="store_true", help="(not available offline; explains why)")
    p.add_argument("--no-warmup", action="store_true", help="skip the short warm-up generation at start")
    p.add_argument("--clear-cache", action="store_true",
                   help="delete the prefix cache on disk (every model's conversation states, under "
                        "$MTP_CHAT_CACHE_DIR or the user's cache folder) and exit")
    p.add_argument("--distributed", nargs="?", const="ring", default=None, metavar="BACKEND",
                   help="run as one rank of a pipeline over mx.distributed (ring, jaccl, nccl; default ring): start "
                        "every rank with one command, e.g. 'mlx.launch --hosts h1,h2 --backend ring -- mtp-chat "
                        "--distributed --model DIR'; rank 0 serves, the others hold layers (see README)")
    p.add_argument("--pipeline-timeout", type=float, default=60.0, metavar="S",
                   help="with --distributed: rank 0's longest wait for the other ranks in one exchange before it "
                        "declares one lost (default %(default)s)")
    return p


def clear_cache(settings) -> int:
    from core.disk_cache import clear_all, default_dir

    if settings.cache_dir == "":
        say("the prefix cache on disk is off (MTP_CHAT_CACHE_DIR is empty): nothing to clear")
        return 0
    root = default_dir() if settings.cache_dir is None else settings.cache_dir
    files, nbytes = clear_all(root)
    say(f"removed {files} prefix-cache file{'s' if files != 1 else ''} ({nbytes / 2**20:.1f} MiB) from {root}")
    return 0


def parse_auth(value: Optional[str]) -> Optional[Tuple[str, str]]:
    if not value:
        return None
    user, _, password = value.partition(":")
    if not user or not password:
        raise ValueError("--auth must look like USER:PASS")
    return user, password


def urls(host: str, port: int, lan: bool) -> Tuple[str, List[str]]:
    from .netinfo import lan_urls

    local = f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}"
    return local, (lan_urls(port) if lan or host in ("0.0.0.0", "") else [])


def say(message: str) -> None:
    print(f"mtp-chat: {message}", flush=True)


def main(argv: Optional[List[str]] = None) -> int:
    import adapters  # noqa: F401  - first: loads a fast BLAS ($MTP_CHAT_BLAS) before mlx is imported
    from core.settings import get_settings

    try:
        base = get_settings()
    except Exception as exc:   # a bad MTP_CHAT_* variable
        print(f"mtp-chat: invalid setting in the environment: {exc}", file=sys.stderr)
        return 2
    args = build_parser(base).parse_args(argv)
    try:
        settings = get_settings(model=args.model, drafter=args.drafter, host=args.host, port=args.port, lan=args.lan,
                                auth=args.auth, depth=args.depth, api_key=args.api_key or None,
                                cors_origins=args.cors_origins, response_store=args.response_store)
        auth = parse_auth(settings.auth)
    except Exception as exc:
        print(f"mtp-chat: {exc}", file=sys.stderr)
        return 2
    if args.clear_cache:
        return clear_cache(settings)
    if args.share:
        print(f"mtp-chat: {SHARE_NOTE}")
    host = "0.0.0.0" if settings.lan else settings.host
    model_dir = settings.model
    if not model_dir.is_dir():
        print(f"mtp-chat: model directory not found: {model_dir}\n"
              f"  Pass --model DIR (a Qwythos-layout checkpoint with optiq/mtp.safetensors).", file=sys.stderr)
        return 2

    from .serving.model import ModelHost, describe_runtime
    from .serving.params import parse_params
    from .server import Shutdown

    load, group = None, None
    if args.distributed:
        from .serving import distributed

        settings = distributed.prepare(settings)
        rank, group = distributed.rank_of(args.distributed)
        if rank != 0:   # a worker: no HTTP port, follows rank 0 until it stops
            return distributed.serve_worker(model_dir, settings, group, args.distributed, log=say)
        clash = distributed.port_clash(settings.port, rank)
        if clash:
            print(f"mtp-chat: {clash}", file=sys.stderr)
            return 2
        load = distributed.loader(group, args.distributed, args.pipeline_timeout)

    shutdown = Shutdown(log=say).install()   # from here on Ctrl+C / SIGTERM exit 0, never abort

    runtime = describe_runtime()
    print(f"mtp-chat: {runtime}", flush=True)
    try:
        host_model = ModelHost.load(model_dir, settings, log=lambda m: print(f"mtp-chat: {m}", flush=True), load=load)
    except Exception as exc:
        print(f"mtp-chat: could not load the model from {model_dir}: {exc}", file=sys.stderr)
        return 1
    print(f"mtp-chat: model: {host_model.description}", flush=True)
    print(f"mtp-chat: exactness: {host_model.exactness}", flush=True)
    print(f"mtp-chat: memory: {host_model.memory}", flush=True)
    if group is not None:
        for line in distributed.banner(host_model.adapter):
            say(line)
        shutdown.before_exit.append(lambda: host_model.worker.call(host_model.adapter.close))
    shutdown.before_exit.append(host_model.flush_cache)
    disk = host_model.prefix_cache.disk if host_model.prefix_cache is not None else None
    if disk is not None:
        d = disk.describe()
        say(f"prefix cache on disk: {d['dir']} ({d['entries']} entries, {d['bytes'] / 2**20:.1f} MiB of "
            f"{d['budget_bytes'] / 2**20:.0f} MiB; --clear-cache empties it)")
    if not args.no_warmup:
        print("mtp-chat: warming up ...", flush=True)
        params = parse_params(settings.temperature, settings.top_p, settings.top_k, settings.min_p,
                              32, settings.seed, settings.depth, max_depth=settings.max_depth)
        host_model.warmup(params, log=lambda m: print(f"mtp-chat: {m}", flush=True))
    if disk is not None and len(disk):
        t0 = time.perf_counter()
        n, nbytes, rehearsed = host_model.preload()
        say(f"prefix cache: {n} snapshot(s) ({nbytes / 2**20:.1f} MiB) loaded from disk in "
            f"{time.perf_counter() - t0:.1f} s (the newest that fit its {settings.prefix_cache_mb} MiB in memory"
            + (f"; a next turn after the newest rehearsed, {rehearsed} tokens)" if rehearsed else ")"))

    from .server import launch
    from .ui.page import build_app

    demo = build_app(host_model, runtime=runtime)
    try:
        running = launch(demo, host_model, host=host, port=settings.port, auth=auth, api_key=settings.api_key,
                         log=say, cors_origins=settings.cors_list)
    except OSError as exc:
        print(f"mtp-chat: cannot listen on {host}:{settings.port}: {exc}. Try --port.", file=sys.stderr)
        return 1
    local, lan = urls(host, running.port, settings.lan)
    say(f"open {local}")
    for u in lan:
        say(f"on your network: {u}")
    if host == "0.0.0.0" and not lan:
        say("listening on all interfaces, but no LAN address was found")
    if host not in ("127.0.0.1", "localhost", "::1") and auth is None:
        print("mtp-chat: WARNING: serving on the network without a password: anyone who can reach "
              "this machine can use the app. Add --auth USER:PASS.", file=sys.stderr, flush=True)
    if auth:
        say(f"sign-in required (user '{auth[0]}')")
    api = running.api
    if not api.enabled:
        say(f"OpenAI-compatible API: off: {api.off_reason}")
    else:
        say(f"OpenAI-compatible API: {local}/v1 (model '{api.model_id}', "
            + ("key required: Authorization: Bearer KEY)" if api.api_key else "open on this machine, no key)"))
    say("press Ctrl+C to stop")
    shutdown.serve(demo.stops)   # never returns: exits 0 after stopping every decode
    return 0
