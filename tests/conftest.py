"""Shared fixtures.

``tiny_checkpoint(**opts)`` builds a random-weight checkpoint in the Qwythos layout with
``scripts/make_tiny_checkpoint.make_tiny_checkpoint(**opts)`` and caches it for the whole
session by its options. The returned directory is shared between tests: never modify it;
pass ``fresh=True`` to get a private copy you may corrupt/edit.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# Measured cost models go to a directory of this run (not ~/.cache), also for the servers tests start.
os.environ.setdefault("MTP_CHAT_COSTS_DIR", tempfile.mkdtemp(prefix="mtp-chat-costs-"))
# Under pytest-xdist each worker measures into a folder of its own: two workers saving the same
# model's costs at once would race on one temporary file (core/calibrate.save).
if os.environ["MTP_CHAT_COSTS_DIR"] and os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["MTP_CHAT_COSTS_DIR"] = os.path.join(os.environ["MTP_CHAT_COSTS_DIR"], os.environ["PYTEST_XDIST_WORKER"])
    os.makedirs(os.environ["MTP_CHAT_COSTS_DIR"], exist_ok=True)
# The prefix cache on disk is off unless a test turns it on with a folder of its own: entries left
# by one test's server would otherwise be found by the next (tests/test_disk_restart.py).
os.environ.setdefault("MTP_CHAT_CACHE_DIR", "")

# Fast BLAS before anything imports mlx.core (importing ``adapters`` does it first thing).
try:
    from adapters.runtime import preload_blas as _preload

    _preload()
except Exception:  # noqa: BLE001 - tests of adapters report their own import errors
    pass

from scripts.checkpoints.make_tiny_checkpoint import make_tiny_checkpoint  # noqa: E402
from adapters import load_adapter  # noqa: E402
from tests._engine_helpers import MIXED, SURE, make_mixed_head  # noqa: E402


def _key(opts: dict) -> str:
    return repr(sorted((k, repr(v)) for k, v in opts.items()))


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """Factory: ``tiny_checkpoint(bits=None, tie_word_embeddings=False, ...) -> Path``."""
    cache: dict[str, Path] = {}

    def make(fresh: bool = False, **opts) -> Path:
        key = _key(opts)
        name = "ckpt_" + hashlib.sha1(key.encode()).hexdigest()[:10]
        if key not in cache:
            cache[key] = make_tiny_checkpoint(tmp_path_factory.mktemp(name) / "model", **opts)
        if not fresh:
            return cache[key]
        dst = tmp_path_factory.mktemp(name + "_fresh") / "model"
        shutil.copytree(cache[key], dst)
        return dst

    return make


@pytest.fixture(scope="session")
def tiny_model_dir(tiny_checkpoint) -> Path:
    """The default tiny checkpoint (4-bit trunk, 29-tensor 4-bit head, tied embeddings)."""
    return tiny_checkpoint()


@pytest.fixture(scope="session")
def mixed_adapter(tiny_checkpoint):
    """A float tiny checkpoint whose head accepts some drafts (tests/_engine_helpers.MIXED)."""
    return load_adapter(make_mixed_head(tiny_checkpoint(fresh=True, **MIXED)))


@pytest.fixture(scope="session")
def sure_adapter(tiny_checkpoint):
    """A float tiny checkpoint whose head accepts most sampled drafts (tests/_engine_helpers.SURE)."""
    return load_adapter(make_mixed_head(tiny_checkpoint(fresh=True, **SURE)))


# --- Parallel runs ------------------------------------------------------------------------------
# scripts/test.sh runs pytest-xdist with --dist loadfile: a module's tests share module-scoped
# fixtures (a served app, trained weights) and some follow on from each other, so each module runs
# whole on one worker. (--dist loadgroup could split the long modules, but xdist 3.8 marks groups by
# rewriting Item._nodeid, which pytest 9 no longer reads: its groups are silently ignored.) Modules
# run longest first (SLOWEST, measured on a 2-core CPU) so that no worker is left alone with a long
# module at the end; scripts/test.sh passes --no-loadscope-reorder, or xdist would order the
# modules by their number of tests.
SLOWEST = ["test_pipeline.py", "test_engine_exactness.py", "test_gemma4.py", "test_families.py", "test_batch.py",
           "test_structured_clients.py", "test_webapp_browser.py", "test_constraints.py", "test_disk_restart.py",
           "test_prefix_cache.py", "test_api_fuzz_agents.py", "test_server_shutdown.py", "test_race_truth.py",
           "test_webapp_server.py", "test_api.py", "test_thinking_browser.py", "test_batch_api.py",
           "test_long_input.py", "test_api_agents.py", "test_demo_model.py", "test_api_demo.py"]


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOWEST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOWEST)))   # stable: the rest keep their order


# --- No silent skips under CI --------------------------------------------------------------------
# A browser or API test that skips (chromium missing, a client package missing) would take its
# claim out of the suite while the run stays green. Under CI (the CI environment variable, which
# .ci/run sets) every skip fails the run, with its reason.
_SKIPPED: list = []


def pytest_runtest_logreport(report):
    if report.skipped and not hasattr(report, "wasxfail"):
        _SKIPPED.append((report.nodeid, report.longrepr))


def pytest_collectreport(report):
    if report.skipped:
        _SKIPPED.append((report.nodeid, report.longrepr))


def pytest_sessionfinish(session, exitstatus):
    if _SKIPPED and os.environ.get("CI", "").lower() not in ("", "0", "false", "no"):
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line("")
            reporter.write_sep("=", f"{len(_SKIPPED)} skipped under CI: a skip is a failure here", red=True)
            for nodeid, why in _SKIPPED:
                reason = why[-1] if isinstance(why, tuple) else str(why)
                reporter.write_line(f"SKIPPED (fails under CI) {nodeid}: {reason}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED



@pytest.fixture(scope="module")
def browser():
    """Debian's chromium driven by Playwright, one per test module (KNOWLEDGE section 8)."""
    from playwright import sync_api

    from tests._webapp_helpers import CHROMIUM, CHROMIUM_ARGS

    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()
