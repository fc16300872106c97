"""Nobody's request pays for measuring the cost model (issue 17).

On a server started without warm-up, the first `depth: "auto"` request used to measure the cost
model inside itself (~7.6 s on the demo model) while everyone else waited. Now it decodes with
the unmeasured policy and the model thread measures in short slices when idle
(webapp/serving/calibration.py, webapp/serving/worker.py): counted here as slices, not clocked.
"""
from __future__ import annotations

import json
import threading

import openai
import pytest

from core.calibrate import needs_calibration
from tests._webapp_helpers import make_host, served


@pytest.fixture
def host(tiny_checkpoint, tmp_path):
    return make_host(tiny_checkpoint(), costs_dir=str(tmp_path / "costs"))  # make_host never warms up


def ask(client, depth, max_tokens=16):
    return client.chat.completions.create(
        model="model", messages=[{"role": "user", "content": "Hi there"}],
        max_tokens=max_tokens, temperature=0, extra_body={"mode": "mtp", "depth": depth, "top_k": 0, "min_p": 0})


def slices_while_open(events, n: int) -> list:
    """Background slices that ran while the n-th stream was open, for every stream."""
    opened = [e[1] for e in events if e[0] == "open"]
    sid, inside, out = opened[n], False, 0
    for kind, x in events:
        if (kind, x) == ("open", sid):
            inside = True
        elif (kind, x) == ("end", sid):
            return out
        elif kind == "slice" and inside:
            out += 1
    raise AssertionError("the stream never ended")


def test_a_plain_request_after_the_first_auto_one_is_not_held_up(host, tmp_path):
    worker = host.worker
    with served(host) as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        assert needs_calibration(host.adapter, host.calibration.max_width, 64)
        first = ask(client, "auto")
        start = worker.idle_slices
        plain = ask(client, 2)
        assert first.choices[0].message.content and plain.choices[0].message.content
        events = list(worker.events)
        assert slices_while_open(events, 0) == 0   # the auto request measured nothing inside itself
        # the plain one after it waits for at most the slice in progress when it came (its end is
        # logged after the stream opened), never for the measurement
        assert slices_while_open(events, 1) <= 1
        # ... and the measurement happens when nobody is waiting, in many short slices, then is saved
        done = threading.Event()
        for _ in range(600):  # hang guard: the tiny model measures in a few seconds
            if not needs_calibration(host.adapter, host.calibration.max_width, 64) and not worker._idle:
                done.set()
                break
            done.wait(0.1)
        assert done.is_set()
        assert worker.idle_slices - start >= 10  # what the auto request used to wait for, all in one go
        saved = json.loads(host.calibration.file.read_text())
        assert "64" in saved["buckets"] and saved["about"]["model"]["describe"] == host.description
        # a later auto request decodes with the measured model: it predicts a speed-up
        stats = host.worker.call(lambda: host.decoder("mtp", _params(host)).generate(
            host.prompt_ids([{"role": "user", "content": "Hi"}]), max_tokens=8)[1])
        assert stats.predicted_speedup is not None


def test_a_saved_measurement_is_reused_at_the_next_start(host, tiny_checkpoint, tmp_path):
    host.calibration.measure_now()
    again = make_host(tiny_checkpoint(), costs_dir=str(tmp_path / "costs"))
    assert not needs_calibration(again.adapter, again.calibration.max_width, 64)
    assert again.calibration.measure_now() is False  # warm-up has nothing to measure


def _params(host):
    from webapp.serving.params import parse_params

    return parse_params(0.0, 1.0, 0, 0.0, 8, 0, "auto", max_depth=host.max_depth)
