"""The model thread's background work (webapp/serving/worker.py): slices run only while the model
is idle, and work queued `at_once` starts there and then when the model is idle already (a reply's
snapshot: an agent's next call comes within ~0.1 s, and waits only for a snapshot under way).
IDLE_POLL (how long the idle thread waits for a call before a slice) is set to a minute here, so
that only at-once work can run within the tests' waits."""
from __future__ import annotations

import threading

import pytest

from webapp.serving import worker as W


@pytest.fixture
def slow_poll(monkeypatch):
    monkeypatch.setattr(W, "IDLE_POLL", 60.0)


def _work(ran: list, done: threading.Event):
    ran.append(threading.current_thread().name)
    done.set()
    yield


def test_at_once_work_starts_when_the_model_is_idle_and_plain_work_waits_for_the_poll(slow_poll):
    w = W.ModelWorker(name="idle-test")
    ran, now, later = [], threading.Event(), threading.Event()
    w.in_idle_time(_work(ran, now), at_once=True)
    assert now.wait(10) and ran == ["idle-test"]   # on the model thread, without the minute's poll
    w.in_idle_time(_work(ran, later))
    assert not later.wait(0.5) and ran == ["idle-test"]


def test_at_once_work_waits_while_a_stream_is_open(slow_poll):
    w = W.ModelWorker(name="idle-test-2")
    ran, done = [], threading.Event()

    def events():
        yield 1
        yield 2

    stream = w.stream(events)                 # open until exhausted or closed
    w.in_idle_time(_work(ran, done), at_once=True)
    assert not done.wait(0.5) and ran == []   # a reply streaming: not now
    stream.close()
    W.IDLE_POLL = 0.02                        # (the fixture puts the minute back after the test)
    w.call(lambda: None)                      # wakes the thread: the work runs in idle time now
    assert done.wait(10) and ran == ["idle-test-2"]
