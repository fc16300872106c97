"""Runtime facts and the fast-BLAS preload for MLX on Linux.

The Linux CPU wheel of MLX (``mlx[cpu]``) links the *reference* netlib BLAS it bundles
(``mlx_cpu.libs/libblas-*.so``): a 1024^3 fp32 matmul takes ~0.5 s. Loading an OpenBLAS
into the process with ``RTLD_GLOBAL`` *before* ``mlx.core`` is first imported puts its
``cblas_*`` symbols ahead of the bundled ones, and MLX's matmuls get ~30x faster.

``preload_blas()`` does that, never raises, and records what happened;
``runtime_info()`` / ``describe_runtime()`` report which BLAS and device are in use.

This module must not import ``mlx`` at import time.

Setting (argument, else the ``MTP_CHAT_BLAS`` environment variable, else ``auto``):

- ``auto``: look for an OpenBLAS (Debian/Ubuntu ``libopenblas0-pthread``, other distros'
  paths, ``ctypes.util.find_library``, conda, a pip-installed ``cmeel-openblas`` /
  ``ngsolve-openblas`` wheel) and load the first that loads;
- ``off``: load nothing (MLX keeps its bundled reference BLAS);
- a path to a BLAS library: load exactly that one.

On Debian/Ubuntu: ``apt-get install libopenblas0-pthread``. The pip wheels ``cmeel-openblas``
and ``ngsolve-openblas`` export unprefixed ``cblas_*`` symbols but need the system's
``libgfortran.so.5``; numpy's and scipy-openblas' copies are symbol-prefixed and useless here.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import glob
import logging
import os
import platform
import sys
import sysconfig
from pathlib import Path
from typing import Optional

log = logging.getLogger("mtp_chat.runtime")

ENV_VAR = "MTP_CHAT_BLAS"
REFERENCE_BLAS = "reference BLAS bundled with mlx (slow)"

# Module state: what the (first) preload did. Also kept on ``sys`` so that a second copy of
# this module (loaded under another name) sees the same facts.
_STATE_ATTR = "_mtp_chat_blas_state"
_HANDLES: list = []  # keep loaded libraries alive


def _state() -> Optional[dict]:
    return getattr(sys, _STATE_ATTR, None)


def _set_state(st: dict) -> dict:
    setattr(sys, _STATE_ATTR, st)
    return st


def _multiarch() -> str:
    m = platform.machine().lower()
    return {"x86_64": "x86_64-linux-gnu", "amd64": "x86_64-linux-gnu",
            "aarch64": "aarch64-linux-gnu", "arm64": "aarch64-linux-gnu",
            "ppc64le": "powerpc64le-linux-gnu", "s390x": "s390x-linux-gnu"}.get(m, f"{m}-linux-gnu")


def candidate_paths() -> list[str]:
    """OpenBLAS libraries that exist on this machine, best first (no duplicates)."""
    ma = _multiarch()
    patterns = [
        # Debian / Ubuntu (libopenblas0-pthread, -openmp, -serial)
        f"/usr/lib/{ma}/openblas-pthread/libopenblas*.so*",
        f"/usr/lib/{ma}/openblas-openmp/libopenblas*.so*",
        f"/usr/lib/{ma}/openblas-serial/libopenblas*.so*",
        f"/usr/lib/{ma}/libopenblas*.so*",
        # Fedora / RHEL / openSUSE (openblas-pthreads, openblas-openmp, openblas)
        "/usr/lib64/libopenblasp.so*",
        "/usr/lib64/libopenblaso.so*",
        "/usr/lib64/libopenblas.so*",
        "/usr/lib64/openblas-pthreads/libopenblas*.so*",
        "/usr/lib64/openblas/libopenblas*.so*",
        # Arch, Alpine, Gentoo, generic
        "/usr/lib/libopenblasp.so*",
        "/usr/lib/libopenblas.so*",
        "/usr/local/lib/libopenblas*.so*",
        "/opt/OpenBLAS/lib/libopenblas*.so*",
    ]
    prefix = os.environ.get("CONDA_PREFIX")
    if prefix:
        patterns.insert(0, os.path.join(prefix, "lib", "libopenblas*.so*"))
    # pip wheels with unprefixed symbols (need the system's libgfortran.so.5)
    for sp in {sysconfig.get_paths().get("purelib"), sysconfig.get_paths().get("platlib")}:
        if sp:
            patterns.append(os.path.join(sp, "cmeel.prefix", "lib", "libopenblas.so*"))
            patterns.append(os.path.join(sp, "ngsolve_openblas", "libopenblas*.so*"))
    seen, out = set(), []
    for pat in patterns:
        for p in sorted(glob.glob(pat), key=lambda s: (len(s), s)):
            if ".so" not in os.path.basename(p) or not os.path.isfile(p):
                continue
            real = os.path.realpath(p)
            if real in seen:
                continue
            seen.add(real)
            out.append(p)
    found = ctypes.util.find_library("openblas")
    if found:
        # find_library gives a soname; keep it as a last resort (dlopen searches for it).
        if not any(os.path.basename(p) == found for p in out):
            out.append(found)
    return out


def _has_cblas(handle) -> bool:
    try:
        handle.cblas_sgemm  # noqa: B018
        return True
    except AttributeError:
        return False


def _try_load(path: str) -> tuple[Optional[object], Optional[str]]:
    try:
        if "cmeel.prefix" in path or "ngsolve_openblas" in path:
            gf = ctypes.util.find_library("gfortran")
            if gf:
                try:
                    _HANDLES.append(ctypes.CDLL(gf, mode=ctypes.RTLD_GLOBAL))
                except OSError:
                    pass
        h = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError as e:
        return None, str(e)
    if not _has_cblas(h):
        return None, "no cblas_sgemm symbol (prefixed or not a BLAS)"
    return h, None


def preload_blas(setting: Optional[str] = None) -> dict:
    """Load a fast BLAS with RTLD_GLOBAL before ``mlx.core`` is imported. Never raises.

    Returns a dict: ``status`` ("loaded", "off", "not_found", "failed", "too_late",
    "not_needed"), ``path`` (the loaded library or None), ``setting``, ``message``,
    ``tried`` (list of (path, error)). Repeated calls return the first result unless a
    different setting is asked for before ``mlx.core`` is imported.
    """
    try:
        return _preload(setting)
    except Exception as e:  # noqa: BLE001 - never fail
        return _set_state({"status": "failed", "path": None, "setting": setting,
                           "message": f"BLAS preload error: {e!r}", "tried": []})


def _preload(setting: Optional[str]) -> dict:
    if setting is None:
        setting = os.environ.get(ENV_VAR, "auto")
    setting = (setting or "").strip() or "auto"
    key = setting.lower()
    prev = _state()
    if prev is not None and (prev["setting"] == setting or prev["status"] == "loaded"):
        return prev

    if sys.platform != "linux":
        what = "Accelerate" if sys.platform == "darwin" else "the BLAS mlx was built with"
        return _set_state({"status": "not_needed", "path": None, "setting": setting,
                           "message": f"{sys.platform}: mlx uses {what}", "tried": []})
    if key in ("off", "none", "0", "false", "no", "reference"):
        return _set_state({"status": "off", "path": None, "setting": setting,
                           "message": f"BLAS preload off ({ENV_VAR}={setting}): {REFERENCE_BLAS}",
                           "tried": []})
    if "mlx.core" in sys.modules:
        msg = ("mlx.core was imported before the BLAS preload: this process keeps the BLAS "
               "it started with. Import `adapters` (or call adapters.runtime.preload_blas()) "
               "before anything imports mlx.")
        log.warning(msg)
        return _set_state({"status": "too_late", "path": None, "setting": setting,
                           "message": msg, "tried": []})

    if key == "auto":
        cands = candidate_paths()
    else:
        cands = [os.path.expanduser(setting)]
    tried = []
    for path in cands:
        h, err = _try_load(path)
        if h is not None:
            _HANDLES.append(h)
            real = os.path.realpath(path) if os.path.exists(path) else path
            return _set_state({"status": "loaded", "path": real, "setting": setting,
                               "message": f"OpenBLAS preloaded: {real}", "tried": tried})
        tried.append((path, err))
    if key == "auto":
        msg = ("no OpenBLAS found: mlx uses its bundled reference BLAS (matmuls ~30x slower). "
               "Install it with `apt-get install libopenblas0-pthread` (Debian/Ubuntu), "
               "`dnf install openblas-pthreads` (Fedora) or `pacman -S openblas` (Arch), "
               f"or set {ENV_VAR}=/path/to/libopenblas.so.")
        status = "not_found"
        log.info(msg)
    else:
        msg = f"could not load {ENV_VAR}={setting}: {tried[-1][1] if tried else '?'}; using {REFERENCE_BLAS}"
        status = "failed"
        log.warning(msg)
    return _set_state({"status": status, "path": None, "setting": setting, "message": msg,
                       "tried": tried})


# --------------------------------------------------------------------------- reporting
class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def _global_cblas_provider() -> Optional[str]:
    """The file that provides ``cblas_sgemm`` in the process' global symbol scope, if any."""
    try:
        proc = ctypes.CDLL(None)
        fn = proc.cblas_sgemm
    except (OSError, AttributeError):
        return None
    try:
        dladdr = proc.dladdr
    except AttributeError:
        try:
            dladdr = ctypes.CDLL(ctypes.util.find_library("dl") or "libdl.so.2").dladdr
        except (OSError, AttributeError):
            return None
    dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    dladdr.restype = ctypes.c_int
    info = _DlInfo()
    if not dladdr(ctypes.cast(fn, ctypes.c_void_p), ctypes.byref(info)) or not info.dli_fname:
        return None
    return os.path.realpath(info.dli_fname.decode(errors="replace"))


def _mapped_libs() -> list[str]:
    try:
        with open("/proc/self/maps") as f:
            return sorted({line.split()[-1] for line in f if ".so" in line and "/" in line})
    except OSError:
        return []


def blas_in_use() -> str:
    """Which BLAS mlx's matmuls use in this process (a path, 'Accelerate' or the reference)."""
    if sys.platform == "darwin":
        return "Accelerate"
    if sys.platform != "linux":
        return "unknown"
    provider = _global_cblas_provider()
    if provider and "mlx_cpu.libs" not in provider:
        return provider
    return REFERENCE_BLAS


def _version(dist: str) -> Optional[str]:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:  # noqa: BLE001
        return None


def runtime_info() -> dict:
    """OS, machine, Python, mlx / mlx-lm versions, device and BLAS in use."""
    if "mlx.core" not in sys.modules:
        preload_blas()  # importing mlx below would otherwise lock in the reference BLAS
    info = {
        "os": f"{platform.system()} {platform.release()}",
        "machine": platform.machine(),
        "python": platform.python_version(),
        "mlx": _version("mlx"),
        "mlx_lm": _version("mlx-lm"),
        "device": "unknown",
        "blas": None,
        "blas_preload": dict(_state() or {}),
    }
    try:
        import mlx.core as mx

        info["mlx"] = getattr(mx, "__version__", None) or info["mlx"]
        dev = mx.default_device()
        if dev.type == mx.gpu:
            if sys.platform == "darwin":
                info["device"] = "gpu (metal)"
            else:
                cuda = False
                try:
                    cuda = bool(mx.cuda.is_available())
                except Exception:  # noqa: BLE001
                    cuda = _version("mlx-cuda") is not None or any(
                        (_version(d) is not None) for d in ("mlx-cuda-12", "mlx-cuda-13"))
                info["device"] = "gpu (cuda)" if cuda else "gpu"
        else:
            info["device"] = "cpu"
    except Exception as e:  # noqa: BLE001
        info["device"] = f"unavailable ({e.__class__.__name__}: {e})"
    info["blas"] = blas_in_use()
    return info


def describe_runtime(info: Optional[dict] = None) -> str:
    """One line, e.g. ``mlx 0.32.4 / mlx-lm 0.32.2 on Linux x86_64 (Python 3.11.2), device cpu, BLAS: ...``."""
    i = info or runtime_info()
    line = (f"mlx {i.get('mlx')} / mlx-lm {i.get('mlx_lm')} on {i.get('os', '').split()[0]} "
            f"{i.get('machine')} (Python {i.get('python')}), device {i.get('device')}, "
            f"BLAS: {i.get('blas')}")
    st = i.get("blas_preload") or {}
    if st.get("status") in ("too_late", "failed", "not_found"):
        line += f" [{st.get('status')}: set up OpenBLAS, see adapters/runtime.py]"
    return line


if __name__ == "__main__":  # python -m adapters.runtime
    import json

    r = runtime_info()
    print(describe_runtime(r))
    print(json.dumps(r, indent=2, default=str))
