"""Batching's default (core.batch.default_max_batch): left unset, replies decode together where
it pays, 4 at a time on an NVIDIA GPU (measured there: 4 requests 2.68x AR / 2.58x MTP one
request's aggregate, each reply equal to alone), one at a time elsewhere; a value set by the user
always wins. The GPU is what on_cuda() reports, made to say yes here: the host built on the real
demo model then has its batch scheduler and says so in its load log."""
from __future__ import annotations

import pytest

from core import disk_cache
from core.settings import DEMO_MODEL_DIR, get_settings
from tests._webapp_helpers import make_host
from webapp.serving.model import ModelHost


@pytest.fixture(scope="module")
def host():
    return make_host(DEMO_MODEL_DIR, prefix_cache_mb=0)


def _host_with(host, monkeypatch, cuda: bool, **settings):
    monkeypatch.setattr(disk_cache, "on_cuda", lambda: cuda)
    logs = []
    made = ModelHost(host.adapter, get_settings(model=DEMO_MODEL_DIR, prefix_cache_mb=0, **settings),
                     worker=host.worker, log=logs.append)
    return made, " ".join(logs)


def test_unset_on_this_cpu_is_one_at_a_time(host):
    assert get_settings(model=DEMO_MODEL_DIR).max_batch is None
    assert host.settings.max_batch == 1 and host.scheduler is None


def test_unset_on_an_nvidia_gpu_batches_4_and_says_so(host, monkeypatch):
    made, log = _host_with(host, monkeypatch, cuda=True)
    assert made.settings.max_batch == 4 and made.scheduler is not None and made.scheduler.max_batch == 4
    assert "up to 4 replies decode together" in log and "MTP_CHAT_MAX_BATCH=1" in log


@pytest.mark.parametrize("cuda, asked", [(True, 1), (True, 2), (False, 3)])
def test_a_value_the_user_sets_wins(host, monkeypatch, cuda, asked):
    made, log = _host_with(host, monkeypatch, cuda=cuda, max_batch=asked)
    assert made.settings.max_batch == asked and (made.scheduler is not None) == (asked > 1)
    assert "batching:" not in log


def test_the_environment_sets_it(monkeypatch):
    monkeypatch.setenv("MTP_CHAT_MAX_BATCH", "2")
    assert get_settings(model=DEMO_MODEL_DIR).max_batch == 2
