"""adapters/kernels/jit_cache.py: our CUDA kernels' compiled modules written where MLX CUDA
looks for them, under the names it looks them up by. The compiler itself runs only where NVRTC
is (scripts/gpu/nvrtc_check.py --prelude compares its PTX with MLX's own source's); here the
names, the source, the files and the wrapper, with a stand-in compiler."""
from __future__ import annotations

import mlx.core as mx
import pytest

from adapters.kernels import cuda_attention, cuda_qmm, gdn, gdn_fused, jit_cache as jc

# std::hash<std::string> of these, from a C++ program built with g++ (libstdc++, x86-64)
GPP_HASHES = {b"": 0x553e93901e462a6e, b"a": 0x454ddee488c1ed6b, b"abcdefg": 0xdeee6830a3af82af,
              b"abcdefgh": 0x783db3e38db898bb, b"abcdefghi": 0xb4ec9257851c8aaf,
              b"custom_kernel_mtp_qmv_res_0123456789_bfloat16_t_4_64_1_2_0_1": 0x343ab0c293593242,
              "namespace mlx::core::cu {\n\n\u00e9 long text here with unicode".encode(): 0xc8d8eea43866dd86}

SPEC = dict(name="k", input_names=["x", "w", "s"], output_names=["y", "z"],
            source="  y[0] = x[x_shape[0]] + w[w_strides[1]] * x_ndim;", header="#define H 1\n")


def test_the_module_names_hash_is_libstdcxx_stdhash():
    assert {k: jc.std_hash(k) for k in GPP_HASHES} == GPP_HASHES


def test_kernel_names_and_source_are_mlx_build_kernels():
    tmpl = [("T", mx.bfloat16), ("BITS", 4), ("ON", True), ("OFF", False), ("F", mx.float32), ("H", mx.float16)]
    func = jc.kernel_name("k", tmpl)
    assert func == "custom_kernel_k_bfloat16_t_4_t_f_float_float16_t"
    src = jc.mlx_source(func, SPEC, [(mx.bfloat16, 2), (mx.uint32, 2), (mx.float32, 0)], [mx.bfloat16, mx.float32], tmpl)
    assert src == (
        '\n#include "mlx/backend/cuda/device/utils.cuh"\n\n#include <cooperative_groups.h>\n\n'
        "#define H 1\n"
        "namespace mlx::core::cu {\n\nnamespace cg = cooperative_groups;\n\n"
        f"__global__ void {func}(\n"
        "    const __nv_bfloat16* x,\n"
        "    const __grid_constant__ Shape x_shape,\n"
        "    const __grid_constant__ int x_ndim,\n"
        "    const uint32_t* w,\n"
        "    const __grid_constant__ Strides w_strides,\n"
        "    const float* s,\n"                          # 0-d: no shape arguments, as MLX
        "    __nv_bfloat16* y,\n"
        "    float* z) {\n"
        "  using T = __nv_bfloat16;\n  constexpr int BITS = 4;\n  constexpr bool ON = true;\n"
        "  constexpr bool OFF = false;\n  using F = float;\n  using H = __half;\n\n"
        + SPEC["source"] + "\n}\n\n} // namespace mlx::core::cu\n")
    seeded = jc.mlx_source(func, SPEC, [(mx.bfloat16, 2), (mx.uint32, 2), (mx.float32, 0)], [mx.bfloat16, mx.float32],
                           tmpl, default_header=jc.SEED_HEADER)
    assert seeded == src.replace(jc.DEFAULT_HEADER, jc.SEED_HEADER) and "utils.cuh" not in seeded
    assert jc.module_name(func, src) == f"{func}_{jc.std_hash(src.encode()):x}"


def test_long_module_names_become_folders_as_mlx_cuts_them(tmp_path):
    assert jc.entry_path(tmp_path, "m" * 245) == tmp_path / ("m" * 245 + ".ptx")
    name = "a" * 245 + "b" * 245 + "c" * 7
    assert jc.entry_path(tmp_path, name) == tmp_path / ("a" * 245) / ("b" * 245) / ("c" * 7 + ".ptx")


class FakeNvrtc:
    """NVRTC's part in seed(): the source it was given, a cubin, the kernel's lowered symbol."""

    def __init__(self, ok=True):
        self.ok, self.sources = ok, []

    def compile(self, source, name, options, kernel_names=()):
        self.sources.append((source, list(options)))
        if not self.ok:
            return False, "error: identifier undefined", None, None, {}
        return True, "", b"ptx", b"CUBIN:" + name.encode(), {k: "_Z" + k.replace(":", "") for k in kernel_names}


def test_an_entry_is_written_once_under_mlxs_name_with_its_symbol(tmp_path, monkeypatch):
    for k in jc.stats:
        monkeypatch.setitem(jc.stats, k, 0)
    nv = FakeNvrtc()
    tools = (nv, ("--device-as-default-execution-space", "--gpu-architecture=sm_90a"))
    tmpl, inputs, outs = [("T", mx.bfloat16), ("R", 3)], [(mx.bfloat16, 2), (mx.uint32, 2), (mx.float32, 1)], [mx.bfloat16,
                                                                                                             mx.float32]
    assert jc.seed(SPEC, inputs, outs, tmpl, folder=str(tmp_path), tools=tools) == "written"
    func = jc.kernel_name("k", tmpl)
    path = jc.entry_path(tmp_path, jc.module_name(func, jc.mlx_source(func, SPEC, inputs, outs, tmpl)))
    assert path.read_bytes() == b"CUBIN:" + func.encode()
    symbol = "mlx::core::cu::" + func
    assert path.with_suffix(".txt").read_text() == f"{symbol}\t_Z{symbol.replace(':', '')}\n"   # read_cached_ptx's format
    compiled, options = nv.sources[0]
    assert compiled.startswith(jc.SEED_HEADER) and options[1] == "--gpu-architecture=sm_90a"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".seed-")] == []   # nothing half-written left
    # Another process, or this one again: the entry is there, nothing compiles.
    assert jc.seed(SPEC, inputs, outs, tmpl, folder=str(tmp_path), tools=tools) == "present" and len(nv.sources) == 1
    # Another variant (one template value): another entry.
    assert jc.seed(SPEC, inputs, outs, [("T", mx.bfloat16), ("R", 4)], folder=str(tmp_path), tools=tools) == "written"
    assert jc.stats == {"present": 1, "written": 2, "failed": 0}


def test_a_failed_compile_writes_nothing_and_says_why(tmp_path, monkeypatch):
    monkeypatch.setattr(jc, "errors", [])
    monkeypatch.setitem(jc.stats, "failed", 0)
    got = jc.seed(SPEC, [(mx.float32, 1)] * 3, [mx.float32] * 2, [], folder=str(tmp_path), tools=(FakeNvrtc(ok=False), ()))
    assert got == "failed" and list(tmp_path.iterdir()) == [] and jc.stats["failed"] == 1
    assert "identifier undefined" in jc.errors[0] and jc.errors[0].startswith("custom_kernel_k:")


def test_without_cuda_or_a_cache_folder_nothing_is_seeded(tmp_path, monkeypatch):
    jc.compiler.cache_clear()
    monkeypatch.setenv(jc.ENV, str(tmp_path))
    assert jc.compiler() is None                  # this machine has no MLX CUDA
    jc.compiler.cache_clear()
    assert jc.seed(SPEC, [(mx.float32, 1)] * 3, [mx.float32] * 2, [], folder=None, tools=None) == "off"
    monkeypatch.delenv(jc.ENV)
    assert jc.seed(SPEC, [(mx.float32, 1)] * 3, [mx.float32] * 2, [], tools=(FakeNvrtc(), ())) == "off"
    assert list(tmp_path.iterdir()) == []


def test_the_wrapper_seeds_each_variant_once_and_launches_as_mlx(monkeypatch):
    made, launched, seeded = [], [], []

    def fake_cuda_kernel(**kw):
        made.append(kw)
        return lambda **call: launched.append(call) or ["out"]

    monkeypatch.setattr(mx.fast, "cuda_kernel", fake_cuda_kernel)
    monkeypatch.setattr(jc, "seed", lambda spec, inputs, outs, tmpl: seeded.append((inputs, outs, tmpl)))
    monkeypatch.setattr(jc, "compiler", lambda: (FakeNvrtc(), ()))   # a machine that seeds
    k = jc.cuda_kernel("k", ["x"], ["y"], "y[0] = x[0];", header="#define A\n", ensure_row_contiguous=False)
    assert made == [dict(name="k", input_names=["x"], output_names=["y"], source="y[0] = x[0];", header="#define A\n",
                         ensure_row_contiguous=False)]
    x = mx.zeros((2, 3), mx.bfloat16)
    for rows in (3, 3, 4):
        assert k(inputs=[x], output_shapes=[(2, 3)], output_dtypes=[mx.bfloat16], grid=(32, 1, 1),
                 threadgroup=(32, 1, 1), template=[("R", rows)], init_value=0.0) == ["out"]
    assert seeded == [(((mx.bfloat16, 2),), (mx.bfloat16,), (("R", 3),)), (((mx.bfloat16, 2),), (mx.bfloat16,), (("R", 4),))]
    assert launched[0] == dict(inputs=[x], output_shapes=[(2, 3)], output_dtypes=[mx.bfloat16], grid=(32, 1, 1),
                               threadgroup=(32, 1, 1), template=[("R", 3)], init_value=0.0)
    monkeypatch.setattr(jc, "compiler", lambda: None)   # one that does not: launched, nothing seeded
    plain = jc.cuda_kernel("k", ["x"], ["y"], "y[0] = x[0];")
    plain(inputs=[x], output_shapes=[(2, 3)], output_dtypes=[mx.bfloat16], grid=(32, 1, 1), threadgroup=(32, 1, 1),
          template=[("R", 5)])
    assert len(launched) == 4 and len(seeded) == 2


@pytest.mark.parametrize("make", [lambda: cuda_qmm._qmm_kernel(True), lambda: cuda_attention._partials(2),
                                  lambda: cuda_attention._combine(), lambda: gdn._gdn_kernel(3, "cuda"),
                                  lambda: gdn._prefill_kernel(), lambda: gdn_fused._kernel(2)])
def test_every_cuda_kernel_of_ours_goes_through_it(make, monkeypatch):
    monkeypatch.setattr(mx.fast, "cuda_kernel", lambda **kw: None)   # no MLX CUDA here
    for f in (cuda_qmm._qmm_kernel, cuda_attention._partials, cuda_attention._combine, gdn._gdn_kernel,
              gdn._prefill_kernel, gdn_fused._kernel):
        f.cache_clear()
    try:
        assert isinstance(make(), jc.Kernel)
    finally:
        for f in (cuda_qmm._qmm_kernel, cuda_attention._partials, cuda_attention._combine, gdn._gdn_kernel,
                  gdn._prefill_kernel, gdn_fused._kernel):
            f.cache_clear()


def test_the_warm_up_builds_the_long_context_and_batch_attention_launches(tiny_checkpoint, monkeypatch):
    """HybridAdapter.prepare_kernels with the CUDA runner: every verify width's launch past
    ROWS_BLOCK_FROM keys (a template per row count) and each batch size's, built and seeded, none
    evaluated; nothing on a backend without the kernels."""
    from adapters import load_adapter
    from adapters.qwen3_5 import backends

    ad = load_adapter(tiny_checkpoint(head_dim=128, num_heads=4, num_kv_heads=2, dtype="bfloat16"),
                      compute_dtype="native")
    assert ad.prepare_kernels(range(2, 5)) == 0                      # the CPU's backend: no kernels
    launched, seeded = [], []
    monkeypatch.setattr(mx.fast, "cuda_kernel", lambda **kw: (lambda **call: launched.append(call) or [
        mx.zeros(s, d) for s, d in zip(call["output_shapes"], call["output_dtypes"])]))
    monkeypatch.setattr(jc, "compiler", lambda: (FakeNvrtc(), ()))
    monkeypatch.setattr(jc, "seed", lambda spec, inputs, outs, tmpl: seeded.append((spec["name"], dict(tmpl))))
    for f in (cuda_attention._partials, cuda_attention._combine):
        f.cache_clear()
    try:
        ad.backend = backends.Backend("stand-in", backends.GpuKernels("cuda", fused_attention=True), backends.MlxOps())
        assert ad.prepare_kernels(range(2, 5), sequences=2) == 3 + 4   # B=1: 3 widths; B=2: 3 widths + short
        partials = [(name.split("_")[3], t["RB"]) for name, t in seeded if "partials" in name]
        assert sorted(set(partials)) == [("1", 2), ("1", 3), ("1", 4), ("2", 1), ("2", 2), ("2", 3), ("2", 4)]
        assert all(t["HD"] == 128 and t["G"] == 2 for name, t in seeded if "partials" in name)
    finally:
        for f in (cuda_attention._partials, cuda_attention._combine):
            f.cache_clear()


def test_a_seed_that_raises_never_fails_the_launch(monkeypatch):
    launched = []
    monkeypatch.setattr(mx.fast, "cuda_kernel", lambda **kw: (lambda **call: launched.append(call) or ["out"]))
    monkeypatch.setattr(jc, "compiler", lambda: (FakeNvrtc(), ()))
    monkeypatch.setattr(jc, "errors", [])
    monkeypatch.setitem(jc.stats, "failed", 0)

    def broken(*a):
        raise KeyError("a template value of a type MLX's names do not know")

    monkeypatch.setattr(jc, "seed", broken)
    k = jc.cuda_kernel("k", ["x"], ["y"], "y[0] = x[0];")
    x = mx.zeros((2,), mx.float32)
    assert k(inputs=[x], output_shapes=[(2,)], output_dtypes=[mx.float32], grid=(1, 1, 1), threadgroup=(1, 1, 1)) == ["out"]
    assert len(launched) == 1 and jc.stats["failed"] == 1 and jc.errors[0].startswith("k: KeyError")
