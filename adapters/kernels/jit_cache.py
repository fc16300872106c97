"""Our CUDA kernels compiled once per machine, not once per process.

Why: MLX CUDA builds an `mx.fast.cuda_kernel` variant with NVRTC the first time a process
launches it and keeps the result in memory only (mlx/backend/cuda/custom_kernel.cpp asks
get_jit_module for no disk cache), while its own kernels go to MLX_PTX_CACHE_DIR. On the H200
that cost every server start 14-20 s in the kernels' load check, and the first long-context turn
4-6 s more (past 16k keys a verify's attention takes one template per row count):
docs/bench/2026-12-03/GPU.md, section 11. MLX *reads* that folder for every module it builds,
custom kernels included (jit_module.cpp: read_cached_ptx, then compile only on a miss). So before
a variant's first launch in a process, `Kernel` makes sure its entry is there, written once per
machine: the cubin NVRTC makes of the source MLX would build for it (`mlx_source`, MLX's
build_kernel transliterated), under the name MLX looks it up by (`<kernel>_<std::hash of that
source, hex>.ptx`, and a `.txt` naming the kernel's symbol).

What is compiled is MLX's source with its first include (mlx/backend/cuda/device/utils.cuh,
which the wheels do not ship) replaced by what our kernels take from it: the CUDA half types and
the Shape / Strides parameter types (cuda::std::array of MAX_NDIM elements, declared as utils.cuh
declares them, so the arguments MLX passes fit). The options are MLX's (jit_module.cpp), so the
code is the code MLX would have made: scripts/gpu/nvrtc_check.py --prelude compares the two
compilers' PTX for every variant. Where anything is missing (no NVRTC, no headers, no cache
folder) nothing is written and MLX compiles as before; a variant whose entry cannot be written
is not tried again in the process.
"""
from __future__ import annotations

import ctypes
import os
import re
import sys
import tempfile
import threading
from functools import lru_cache
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import mlx.core as mx

ENV = "MLX_PTX_CACHE_DIR"
MAX_NDIM = 10                 # mlx/backend/cuda/device/config.h
MAX_FILE_NAME = 245           # jit_module.cpp get_ptx_path: longer module names become folders
DEFAULT_HEADER = """
#include "mlx/backend/cuda/device/utils.cuh"

#include <cooperative_groups.h>

"""
# What replaces utils.cuh in the source we compile: its includes our kernels rely on, and the
# two parameter types MLX's signature names (utils.cuh declares them so).
PRELUDE = f"""
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda/std/array>
#include <cuda/std/limits>
namespace mlx::core::cu {{
using Shape = cuda::std::array<int32_t, {MAX_NDIM}>;
using Strides = cuda::std::array<int64_t, {MAX_NDIM}>;
}}
"""
SEED_HEADER = PRELUDE + "\n#include <cooperative_groups.h>\n\n"   # DEFAULT_HEADER with utils.cuh replaced


# ------------------------------------------------------------ MLX's names and source, transliterated
def cuda_type(dt) -> str:
    """mlx/backend/cuda/utils.cpp dtype_to_cuda_type."""
    return {mx.bool_: "bool", mx.int8: "int8_t", mx.int16: "int16_t", mx.int32: "int32_t", mx.int64: "int64_t",
            mx.uint8: "uint8_t", mx.uint16: "uint16_t", mx.uint32: "uint32_t", mx.uint64: "uint64_t",
            mx.float16: "__half", mx.bfloat16: "__nv_bfloat16", mx.float32: "float", mx.float64: "double",
            mx.complex64: "mlx::core::cu::complex64_t"}[dt]


def type_string(dt) -> str:
    """mlx/backend/common/compiled.cpp get_type_string (the kernel name's dtype part)."""
    return {mx.float32: "float", mx.float16: "float16_t", mx.bfloat16: "bfloat16_t", mx.float64: "double",
            mx.complex64: "complex64_t"}.get(dt) or cuda_type(dt)


def kernel_name(name: str, template: Sequence[tuple]) -> str:
    """custom_kernel.cpp: "custom_kernel_" + name + template_arguments_hash(template)."""
    h = ""
    for _, a in template:
        if isinstance(a, bool):
            h += "_t" if a else "_f"
        elif isinstance(a, int):
            h += f"_{a}"
        else:
            h += "_" + type_string(a)
    return "custom_kernel_" + name + h


def mlx_source(func: str, spec: dict, inputs: Sequence[Tuple[object, int]], output_dtypes: Sequence,
               template: Sequence[tuple], default_header: str = DEFAULT_HEADER) -> str:
    """custom_kernel.cpp build_kernel: the source MLX compiles for one launch. `spec`: the
    kernel's name, input_names, output_names, source, header; `inputs`: (dtype, ndim) each."""
    src = spec["source"]
    s = default_header + spec["header"] + "namespace mlx::core::cu {\n\nnamespace cg = cooperative_groups;\n\n"
    s += f"__global__ void {func}(\n"
    for name, (dt, ndim) in zip(spec["input_names"], inputs):
        s += f"    const {cuda_type(dt)}* {name},\n"
        if ndim > 0:
            if name + "_shape" in src:
                s += f"    const __grid_constant__ Shape {name}_shape,\n"
            if name + "_strides" in src:
                s += f"    const __grid_constant__ Strides {name}_strides,\n"
            if name + "_ndim" in src:
                s += f"    const __grid_constant__ int {name}_ndim,\n"
    outs = spec["output_names"]
    for i, (name, dt) in enumerate(zip(outs, output_dtypes)):
        s += f"    {cuda_type(dt)}* {name}" + (",\n" if i < len(outs) - 1 else ") {\n")
    if template:
        for n, a in template:
            if isinstance(a, bool):
                s += f"  constexpr bool {n} = {'true' if a else 'false'};\n"
            elif isinstance(a, int):
                s += f"  constexpr int {n} = {a};\n"
            else:
                s += f"  using {n} = {cuda_type(a)};\n"
        s += "\n"
    return s + src + "\n}\n\n} // namespace mlx::core::cu\n"


def std_hash(data: bytes) -> int:
    """libstdc++'s std::hash<std::string> on 64-bit (_Hash_bytes, seed 0xc70f6907): what MLX's
    module names carry (custom_kernel.cpp: fmt "{}_{:x}" of the name and the source's hash)."""
    m64 = (1 << 64) - 1
    mul = (0xC6A4A793 << 32) + 0x5BD1E995

    def shift_mix(v: int) -> int:
        return v ^ (v >> 47)

    n = len(data)
    h = (0xC70F6907 ^ (n * mul)) & m64
    whole = n & ~7
    for i in range(0, whole, 8):
        h = ((h ^ ((shift_mix((int.from_bytes(data[i:i + 8], "little") * mul) & m64) * mul) & m64)) * mul) & m64
    if n & 7:
        h = ((h ^ int.from_bytes(data[whole:], "little")) * mul) & m64
    h = (shift_mix(h) * mul) & m64
    return shift_mix(h)


def module_name(func: str, source: str) -> str:
    return f"{func}_{std_hash(source.encode()):x}"


def entry_path(folder: Path, module: str) -> Path:
    """jit_module.cpp get_ptx_path: the .ptx file MLX reads for `module` (a name past 245
    characters is cut into folders of 245)."""
    path, at = Path(folder), 0
    while len(module) - at > MAX_FILE_NAME:
        path /= module[at:at + MAX_FILE_NAME]
        at += MAX_FILE_NAME
    return path / (module[at:] + ".ptx")


# ------------------------------------------------------------------------------------- NVRTC
class Nvrtc:
    """NVRTC through ctypes: the library MLX itself loads (or a given one)."""

    def __init__(self, path: str):
        self.lib = ctypes.CDLL(path)
        L = self.lib
        L.nvrtcGetErrorString.restype = ctypes.c_char_p
        L.nvrtcCreateProgram.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p, ctypes.c_char_p,
                                         ctypes.c_int, ctypes.POINTER(ctypes.c_char_p),
                                         ctypes.POINTER(ctypes.c_char_p)]
        L.nvrtcCompileProgram.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        for f in ("nvrtcGetProgramLogSize", "nvrtcGetPTXSize", "nvrtcGetCUBINSize"):
            getattr(L, f).argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
        for f in ("nvrtcGetProgramLog", "nvrtcGetPTX", "nvrtcGetCUBIN"):
            getattr(L, f).argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        L.nvrtcDestroyProgram.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        L.nvrtcAddNameExpression.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        L.nvrtcGetLoweredName.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p)]

    def pch_heap(self, size: int) -> bool:
        # automatic precompiled headers (NVRTC >= 12.4): the first compile of a run parses the
        # headers once; every later one reuses them
        f = getattr(self.lib, "nvrtcSetPCHHeapSize", None)
        if f is None:
            return False
        f.argtypes = [ctypes.c_size_t]
        return f(size) == 0

    def version(self) -> Tuple[int, int]:
        a, b = ctypes.c_int(), ctypes.c_int()
        self.lib.nvrtcVersion(ctypes.byref(a), ctypes.byref(b))
        return a.value, b.value

    def _check(self, rc, what):
        if rc != 0:
            raise RuntimeError(f"{what}: {self.lib.nvrtcGetErrorString(rc).decode()}")

    def _get(self, prog, size_fn, get_fn):
        n = ctypes.c_size_t()
        self._check(getattr(self.lib, size_fn)(prog, ctypes.byref(n)), size_fn)
        buf = ctypes.create_string_buffer(n.value)
        self._check(getattr(self.lib, get_fn)(prog, buf), get_fn)
        return buf.raw

    def compile(self, source: str, name: str, options, kernel_names=()):
        """-> (ok, log, ptx bytes or None, cubin bytes or None, {name: lowered})"""
        prog = ctypes.c_void_p()
        self._check(self.lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), (name + ".cu").encode(),
                                                0, None, None), "nvrtcCreateProgram")
        try:
            for k in kernel_names:
                self._check(self.lib.nvrtcAddNameExpression(prog, k.encode()), "nvrtcAddNameExpression")
            opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
            rc = self.lib.nvrtcCompileProgram(prog, len(options), opts)
            log = self._get(prog, "nvrtcGetProgramLogSize", "nvrtcGetProgramLog").rstrip(b"\0").decode(errors="replace")
            if rc != 0:
                return False, log, None, None, {}
            lowered = {}
            for k in kernel_names:
                p = ctypes.c_char_p()
                self._check(self.lib.nvrtcGetLoweredName(prog, k.encode(), ctypes.byref(p)), "nvrtcGetLoweredName")
                lowered[k] = p.value.decode()
            ptx = cubin = None
            try:
                cubin = self._get(prog, "nvrtcGetCUBINSize", "nvrtcGetCUBIN")
            except RuntimeError:
                pass
            try:
                ptx = self._get(prog, "nvrtcGetPTXSize", "nvrtcGetPTX")
            except RuntimeError:
                pass
            return True, log, ptx, cubin, lowered
        finally:
            self.lib.nvrtcDestroyProgram(ctypes.byref(prog))


def mlx_include_paths() -> List[str]:
    """jit_module.cpp include_path_args: the wheel's include folder, its CCCL, and the CUDA
    headers of the nvidia wheel beside it (cu13, or cuda_runtime for CUDA 12), else CUDA_HOME's."""
    root = Path(mx.__file__).resolve().parent          # site-packages/mlx (libmlx.so is in lib/)
    paths = []
    if (root / "include").is_dir():
        paths.append(root / "include")
        if (root / "include" / "cccl").is_dir():
            paths.append(root / "include" / "cccl")
    for sub in ("cu13", "cuda_runtime"):
        if (root.parent / "nvidia" / sub / "include").is_dir():
            paths.append(root.parent / "nvidia" / sub / "include")
            break
    else:
        home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
        if (Path(home) / "include").is_dir():
            paths.append(Path(home) / "include")
    return [str(p) for p in paths]


def _find_nvrtc() -> Optional[str]:
    """The NVRTC MLX loads (already in the process: dlopen by its soname finds it), else the
    nvidia wheel's."""
    root = Path(mx.__file__).resolve().parent.parent / "nvidia"
    for soname, sub in (("libnvrtc.so.13", "cu13/lib"), ("libnvrtc.so.12", "cuda_nvrtc/lib")):
        for candidate in (soname, str(root / sub / soname)):
            try:
                ctypes.CDLL(candidate)
                return candidate
            except OSError:
                continue
    return None


def architecture_option() -> Optional[str]:
    """MLX's --gpu-architecture: sm_<major><minor>, with "a" from compute capability 9."""
    from ..kernel_cache import gpu_architecture   # "NVIDIA-H200-sm90"

    arch = gpu_architecture()
    m = re.search(r"-sm(\d+)(\d)$", arch or "")
    if not m:
        return None
    major = int(m.group(1))
    return f"--gpu-architecture=sm_{major}{m.group(2)}{'a' if major >= 9 else ''}"


@lru_cache(maxsize=None)
def compiler() -> Optional[Tuple[Nvrtc, Tuple[str, ...]]]:
    """(NVRTC, MLX's options) on a machine that can seed the cache, else None."""
    if not os.environ.get(ENV) or sys.platform != "linux":
        return None
    try:
        if not mx.cuda.is_available():
            return None
        lib, arch = _find_nvrtc(), architecture_option()
        if lib is None or arch is None:
            return None
        return Nvrtc(lib), ("--device-as-default-execution-space", arch,
                            *(f"--include-path={p}" for p in mlx_include_paths()))
    except Exception:  # noqa: BLE001  (no seeding: MLX compiles as it always did)
        return None


# ------------------------------------------------------------------------------ the kernels
stats: Dict[str, int] = {"present": 0, "written": 0, "failed": 0}
errors: List[str] = []          # the first few compile failures, for whoever asks
_lock = threading.Lock()


def seed(spec: dict, inputs: Sequence[Tuple[object, int]], output_dtypes: Sequence, template: Sequence[tuple],
         folder: Optional[str] = None, tools: Optional[Tuple[Nvrtc, Tuple[str, ...]]] = None) -> str:
    """Make sure MLX's cache holds this launch's module: "present", "written", "failed" or "off"."""
    folder = folder or os.environ.get(ENV)
    tools = tools or compiler()
    if not folder or tools is None:
        return "off"
    func = kernel_name(spec["name"], template)
    path = entry_path(Path(folder), module_name(func, mlx_source(func, spec, inputs, output_dtypes, template)))
    if path.is_file():
        stats["present"] += 1
        return "present"
    nv, options = tools
    ours = mlx_source(func, spec, inputs, output_dtypes, template, default_header=SEED_HEADER)
    symbol = "mlx::core::cu::" + func
    try:
        ok, log, _, cubin, lowered = nv.compile(ours, func, list(options), [symbol])
        if not ok or not cubin:
            raise RuntimeError(log.strip()[-400:] or "no cubin")
        path.parent.mkdir(parents=True, exist_ok=True)
        # The .txt first: MLX reads the .ptx's presence as the entry's, then its symbols.
        _write(path.with_suffix(".txt"), f"{symbol}\t{lowered[symbol]}\n".encode())
        _write(path, cubin)
    except Exception as exc:  # noqa: BLE001  (MLX compiles it itself, as before)
        stats["failed"] += 1
        if len(errors) < 4:
            errors.append(f"{func}: {type(exc).__name__}: {exc}")
        return "failed"
    stats["written"] += 1
    return "written"


def _write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".seed-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)   # whole or absent: another process may be reading the folder
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


class Kernel:
    """mx.fast.cuda_kernel's kernel, with each variant's compiled module seeded in MLX's cache
    before its first launch in the process (`seed`). Called as MLX's is (keyword arguments).
    Inside mx.compile the call happens once, at tracing: replays pay nothing."""

    def __init__(self, name: str, input_names, output_names, source: str, header: str = "",
                 ensure_row_contiguous: bool = True):
        self.spec = dict(name=name, input_names=list(input_names), output_names=list(output_names),
                         source=source, header=header)
        self._kernel = mx.fast.cuda_kernel(name=name, input_names=input_names, output_names=output_names,
                                           source=source, header=header, ensure_row_contiguous=ensure_row_contiguous)
        self._seen = set()
        self._seeding: Optional[bool] = None    # whether this machine seeds (decided on the first call)

    def __call__(self, *, inputs, output_shapes, output_dtypes, grid, threadgroup, template=(), **kw):
        if self._seeding is None:
            self._seeding = compiler() is not None
        if self._seeding:   # ~1 us a launch outside mx.compile's traces
            self._seed(template, inputs, output_dtypes)
        return self._kernel(inputs=inputs, output_shapes=output_shapes, output_dtypes=output_dtypes, grid=grid,
                            threadgroup=threadgroup, template=list(template), **kw)

    def _seed(self, template, inputs, output_dtypes) -> None:
        key = (tuple(template), tuple((a.dtype, a.ndim) for a in inputs), tuple(output_dtypes))
        if key not in self._seen:
            with _lock:
                if key not in self._seen:
                    try:
                        seed(self.spec, key[1], key[2], key[0])
                    except Exception as exc:  # noqa: BLE001  (a launch never fails for its cache entry)
                        stats["failed"] += 1
                        if len(errors) < 4:
                            errors.append(f"{self.spec['name']}: {type(exc).__name__}: {exc}")
                    self._seen.add(key)


def cuda_kernel(name: str, input_names, output_names, source: str, header: str = "",
                ensure_row_contiguous: bool = True) -> Kernel:
    """What the kernel modules call instead of mx.fast.cuda_kernel."""
    return Kernel(name, input_names, output_names, source, header, ensure_row_contiguous)
