#!/usr/bin/env python3
"""How much CPU the idle web app uses: with no browser, then with one open page.

Starts ``python -m webapp`` (warm-up included, as a user would), waits until it serves,
then reads the server process's utime+stime from /proc/<pid>/stat over each window and
prints it as a percentage of one core. The page is headless Debian chromium driven by
Playwright (as in the browser tests); the browser's own CPU is not counted.

    python scripts/bench/idle_cpu.py                      # demo model, 60 s per window
    python scripts/bench/idle_cpu.py --model DIR --seconds 30
    python scripts/bench/idle_cpu.py --gradio-polling     # as before webapp/ui/idle.py: Gradio's 1 ms loop
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from tests._webapp_helpers import CHROMIUM, CHROMIUM_ARGS, free_port  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of the whole process (all its threads), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS   # fields 14 and 15 of proc(5)


def busy_percent(pid: int, seconds: float) -> float:
    c0, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return 100.0 * (cpu_seconds(pid) - c0) / (time.monotonic() - t0)


# `python -m webapp`, optionally with webapp/ui/idle.py's calm_queue turned off first
RUN_APP = ("import sys, webapp.ui.idle\n"
           "if sys.argv[1] == 'gradio-polling': webapp.ui.idle.calm_queue = lambda demo: None\n"
           "from webapp.cli import main\n"
           "raise SystemExit(main(sys.argv[2:]))")


def start_server(model: str, port: int, warmup: bool, gradio_polling: bool = False) -> subprocess.Popen:
    cmd = [sys.executable, "-c", RUN_APP, "gradio-polling" if gradio_polling else "calm", "--port", str(port)]
    cmd += ["--model", model] if model else []
    cmd += [] if warmup else ["--no-warmup"]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("MTP_CHAT_AUTH", None)
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ready = threading.Event()

    def pump():   # keep the pipe drained so the server never blocks on its log
        for line in proc.stdout:
            if "press Ctrl+C" in line:
                ready.set()

    threading.Thread(target=pump, daemon=True).start()
    if not ready.wait(300):
        proc.kill()
        raise SystemExit("the server did not start within 300 s")
    return proc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="", help="checkpoint directory (default: the app's default, the demo)")
    ap.add_argument("--seconds", type=float, default=60.0, help="length of each window (default 60)")
    ap.add_argument("--settle", type=float, default=5.0, help="seconds to wait before each window")
    ap.add_argument("--no-warmup", action="store_true", help="start the server with --no-warmup")
    ap.add_argument("--gradio-polling", action="store_true",
                    help="leave Gradio's queue polling as it is (the figure before webapp/ui/idle.py)")
    args = ap.parse_args(argv)

    port = free_port()
    proc = start_server(args.model, port, not args.no_warmup, args.gradio_polling)
    try:
        time.sleep(args.settle)
        alone = busy_percent(proc.pid, args.seconds)
        print(f"idle, no page:  {alone:.2f} % of one core over {args.seconds:g} s", flush=True)
        from playwright.sync_api import sync_playwright

        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page()
            page.goto(f"http://127.0.0.1:{port}")
            page.wait_for_selector("#chat-input textarea")
            time.sleep(args.settle)
            with_page = busy_percent(proc.pid, args.seconds)
            print(f"idle, one page: {with_page:.2f} % of one core over {args.seconds:g} s", flush=True)
            browser.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
