#!/usr/bin/env python
"""Compile the project's MLX CUDA custom kernels with NVRTC on a CPU-only machine.

Run with the project's venv (it imports the kernel modules, which import mlx):
    .venv/bin/python scripts/gpu/nvrtc_check.py [--cuda 13|12] [--arch sm_90a] [--all] [-k FILTER]
                                                   [--dump DIR] [--log] [--project DIR] [--no-pch] [-j N] [--prelude]
Exit status 1 when any variant fails. Toolkits: `sh scripts/gpu/nvrtc_setup.sh` (PyPI wheels, unpacked in
$NVRTC_DIR/site13 and site12; NVRTC_DIR defaults to /tmp/nvc); MLX's device headers in $NVRTC_DIR/mlxinc
(ml-explore/mlx mlx/backend/cuda/device/, commit in mlxinc/MLX_COMMIT). Why: a kernel that does not compile,
or spills, is found here in a minute instead of on the GPU machine's time.

How it works
- mx.fast.cuda_kernel is replaced by a recorder; the project's own wrappers (gdn_fused.gdn_fused,
  cuda_attention.gated_attention, gdn.gated_delta_steps / gated_delta_prefill,
  cuda_qmm.quantized_matmul_rows) are then called with zero arrays of 9B-like shapes, so the
  sources, headers, input/output names, dtypes, ndims and template arguments are exactly what the
  wrappers pass today (re-read on every run).
- Each launch is turned into the source MLX 0.32 builds (mlx/backend/cuda/custom_kernel.cpp,
  build_kernel): default header (utils.cuh + cooperative_groups), the user header, a
  `__global__ void custom_kernel_<name><hash>(...)` in namespace mlx::core::cu with
  `const T* in`, `const __grid_constant__ Shape in_shape` (cuda::std::array<int32_t, 10>),
  `Strides in_strides` (cuda::std::array<int64_t, 10>), `int in_ndim` where the source names them,
  `T* out`, then `constexpr int X = v;` / `using T = __nv_bfloat16;` for the template args.
- Compiled with NVRTC (ctypes) with MLX's options (jit_module.cpp: --device-as-default-execution-space,
  --gpu-architecture=sm_90a for an H100/H200, include paths for MLX's device headers, CCCL, CUDA
  headers) plus --std=c++17 (NVRTC's default anyway) and --ptxas-options=-v for registers/spills.
- --prelude: each variant also compiled as adapters/kernels/jit_cache.py compiles it to seed MLX's
  kernel cache (utils.cuh, which the wheels do not ship, replaced by a prelude), and its functions'
  PTX compared with MLX's own source's: "seeded PTX: same" for every variant is what lets the
  seeded modules stand in for the ones MLX would build (70/70 at commit time).
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.environ.get("NVRTC_DIR", "/tmp/nvc")  # the toolkits and headers (nvrtc_setup.sh)
PROJECT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MLX_INC = os.path.join(HERE, "mlxinc")  # mlx/backend/cuda/device/*.cuh from ml-explore/mlx (see MLX_COMMIT)
TOOLKITS = {
    "13": dict(lib=f"{HERE}/site13/nvidia/cu13/lib/libnvrtc.so.13",
               inc=[f"{HERE}/site13/nvidia/cu13/include/cccl", f"{HERE}/site13/nvidia/cu13/include"]),
    "12": dict(lib=f"{HERE}/site12/nvidia/cuda_nvrtc/lib/libnvrtc.so.12",
               inc=[f"{HERE}/site12/nvidia/cuda_cccl/include", f"{HERE}/site12/nvidia/cuda_runtime/include"]),
}

def _jit_cache(project: str = PROJECT):
    """adapters/kernels/jit_cache.py: NVRTC through ctypes, and MLX's custom-kernel source and
    names (mlx/backend/cuda/custom_kernel.cpp build_kernel, transliterated)."""
    sys.path.insert(0, project)
    import adapters  # noqa: F401  (first: it preloads BLAS before mlx loads)
    from adapters.kernels import jit_cache
    return jit_cache


def build_kernel(spec, call, prelude: bool = False):
    """(kernel function name, the source MLX builds for this launch); `prelude`: with
    jit_cache's stand-in for utils.cuh, as the cache seeding compiles it."""
    jc = _jit_cache()
    func = jc.kernel_name(spec["name"], call["template"])
    header = jc.SEED_HEADER if prelude else jc.DEFAULT_HEADER
    return func, jc.mlx_source(func, spec, call["inputs"], call["output_dtypes"], call["template"], header)


# ------------------------------------------------------------- record what the wrappers launch
CALLS = []


def install_recorder():
    import mlx.core as mx

    def fake_cuda_kernel(name, input_names, output_names, source, header="", ensure_row_contiguous=True,
                         atomic_outputs=False, shared_memory=0, **_):
        spec = dict(name=name, input_names=list(input_names), output_names=list(output_names), source=source,
                    header=header, ensure_row_contiguous=ensure_row_contiguous)

        def launch(inputs, output_shapes, output_dtypes, grid, threadgroup, template=None, init_value=None,
                   verbose=False, stream=None, **__):
            CALLS.append(dict(spec=spec, inputs=[(a.dtype, a.ndim) for a in inputs],
                              output_dtypes=list(output_dtypes), template=list(template or []),
                              grid=tuple(grid), threadgroup=tuple(threadgroup)))
            return [mx.zeros(tuple(s), dtype=d) for s, d in zip(output_shapes, output_dtypes)]
        return launch

    mx.fast.cuda_kernel = fake_cuda_kernel


def collect(full: bool, project: str = PROJECT):
    """[(label, call)] for every kernel variant, by calling the project's wrappers at 9B shapes."""
    sys.path.insert(0, project)
    import adapters  # noqa: F401  (first: it preloads BLAS before mlx loads)
    import mlx.core as mx
    install_recorder()
    from adapters.kernels import cuda_attention, cuda_qmm, cuda_topk, gdn, gdn_fused

    bf16, f32 = mx.bfloat16, mx.float32
    dtypes = [bf16, mx.float16] if full else [bf16]
    out = []

    def rec(label, fn):
        n = len(CALLS)
        try:
            fn()
        except Exception as e:  # noqa: BLE001  (a wrapper that fails on the CPU: say so, go on)
            out.append((label, None, f"wrapper raised {type(e).__name__}: {e}"))
            return
        new = CALLS[n:]
        for c in new:
            short = re.sub(r"^mtp_|_[0-9a-f]{10}$", "", c["spec"]["name"])
            out.append((label + (f" {short}" if len(new) > 1 else ""), c, None))

    # Qwen3.5-9B Gated-DeltaNet: Hk=16, Hv=32, Dk=Dv=128, conv K=4
    Hk, Hv, Dk, Dv, K = 16, 32, 128, 128, 4
    C = 2 * Hk * Dk + Hv * Dv
    z_off, b_off, a_off = C, C + Hv * Dv, C + Hv * Dv + Hv
    ntot = a_off + Hv
    for dt in dtypes:
        tag = "" if dt == bf16 else " fp16"
        for T in range(1, gdn_fused.MAX_T + 1):
            rec(f"gdn_fused T={T}{tag}", lambda T=T, dt=dt: gdn_fused.gdn_fused(
                mx.zeros((1, T, ntot), dt), (z_off, b_off, a_off), mx.zeros((1, K - 1, C), dt), mx.zeros((C, K), dt),
                mx.zeros((Hv,), f32), mx.zeros((Hv,), dt), mx.zeros((Dv,), dt), mx.zeros((4,), f32),
                mx.zeros((1, Hv, Dv, Dk), f32), (Hk, Hv, Dk, Dv, K)))
    # gated attention: 9B full-attention layers: 16 q heads, 4 kv heads, head_dim 256 (G=4)
    for dt in dtypes:
        tag = "" if dt == bf16 else " fp16"
        for hd, nh, nkv in ([(256, 16, 4)] + ([(128, 32, 4)] if full else [])):
            L, S = 4, 1000
            # every row count: below ROWS_BLOCK_FROM keys a row a block, from it a block takes all of
            # a verify's rows (rows_per_block): each its own template
            for keys, where in ((S, ""), (cuda_attention.ROWS_BLOCK_FROM, " long")):
                for rows in range(1, cuda_attention.MAX_ROWS + 1):
                    if where and rows == 1:
                        continue   # one row: the same template at any length
                    rec(f"attn HD={hd} G={nh // nkv} L={rows}{where}{tag}",
                        lambda hd=hd, nh=nh, nkv=nkv, dt=dt, rows=rows, keys=keys: cuda_attention.gated_attention(
                            mx.zeros((1, nh, rows, hd), dt), mx.zeros((1, nkv, keys, hd), dt),
                            mx.zeros((1, nkv, keys, hd), dt), mx.zeros((1, rows, nh * hd), dt), hd**-0.5))
            if hd == 256:  # the thread count scripts/gpu/gpu_attention.py also times
                rec(f"attn HD={hd} G={nh // nkv} L={L} 256 threads{tag}",
                    lambda hd=hd, nh=nh, nkv=nkv, dt=dt: cuda_attention.gated_attention_batch(
                        mx.zeros((1, nh, L, hd), dt), [mx.zeros((1, nkv, S, hd), dt)], [mx.zeros((1, nkv, S, hd), dt)],
                        mx.zeros((1, L, nh * hd), dt), hd**-0.5, threads=256))
            if hasattr(cuda_attention, "gated_attention_batch"):  # a batch's sequences, each its own cache
                for B in (2, 4):
                    lens = [S - 37 * b for b in range(B)]
                    rec(f"attn HD={hd} G={nh // nkv} B={B}{tag}",
                        lambda hd=hd, nh=nh, nkv=nkv, dt=dt, B=B, lens=lens: cuda_attention.gated_attention_batch(
                            mx.zeros((B, nh, L, hd), dt), [mx.zeros((1, nkv, n, hd), dt) for n in lens],
                            [mx.zeros((1, nkv, n, hd), dt) for n in lens], mx.zeros((B, L, nh * hd), dt), hd**-0.5))
    # the plain recurrence: decode steps T=1..8 and the prefill kernel
    for dt in dtypes:
        tag = "" if dt == bf16 else " fp16"
        for T in range(1, gdn.GDN_MAX_T + 1):
            rec(f"gdn_steps T={T}{tag}", lambda T=T, dt=dt: gdn.gated_delta_steps(
                mx.zeros((1, T, Hk, Dk), dt), mx.zeros((1, T, Hk, Dk), dt), mx.zeros((1, T, Hv, Dv), dt),
                mx.zeros((1, T, Hv), f32), mx.zeros((1, T, Hv), dt), mx.zeros((1, Hv, Dv, Dk), f32)))
        rec(f"gdn_prefill{tag}", lambda dt=dt: gdn.gated_delta_prefill(
            mx.zeros((1, 64, Hk, Dk), dt), mx.zeros((1, 64, Hk, Dk), dt), mx.zeros((1, 64, Hv, Dv), dt),
            mx.zeros((1, 64, Hv), f32), mx.zeros((1, 64, Hv), dt), mx.zeros((1, Hv, Dv, Dk), f32)))
    # quantized matmul rows: hidden 4096; N=4096 -> 1 tile/warp, N=12288 (MLP) -> 2 tiles/warp
    groups = (32, 64, 128) if full else (64,)
    for dt in dtypes:
        tag = "" if dt == bf16 else " fp16"
        for bits in (4, 8):
            for gs in groups:
                for N in (4096, 12288):
                    for res in (False, True):
                        Kd, rows = 4096, 4
                        rec(f"qmm b{bits} g{gs} N={N}{' +res' if res else ''}{tag}",
                            lambda bits=bits, gs=gs, N=N, res=res, Kd=Kd, rows=rows, dt=dt:
                            cuda_qmm.quantized_matmul_rows(
                                mx.zeros((rows, Kd), dt), mx.zeros((N, Kd * bits // 32), mx.uint32),
                                mx.zeros((N, Kd // gs), dt), mx.zeros((N, Kd // gs), dt), bits, gs,
                                residual=mx.zeros((rows, N), dt) if res else None))
        # two tiles of token columns (a batch's verify: 9-16 rows), the MLP's widest and the lm_head's shape
        for bits in (4, 8):
            for N, Kd in ((24576, 4096), (4096, 12288), (248320, 4096)):
                rec(f"qmm b{bits} g64 {Kd}->{N} 12 rows{tag}",
                    lambda bits=bits, N=N, Kd=Kd, dt=dt: cuda_qmm.quantized_matmul_rows(
                        mx.zeros((12, Kd), dt), mx.zeros((N, Kd * bits // 32), mx.uint32),
                        mx.zeros((N, Kd // 64), dt), mx.zeros((N, Kd // 64), dt), bits, 64))
        rec(f"qmm b4 g64 swiglu 12288->4096 +res 12 rows{tag}",
            lambda dt=dt: cuda_qmm.quantized_matmul_rows(
                mx.zeros((12, 2 * 12288), dt), mx.zeros((4096, 12288 * 4 // 32), mx.uint32),
                mx.zeros((4096, 12288 // 64), dt), mx.zeros((4096, 12288 // 64), dt), 4, 64,
                residual=mx.zeros((12, 4096), dt), swiglu=True))
        # the MLP's down projection reading silu(gate) * up from gate|up (9B: 12288 -> 4096)
        for bits in (4, 8):
            rec(f"qmm b{bits} g64 swiglu 12288->4096 +res{tag}",
                lambda bits=bits, dt=dt: cuda_qmm.quantized_matmul_rows(
                    mx.zeros((3, 2 * 12288), dt), mx.zeros((4096, 12288 * bits // 32), mx.uint32),
                    mx.zeros((4096, 12288 // 64), dt), mx.zeros((4096, 12288 // 64), dt), bits, 64,
                    residual=mx.zeros((3, 4096), dt), swiglu=True))
    # the sampler's top-k support over the vocabulary (the default sampler's k = 20; k = 64 the widest)
    for dt in dtypes:
        for k in (20, 64):
            rec(f"topk_support k={k} {dt}", lambda dt=dt, k=k: cuda_topk.row_topk_support(
                mx.zeros((4, 248320), dt), 0.6, k, 0.95, 0.0))
            if hasattr(cuda_topk, "row_topk_draw"):   # the fold that also draws (its partials: the same)
                rec(f"topk_draw k={k} {dt}", lambda dt=dt, k=k: cuda_topk.row_topk_draw(
                    mx.zeros((4, 248320), dt), mx.zeros((4,), f32), 0.6, k, 0.95, 0.0))
    return out


# ------------------------------------------------------------------------------- reporting
RE_FUNC = re.compile(r"Compiling entry function '([^']+)'")
RE_PROPS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
RE_USED = re.compile(r"Used (\d+) registers(?:, used (\d+) barriers)?(?:, (\d+) bytes smem)?")


def parse_ptxas(log: str):
    info = {}
    m = RE_USED.search(log)
    if m:
        info["regs"] = int(m.group(1))
        info["smem"] = int(m.group(3) or 0)
    m = RE_PROPS.search(log)
    if m:
        info["stack"], info["spill_st"], info["spill_ld"] = map(int, m.groups())
    return info


def _ptx_body(ptx: bytes) -> str:
    """The PTX's functions (kernels and device functions), without the global constants the
    headers declare (utils.cuh's includes add numeric_limits members no kernel reads)."""
    keep, out = False, []
    for line in (ptx or b"").decode(errors="replace").splitlines():
        keep = keep or line.startswith((".visible .entry", ".func", ".weak .func", ".visible .func"))
        if keep:
            out.append(line)
            keep = line != "}"
    return "\n".join(out)


def one(nv, label, call, options, dump, prelude=False):
    spec = call["spec"]
    func, src = build_kernel(spec, call)
    if dump:
        os.makedirs(dump, exist_ok=True)
        with open(os.path.join(dump, re.sub(r"[^A-Za-z0-9_.=+-]+", "_", label) + ".cu"), "w") as f:
            f.write(src)
    t0 = time.time()
    ok, log, ptx, cubin, lowered = nv.compile(src, spec["name"], options, ["mlx::core::cu::" + func])
    dt = time.time() - t0
    same = None
    if prelude and ok:  # what the cache seeding compiles: the same PTX as MLX's own source?
        func2, src2 = build_kernel(spec, call, prelude=True)
        ok2, log2, ptx2, _, _ = nv.compile(src2, spec["name"], options, ["mlx::core::cu::" + func2])
        same = ok2 and _ptx_body(ptx2) == _ptx_body(ptx)
    threads = call["threadgroup"][0] * call["threadgroup"][1] * call["threadgroup"][2]
    return dict(label=label, ok=ok, log=log, secs=dt, threads=threads, info=parse_ptxas(log) if ok else {}, same=same,
                warnings=[l for l in log.splitlines() if "warning" in l.lower() and "precompiled header" not in l]
                if ok else [])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cuda", default="13", choices=sorted(TOOLKITS), help="NVRTC from the cu13 or cu12 wheels")
    ap.add_argument("--arch", default="sm_90a", help="MLX passes sm_90a for an H100/H200 (cc 9.0 + 'a')")
    ap.add_argument("--all", action="store_true", help="also fp16, all group sizes, head_dim 128")
    ap.add_argument("-k", dest="filter", default="", help="only variants whose label contains this")
    ap.add_argument("--dump", default="", help="write each generated .cu here")
    ap.add_argument("--log", action="store_true", help="print the full NVRTC log of every variant")
    ap.add_argument("-j", type=int, default=2, help="parallel compiles")
    ap.add_argument("--project", default=PROJECT, help="the checkout whose adapters/kernels are compiled")
    ap.add_argument("--no-pch", action="store_true", help="no precompiled header (each compile parses the headers)")
    ap.add_argument("--prelude", action="store_true",
                    help="also compile each variant as adapters/kernels/jit_cache.py seeds MLX's cache (utils.cuh "
                         "replaced by its prelude) and compare the PTX with MLX's own source's")
    args = ap.parse_args()

    tk = TOOLKITS[args.cuda]
    nv = _jit_cache(args.project).Nvrtc(tk["lib"])
    options = ["--device-as-default-execution-space", f"--gpu-architecture={args.arch}",
               f"--include-path={MLX_INC}"] + [f"--include-path={p}" for p in tk["inc"]] + \
              ["--std=c++17", "--ptxas-options=-v"]
    pch_dir = None
    if not args.no_pch and nv.pch_heap(512 << 20):
        import tempfile
        pch_dir = tempfile.mkdtemp(prefix="nvc_pch_")
        options += ["--pch", f"--pch-dir={pch_dir}"]
    print(f"NVRTC {'.'.join(map(str, nv.version()))} ({args.cuda}), {args.arch}; options: "
          f"{' '.join(o for o in options if not o.startswith(('--include-path', '--pch-dir')))}")

    variants = [v for v in collect(args.all, args.project) if args.filter in v[0]]
    jobs = []
    with ThreadPoolExecutor(max_workers=max(1, args.j)) as ex:
        first = True
        for label, call, err in variants:
            if call is None:
                jobs.append((label, err))
                continue
            jobs.append(ex.submit(one, nv, label, call, options, args.dump, args.prelude))
            if first and pch_dir:  # the first compile makes the precompiled header the others use
                jobs[-1].result()
                first = False
        hdr = f"{'kernel variant':44s} {'result':6s} {'regs':>4s} {'spill st/ld':>11s} {'stack':>5s} " \
              f"{'smem':>6s} {'thr':>4s} {'regs*thr':>8s} {'sec':>5s}"
        print(hdr)
        print("-" * len(hdr))
        failed = 0
        for j in jobs:
            if isinstance(j, tuple):
                print(f"{j[0]:44s} ERROR  {j[1]}")
                failed += 1
                continue
            r = j.result()
            if not r["ok"]:
                failed += 1
                print(f"{r['label']:44s} FAIL")
                for line in r["log"].splitlines():
                    if "precompiled header" in line:
                        continue
                    print("    " + line)  # line numbers: the generated source (--dump DIR writes it)
                continue
            i = r["info"]
            regs = i.get("regs")
            rt = regs * r["threads"] if regs is not None else None
            flag = ""
            if regs is not None and -(-regs // 8) * 8 * r["threads"] > 65536:
                flag = "  !! regs*threads > 65536: launch fails"
            if i.get("spill_st") or i.get("spill_ld"):
                flag += "  !! spills"
            if r["warnings"]:
                flag += f"  ({len(r['warnings'])} warning(s))"
            if r["same"] is not None:
                flag += "  seeded PTX: same" if r["same"] else "  !! seeded PTX differs"
                failed += not r["same"]
            print(f"{r['label']:44s} OK     {regs if regs is not None else '?':>4} "
                  f"{str(i.get('spill_st', '?')) + '/' + str(i.get('spill_ld', '?')):>11s} {i.get('stack', '?'):>5} "
                  f"{i.get('smem', '?'):>6} {r['threads']:>4} {rt if rt is not None else '?':>8} {r['secs']:5.1f}{flag}")
            if args.log or r["warnings"]:
                for line in (r["log"].splitlines() if args.log else r["warnings"]):
                    print("    " + line)
    if pch_dir:
        import shutil
        shutil.rmtree(pch_dir, ignore_errors=True)
    print(f"{len(variants) - failed}/{len(variants)} compiled")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
