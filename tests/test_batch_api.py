"""Continuous batching through the real server and the official openai client (webapp/serving/batching.py):
concurrent greedy requests, decoded together, answer exactly what each answers alone (wherever
the reply meets no near-tie: a batch's rows agree with a lone sequence's to rounding,
tests/_ties.py); a client that goes away mid-stream leaves the batch without disturbing the others."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from core.settings import DEMO_MODEL_DIR
from tests._ties import tie_free
from tests._webapp_helpers import Req, make_host, served

QUESTIONS = ["Define harbor.", "What is a noun?", "Tell me about Python lists.", "Name a color.",
             "Why is the sky blue?", "Say hello."]
N = 40


@pytest.fixture(scope="module")
def host():
    return make_host(DEMO_MODEL_DIR, max_batch=4, prefix_cache_mb=0)


@pytest.fixture(scope="module")
def tie_free_questions(host):
    """Whether each question's greedy reply meets no near-tie (then together == alone on every machine)."""
    return [host.worker.call(tie_free, host.adapter, host.prompt_ids([{"role": "user", "content": q}]), N)
            for q in QUESTIONS]


def as_alone(together, alone, free):
    assert len(together) == len(alone)
    assert [t for t, f in zip(together, free) if f] == [a for a, f in zip(alone, free) if f]


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
def test_concurrent_requests_answer_as_alone(host, client, tie_free_questions, mode):
    alone = [ask(client, q, mode) for q in QUESTIONS]      # one at a time: a batch of one each
    before = sum(n for size, n in host.scheduler.batch_sizes.items() if size > 1)
    with ThreadPoolExecutor(len(QUESTIONS)) as pool:
        together = list(pool.map(lambda iq: ask(client, iq[1], mode, stream=iq[0] % 2 == 0), enumerate(QUESTIONS)))
    as_alone(together, alone, tie_free_questions)
    batched_steps = sum(n for size, n in host.scheduler.batch_sizes.items() if size > 1) - before
    assert batched_steps > 10, host.scheduler.batch_sizes          # they really decoded together
    assert max(host.scheduler.batch_sizes) <= 4                      # max_batch held


def test_a_client_that_leaves_frees_only_its_sequence(host, client, tie_free_questions):
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
    as_alone(together, alone, tie_free_questions[:3])
    # Nothing is left in the batch: the leaver's sequence (and its caches) went with its client.
    assert host.worker.call(lambda: (len(host.scheduler.batch.running), len(host.scheduler.streams))) == (0, 0)


def test_chat_replies_say_they_are_batched_and_metrics_count_the_batch(host, client):
    """Three chat replies at once (the UI's own event function, three sessions): while they
    decode together each shows "batched with N others" where a queued reply shows its position,
    and its stats say with how many at most; /metrics carries the batch's size as it runs
    (vLLM's gauge names) and 0 once it is done."""
    import httpx

    from webapp.ui.chat import ChatHandlers, is_stats
    from webapp.serving.stops import StopRegistry

    chat = ChatHandlers(host, StopRegistry(), update_interval=0.0)
    greedy = dict(temperature=0.0, top_p=1.0, top_k=0, min_p=0.0, seed=0, depth="2")
    running, done = [], threading.Event()

    def watch():
        while not done.is_set():
            running.append(host.metrics.running._value.get())
            done.wait(0.005)

    def reply(iq):
        i, q = iq
        return list(chat.respond([{"role": "user", "content": q}], "mtp", "", max_tokens=N, request=Req(f"s{i}"),
                                 **greedy))

    watcher = threading.Thread(target=watch)
    watcher.start()
    with ThreadPoolExecutor(3) as pool:
        outs = list(pool.map(reply, enumerate(QUESTIONS[:3])))
    done.set()
    watcher.join()
    streaming = [m["metadata"]["title"] for out in outs for h in out[:-1] for m in h if is_stats(m)]
    assert any(t == "👥 batched with 2 others" for t in streaming), streaming
    finals = [[m["metadata"]["title"] for m in out[-1] if is_stats(m)] for out in outs]
    assert all("batched with up to" in f[-1] and not any(t.startswith("👥") for t in f) for f in finals), finals
    assert max(running) >= 2 and host.metrics.running._value.get() == 0
    text = httpx.get(str(client.base_url).removesuffix("/").removesuffix("/v1") + "/metrics", timeout=30).text
    assert "vllm:num_requests_running 0.0" in text and "vllm:num_requests_waiting 0.0" in text
