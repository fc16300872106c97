"""adapters/runtime.py: the BLAS preload and the runtime report.

Import order matters for the preload, so every preload check runs in a fresh interpreter.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from adapters import runtime

REPO = Path(__file__).resolve().parent.parent
HAVE_OPENBLAS = bool(runtime.candidate_paths()) and sys.platform == "linux"
linux_only = pytest.mark.skipif(sys.platform != "linux", reason="the BLAS preload is for Linux")
needs_openblas = pytest.mark.skipif(
    not HAVE_OPENBLAS, reason="no OpenBLAS on this machine (apt-get install libopenblas0-pthread)")


def _run(code: str, blas: str | None = None, timeout: int = 120) -> dict:
    """Run ``code`` in a fresh interpreter; it must print one JSON line last."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("MTP_CHAT_BLAS", None)
    if blas is not None:
        env["MTP_CHAT_BLAS"] = blas
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=str(REPO), env=env,
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


# Loads adapters/runtime.py alone (importing the ``adapters`` package would preload already).
LOAD_RUNTIME = """
        import importlib.util, json, sys
        spec = importlib.util.spec_from_file_location("rt", "adapters/runtime.py")
        r = importlib.util.module_from_spec(spec); spec.loader.exec_module(r)
"""

PRELOAD_THEN_INFO = LOAD_RUNTIME + """
        st = r.preload_blas()
        info = r.runtime_info()
        print(json.dumps({"state": st, "info": info, "line": r.describe_runtime(info)}, default=str))
"""


def test_runtime_info_in_this_process():
    info = runtime.runtime_info()
    for k in ("os", "machine", "python", "mlx", "mlx_lm", "device", "blas", "blas_preload"):
        assert k in info, k
    assert info["mlx"] and info["mlx_lm"]
    assert info["device"] in ("cpu", "gpu", "gpu (metal)", "gpu (cuda)")
    assert info["blas"]
    line = runtime.describe_runtime(info)
    assert "\n" not in line and "BLAS:" in line and info["mlx"] in line and "device" in line
    assert runtime.describe_runtime()  # computes its own info


@linux_only
def test_off_reports_the_reference_blas():
    out = _run(PRELOAD_THEN_INFO, blas="off")
    assert out["state"]["status"] == "off"
    assert out["state"]["path"] is None
    assert out["info"]["blas"] == runtime.REFERENCE_BLAS
    assert "reference BLAS" in out["line"]


@linux_only
@needs_openblas
def test_auto_loads_openblas():
    out = _run(PRELOAD_THEN_INFO, blas="auto")
    assert out["state"]["status"] == "loaded", out["state"]
    assert "openblas" in out["info"]["blas"].lower()
    assert out["info"]["blas"] == out["state"]["path"]
    assert out["info"]["blas"] in out["line"]


@linux_only
@needs_openblas
def test_importing_adapters_preloads_first():
    out = _run("""
        import json, sys
        import adapters
        from adapters import runtime as r
        print(json.dumps({"state": r.preload_blas(), "blas": r.blas_in_use(),
                          "mlx": "mlx.core" in sys.modules}))
    """)
    assert out["state"]["status"] == "loaded"
    assert "openblas" in out["blas"].lower()


@linux_only
@needs_openblas
def test_explicit_path():
    path = runtime.candidate_paths()[0]
    out = _run(PRELOAD_THEN_INFO, blas=path)
    assert out["state"]["status"] == "loaded"
    assert out["info"]["blas"] == os.path.realpath(path)


@linux_only
def test_bad_path_never_fails():
    out = _run(PRELOAD_THEN_INFO, blas="/nonexistent/libopenblas.so")
    assert out["state"]["status"] == "failed"
    assert "/nonexistent/libopenblas.so" in out["state"]["message"]
    assert out["info"]["blas"] == runtime.REFERENCE_BLAS


@linux_only
def test_a_library_without_cblas_is_refused():
    out = _run(PRELOAD_THEN_INFO, blas="libm.so.6")
    assert out["state"]["status"] == "failed"
    assert "cblas" in out["state"]["message"]


@linux_only
def test_too_late_after_mlx_import_says_so():
    out = _run("""
        import mlx.core
    """ + LOAD_RUNTIME + """
        st = r.preload_blas("auto")
        print(json.dumps({"state": st, "blas": r.blas_in_use(), "line": r.describe_runtime()}))
    """)
    assert out["state"]["status"] == "too_late"
    assert "mlx.core was imported before" in out["state"]["message"]
    assert out["blas"] == runtime.REFERENCE_BLAS
    assert "too_late" in out["line"]


@linux_only
def test_preload_is_idempotent_and_never_raises():
    out = _run(LOAD_RUNTIME + """
        a = r.preload_blas("off")
        b = r.preload_blas("off")
        c = r.preload_blas("   ")      # blank means auto
        d = r.preload_blas(None)       # env / auto
        print(json.dumps({"a": a["status"], "b": b["status"], "same": a is b,
                          "c": c["status"], "d": d["status"]}))
    """)
    assert out["a"] == out["b"] == "off" and out["same"]
    assert out["c"] in ("loaded", "not_found")
    assert out["d"] == out["c"]


def test_candidate_paths_are_strings():
    paths = runtime.candidate_paths()
    assert isinstance(paths, list) and all(isinstance(p, str) for p in paths)
    assert len(set(map(os.path.realpath, paths))) == len(paths)


@linux_only
@needs_openblas
def test_mlx_matmuls_run_in_the_preloaded_openblas():
    # Not a timing (timings live in benchmarks: ~28x on the README's machine). Two BLAS
    # libraries sum a 512-long dot product in different orders, so the same product differs
    # in its last bits: that shows which library MLX's matmul really called.
    code = LOAD_RUNTIME + """
        r.preload_blas()
        import mlx.core as mx
        import numpy as np
        a = mx.random.normal((512, 512), key=mx.random.key(1)); b = mx.random.normal((512, 512), key=mx.random.key(2))
        c = np.array(a @ b)
        print(json.dumps({"c": c[:4, :4].tolist(), "sum": float(np.abs(c).sum()), "bits": c.tobytes().hex()[:4096],
                          "blas": r.blas_in_use()}))
    """
    fast, slow = _run(code, blas="auto"), _run(code, blas="off")
    assert "openblas" in fast["blas"].lower() and slow["blas"] == runtime.REFERENCE_BLAS
    assert fast["bits"] != slow["bits"], "the same bits from both: MLX did not call the preloaded library"
    assert abs(fast["sum"] - slow["sum"]) < 1e-4 * slow["sum"]
    assert all(abs(x - y) < 1e-3 for rf, rs in zip(fast["c"], slow["c"]) for x, y in zip(rf, rs))
