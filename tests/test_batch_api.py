"""Continuous batching through the real server and the official openai client (webapp/batching.py):
concurrent greedy requests, decoded together, answer exactly what each answers alone; a client
that goes away mid-stream leaves the batch without disturbing the others."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from core.settings import DEMO_MODEL_DIR
from tests._webapp_helpers import make_host, served

QUESTIONS = ["Define harbor.", "What is a noun?", "Tell me about Python lists.", "Name a color.",
             "Why is the sky blue?", "Say hello."]
N = 40


@pytest.fixture(scope="module")
def host():
    return make_host(DEMO_MODEL_DIR, max_batch=4, prefix_cache_mb=0)


@pytest.fixture(scope="module")
def client(host):
    with served(host) as (url, _):
        yield openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, _strict_response_validation=True)


def ask(client, question, mode, stream=False):
    kw = dict(model="demo", messages=[{"role": "user", "content": question}], max_tokens=N, temperature=0,
              top_p=1, extra_body={"top_k": 0, "min_p": 0, "mode": mode, "depth": 2})
    if not stream:
        return client.chat.completions.create(**kw).choices[0].message.content
    return "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kw)
                   if c.choices)


@pytest.mark.parametrize("mode", ["mtp", "ar"])
def test_concurrent_requests_answer_as_alone(host, client, mode):
    alone = [ask(client, q, mode) for q in QUESTIONS]      # one at a time: a batch of one each
    before = sum(n for size, n in host.scheduler.batch_sizes.items() if size > 1)
    with ThreadPoolExecutor(len(QUESTIONS)) as pool:
        together = list(pool.map(lambda iq: ask(client, iq[1], mode, stream=iq[0] % 2 == 0), enumerate(QUESTIONS)))
    assert together == alone
    batched_steps = sum(n for size, n in host.scheduler.batch_sizes.items() if size > 1) - before
    assert batched_steps > 10, host.scheduler.batch_sizes          # they really decoded together
    assert max(host.scheduler.batch_sizes) <= 4                      # max_batch held


def test_a_client_that_leaves_frees_only_its_sequence(host, client):
    alone = [ask(client, q, "mtp") for q in QUESTIONS[:3]]
    started = threading.Event()

    def leaver():
        stream = client.chat.completions.create(
            model="demo", messages=[{"role": "user", "content": "Count to one thousand."}], max_tokens=2000,
            temperature=0, stream=True, extra_body={"mode": "mtp", "depth": 2})
        for i, _ in enumerate(stream):
            if i == 5:
                started.set()
                stream.close()   # the client goes away mid-reply
                return

    t = threading.Thread(target=leaver)
    t.start()
    assert started.wait(60)
    with ThreadPoolExecutor(3) as pool:
        together = list(pool.map(lambda q: ask(client, q, "mtp"), QUESTIONS[:3]))
    t.join(30)
    assert together == alone
    # Nothing is left in the batch: the leaver's sequence (and its caches) went with its client.
    assert host.worker.call(lambda: (len(host.scheduler.batch.running), len(host.scheduler.streams))) == (0, 0)
