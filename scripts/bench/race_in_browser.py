#!/usr/bin/env python3
"""The Race tab as a user meets it: `mtp-chat` started with its defaults, Debian chromium
driven by Playwright, one click of "Race" per prompt (the default Repeat N times), and the
figures read back from the page. This is the demo model's acceptance bar (issue 24: median
MTP/AR >= 1.2x over 8 everyday prompts that are not in its training data or the tests).

    flock -x /work/locks/cpu.lock .venv/bin/python scripts/bench/race_in_browser.py \
        --json docs/bench/race-in-browser-demo.json

Nothing here sets a sampler or a depth: what the page shows at start is what is measured.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ROOT / "scripts" / "demo_model" / "race_prompts.txt"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-dev-shm-usage"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_up(url: str, proc: subprocess.Popen, seconds: float = 300) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        if proc.poll() is not None:
            sys.exit(f"mtp-chat exited with {proc.returncode} before serving")
        try:
            urllib.request.urlopen(url + "/health", timeout=2)
            return
        except OSError:
            time.sleep(0.5)
    sys.exit(f"mtp-chat did not answer {url}/health within {seconds:.0f} s")


def race_once(page, prompt: str) -> dict:
    page.fill("#race-prompt textarea", prompt)
    before = page.locator("#race-stats .repeats").count() and page.locator("#race-stats .repeats").inner_text()
    page.click("#race-start")
    page.wait_for_function(
        "(before) => { const r = document.querySelector('#race-stats .repeats');"
        " const b = document.querySelector('#race-start button, button#race-start');"
        " return r && r.innerText !== before && b && b.disabled === false; }", arg=before or "")
    rep = page.locator("#race-stats .repeats")
    speed = page.locator("#race-stats .speedup")
    return {"prompt": prompt,
            "median": float(rep.get_attribute("data-median")),
            "min": float(rep.get_attribute("data-min")), "max": float(rep.get_attribute("data-max")),
            "runs": int(rep.get_attribute("data-runs")),
            "short": speed.get_attribute("data-short") == "1",
            "text": page.locator("#race-stats").inner_text()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="checkpoint (default: mtp-chat's default, the bundled demo)")
    ap.add_argument("--prompts-file", default=str(PROMPTS))
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    prompts = [p for p in Path(args.prompts_file).read_text().splitlines() if p.strip()]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [str(ROOT / ".venv" / "bin" / "mtp-chat"), "--port", str(port)] + (["--model", args.model] if args.model else [])
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                            env={**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"})
    try:
        wait_up(url, proc)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.set_default_timeout(600_000)
            page.goto(url)
            page.click("#tab-race-button")
            results = []
            for prompt in prompts:
                r = race_once(page, prompt)
                results.append(r)
                print(f"{r['median']:.2f}x (spread {r['min']:.2f}-{r['max']:.2f}, {r['runs']} runs"
                      f"{', short' if r['short'] else ''})  {prompt}", flush=True)
            browser.close()
    finally:
        proc.terminate()
        proc.wait(30)
    medians = [r["median"] for r in results]
    overall = statistics.median(medians)
    print(f"median over {len(medians)} prompts: {overall:.2f}x (lowest {min(medians):.2f}x)")
    if args.json:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        Path(args.json).write_text(json.dumps({
            "what": "the Race tab at its defaults in chromium, one click per prompt (scripts/bench/race_in_browser.py)",
            "git": commit, "command": cmd[1:], "median_of_prompt_medians": overall, "prompts": results}, indent=1))


if __name__ == "__main__":
    main()
