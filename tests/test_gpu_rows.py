"""scripts/gpu/gpu_rows.py on the CPU: the row-invariance bisect with the CUDA kernels' references
standing in (--stand-in), on a small MoE checkpoint whose linears, Gated-DeltaNet middle and
attention all take the kernels' paths.

The GPU run is what the script is for; here: every runner keeps a verify's row 0 equal to the
decode step's, and an op made row-variant on purpose is the one the bisect names first.
"""
from __future__ import annotations

import json

import pytest

from adapters.kernels import cuda_attention, cuda_qmm, gdn, gdn_fused
from adapters.qwen3_5 import layers
from scripts.gpu import gpu_make_checkpoint, gpu_rows

# A 35B-A3B-like MoE at a CPU's size that every kernel path serves: the joined Gated-DeltaNet
# projections (384 + 256 + 8 + 8) and the router (16 experts, 8-bit) fit the row kernel, the fused
# middle takes Dk = Dv = 32, the attention kernel head_dim 128.
ROWS_SHAPE = ("qwen3_5_moe", dict(
    hidden_size=128, num_layers=4, full_attention_interval=2, vocab_size=512, num_heads=8, num_kv_heads=1,
    head_dim=128, linear_num_value_heads=8, linear_num_key_heads=2, linear_key_head_dim=32,
    linear_value_head_dim=32, num_experts=16, num_experts_per_tok=4, moe_intermediate_size=128,
    shared_expert_intermediate_size=128, intermediate_size=128))


@pytest.fixture(scope="module")
def moe_checkpoint(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(gpu_make_checkpoint.MOE_SHAPES, "rows-test", ROWS_SHAPE)
        return gpu_make_checkpoint.build_moe(str(tmp_path_factory.mktemp("rows") / "moe"), "rows-test")


def _run(ckpt, tmp_path, *extra) -> dict:
    out = tmp_path / "rows.json"
    kernels_before = (cuda_qmm.quantized_matmul_rows, gdn.gated_delta_steps, gdn_fused.gdn_fused,
                      cuda_attention.gated_attention, cuda_attention.gated_attention_batch)
    wrapped_before = (layers.mlp, layers.mx)
    assert gpu_rows.main(["--model", str(ckpt), "--json", str(out), "--stand-in", *extra]) == 0
    # the stand-ins and the wrappers are gone again
    assert (cuda_qmm.quantized_matmul_rows, gdn.gated_delta_steps, gdn_fused.gdn_fused,
            cuda_attention.gated_attention, cuda_attention.gated_attention_batch) == kernels_before
    assert (layers.mlp, layers.mx) == wrapped_before
    return json.loads(out.read_text())


def test_every_runner_keeps_row_zero_with_the_kernels_references(moe_checkpoint, tmp_path):
    report = _run(moe_checkpoint, tmp_path, "--tokens", "6")
    assert report["mlx"] and report["describe"].startswith("moe (qwen3_5_moe, 16 experts)")
    assert report["stand_in"] and report["widths"] == [2, 3, 4] and len(report["drafts"]) == 3
    assert set(report["runners"]) == {"eager", "compiled", "mlx"}
    for name, r in report["runners"].items():
        for W, w in r["widths"].items():
            assert w["logits_equal"] and w["max_abs_diff"] == 0.0, (name, W)
            assert w["first_differing_op"] is None and w["differing_ops"] == [], (name, W)
            assert w["ops_compared"] > 10 and w["ops_skipped"] >= 0 and w["top2_gap"] >= 0
        assert r["ar_vs_mtp_first_difference"] is None and len(r["ar"]) == 6, name
        assert r["ar_vs_ar_again_first_difference"] is None and r["ar_again_vs_mtp_again_first_difference"] is None
    eager, compiled = report["runners"]["eager"], report["runners"]["compiled"]
    assert compiled["bisect"] == gpu_rows.BISECT_LAYERS and eager["bisect"] == gpu_rows.BISECT_OPS
    assert compiled["first_call_vs_replay"]["equal"]
    # the eager runner saw every kernel path: the fused middle, the attention kernel, the router's
    # softmax / top-k and the experts, and the replayed reductions between them
    assert eager["widths"]["2"]["ops_compared"] > 3 * compiled["widths"]["2"]["ops_compared"]
    assert report["across_runners"]["eager_vs_compiled"]["2"]["equal"]
    assert "row 0 exact at every width" in report["verdict"]


@pytest.mark.parametrize("variant, layer, op, module", [
    ("attention_gated", "1", "attention_gated", ""),   # the attention kernel of the first attention layer
    ("mlp.gate", "0", "linear", "mlp.gate"),           # the router's linear (through the row kernel)
    ("experts", "0", "experts", "mlp.switch_mlp"),     # the routed experts' gather_qmm
])
def test_the_bisect_names_an_op_made_row_variant(moe_checkpoint, tmp_path, variant, layer, op, module):
    report = _run(moe_checkpoint, tmp_path, "--backend", "eager", "--tokens", "0", "--width", "3",
                  "--row-variant-op", variant)
    assert report["row_variant_op"] == variant and set(report["runners"]) == {"eager"}
    w = report["runners"]["eager"]["widths"]["3"]
    assert not w["logits_equal"] and w["max_abs_diff"] > 0
    first = w["first_differing_op"]
    assert (first["layer"], first["op"], first["module"], first["part"]) == (layer, op, module, "")
    assert first["shape"][1] == 3 and first["max_abs_diff"] > 0 and first["call"] == w["differing_ops"][0]["call"]
    assert len(w["differing_ops"]) <= gpu_rows.LIST_DIFFERING and w["ops_differing"] >= len(w["differing_ops"])
    # everything recorded before it agreed, and the layers after it differ too
    assert all(d["call"] >= first["call"] for d in w["differing_ops"])
    assert any(d["op"] == "lm_head" for d in w["differing_ops"]) or w["ops_differing"] > gpu_rows.LIST_DIFFERING
    assert "eager: row 0 differs at widths 3" in report["verdict"] and "the bisect names the op" in report["verdict"]


def test_position_zero_pairs_positions_and_history_axes():
    import mlx.core as mx

    one, wide = mx.zeros((1, 1, 8)), mx.arange(24, dtype=mx.float32).reshape(1, 3, 8)
    assert gpu_rows.position_zero(one, wide, 3).tolist() == wide[:, :1].tolist()
    conv_one, conv_wide = mx.zeros((1, 4, 8)), mx.ones((1, 6, 8))   # K-1 history rows + positions
    assert gpu_rows.position_zero(conv_one, conv_wide, 3).shape == (1, 4, 8)
    assert gpu_rows.position_zero(mx.zeros((2, 2)), mx.zeros((2, 2)), 3).shape == (2, 2)   # a state: whole
    assert gpu_rows.position_zero(mx.zeros((1, 1, 8)), mx.zeros((1, 4, 8)), 3) is None     # not W - 1 more
    assert gpu_rows.position_zero(mx.zeros((1, 1, 8)), mx.zeros((3, 3, 8)), 3) is None     # two axes differ


def test_a_compiled_runner_whose_first_eager_call_differs_from_its_replays_is_reported(moe_checkpoint, tmp_path,
                                                                                      monkeypatch):
    """A compiled runner runs each function's first call eagerly: where that computes otherwise than
    the compiled replays (here the final norm, perturbed), rows still agree within the replays, and
    the report says the first call and the eager runner part from them."""
    import mlx.core as mx

    from adapters.qwen3_5 import gpu_runner

    real = gpu_runner.CompiledGpuKernels._fn

    def first_norm_differs(self, key, make):
        first = key not in self._compiled
        fn = real(self, key, make)
        if not (first and key[1] == "norm"):
            return fn
        return lambda h: (fn(h).astype(mx.float32) * (1 + 2**-4)).astype(h.dtype)

    monkeypatch.setattr(gpu_runner.CompiledGpuKernels, "_fn", first_norm_differs)
    report = _run(moe_checkpoint, tmp_path, "--backend", "compiled", "--tokens", "0", "--width", "2")
    compiled = report["runners"]["compiled"]
    assert compiled["widths"]["2"]["logits_equal"]
    replay = compiled["first_call_vs_replay"]
    assert not replay["equal"] and replay["first_differing_op"]["op"] == "final_norm"
    assert "its first (eager) call differs from its compiled replay" in report["verdict"]


def test_a_runner_that_fails_is_reported_and_the_script_still_exits_0(moe_checkpoint, tmp_path, monkeypatch):
    from adapters.qwen3_5 import gpu_runner

    def broken(self, *args):
        raise RuntimeError("kernel did not build")

    monkeypatch.setattr(gpu_runner.GpuKernels, "attention_gated", broken)
    report = _run(moe_checkpoint, tmp_path, "--backend", "eager", "--width", "2")
    eager = report["runners"]["eager"]
    assert eager["error"] == "RuntimeError: kernel did not build" and "traceback" in eager
    assert "eager: failed (RuntimeError: kernel did not build)" in report["verdict"]


def test_another_threads_model_work_meanwhile_is_neither_recorded_nor_perturbed(moe_checkpoint, tmp_path,
                                                                                 monkeypatch):
    """layers.mlp and layers.mx are module globals: while the script records, a server's model thread
    in the same process (webapp/serving/worker.py; tests/test_api_*.py leave one taking a
    conversation's snapshot a grace after their last reply) calls the wrappers too. Its calls are
    its own: not recorded (their lazy arrays live on that thread's MLX stream, and evaluated by the
    script they raised "There is no Stream(cpu, 1) in current thread") and not perturbed."""
    import mlx.core as mx

    from webapp.serving.worker import ModelWorker

    worker, theirs = ModelWorker("rows-test-model"), []
    x = mx.arange(8, dtype=mx.float32) / 8
    mx.eval(x)
    real = gpu_rows.forward_from

    def model_thread_meanwhile(ad, start, tokens, capture):
        # on the model thread, through the wrapped layers.mx, left lazy as a prefill chunk's ops are
        theirs.append(worker.call(lambda: (layers.mx is not mx, layers.mx.sigmoid(x))))
        return real(ad, start, tokens, capture)

    monkeypatch.setattr(gpu_rows, "forward_from", model_thread_meanwhile)
    report = _run(moe_checkpoint, tmp_path, "--backend", "eager", "--tokens", "0", "--width", "2",
                  "--row-variant-op", "sigmoid")
    eager = report["runners"]["eager"]
    assert "error" not in eager, eager.get("traceback")
    assert theirs and all(wrapped for wrapped, _ in theirs)   # they did go through the wrappers
    w = eager["widths"]["2"]
    assert not w["logits_equal"] and w["first_differing_op"]["op"] == "mx.sigmoid"   # the script's own, perturbed
    # the model thread's results, evaluated there, are plain sigmoids (wide forwards included)
    values = worker.call(lambda: [y.tolist() for _, y in theirs])
    assert values == [mx.sigmoid(x).tolist()] * len(theirs)
