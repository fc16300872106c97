"""Qwen3.5/3.6-MoE and Qwen3-Next through the adapter contract, in both on-disk layouts.

Tiny random checkpoints (scripts/checkpoints/make_tiny_checkpoint.py, the published config keys and tensor
names) as an MLX conversion plus sidecar ("mlx") and as the original Hugging Face checkpoint
("hf"). Their heads copy the trunk's embedding path (make_mixed_head), so drafts pass and fail
often: greedy MTP equals AR at depths 1-3, sampled tokens follow the exact distribution, the
prefix cache changes nothing over several turns, rollback keeps exactly the verified prefix,
and the two layouts of one seed are the same model bit for bit.
"""
from __future__ import annotations

import inspect
import json
from collections import Counter

import mlx.core as mx
import pytest

from adapters import CheckpointError, load_adapter
from core import Adapter, AutoregressiveDecoder, SamplerConfig, SpeculativeDecoder, chat_prompt
from tests._prefix_checks import assert_restore_equals_fresh_prefill, turns_through_the_cache
from tests._engine_helpers import GREEDY, chi_square_pvalue, exact_joint, make_mixed_head, marginal
from tests._ties import ROUNDING, assert_greedy_equal

FAMILIES = ("qwen3_5_moe", "qwen3_next")
CASES = [(f, l) for f in FAMILIES for l in ("mlx", "hf")]
IDS = [f"{f}-{l}" for f, l in CASES]
# Float trunk and head (the CPU computes in fp32 anyway), as tests/_engine_helpers.MIXED; SURE's
# smaller residual gain makes sampled drafts pass more often (the chi-square test needs both).
OPTS = dict(bits=None, mtp_bits=None, frequent_tokens=0, logit_std=2.0, residual_gain=0.7, norm_std=0.05, seed=0)
SURE = {**OPTS, "residual_gain": 0.3}
PROMPTS = [list(range(5, 25)), [100, 7, 300, 42], [3]]


@pytest.fixture(scope="module")
def family_adapters(tiny_checkpoint):
    """(family, layout) -> adapter of a mixed-head tiny checkpoint."""
    cache = {}

    def get(family, layout, opts=OPTS):
        key = (family, layout, tuple(sorted(opts.items())))
        if key not in cache:
            path = make_mixed_head(tiny_checkpoint(fresh=True, family=family, layout=layout, **opts))
            cache[key] = load_adapter(path, hidden_variant="post_norm")
        return cache[key]

    return get


# --------------------------------------------------------------------------- the contract
@pytest.mark.parametrize("family", ("qwen3_5",) + FAMILIES)
def test_every_family_has_the_contracts_members_with_its_signatures(family_adapters, family):
    """core calls only core.model.Adapter: each family's adapter has every member, and every
    method takes the parameters the protocol names (a renamed one breaks core's keyword calls)."""
    ad = family_adapters(family, "mlx")
    assert isinstance(ad, Adapter)
    for name, want in vars(Adapter).items():
        if callable(want) and not name.startswith("_"):
            got = inspect.signature(getattr(ad, name)).parameters
            assert list(got) == [p for p in inspect.signature(want).parameters if p != "self"], name
    for name in Adapter.__annotations__:
        assert getattr(ad, name) is not None, name
    assert ad.vocab_size == ad.lm_head(mx.zeros((1, 1, ad.contract.hidden_size))).shape[-1]


# --------------------------------------------------------------------------- exactness
@pytest.mark.parametrize("family,layout", CASES, ids=IDS)
def test_greedy_mtp_is_token_identical_to_ar_over_128_tokens(family_adapters, family, layout):
    ad = family_adapters(family, layout)
    assert ad.contract.family == family and ad.contract.num_experts == 4
    assert ad.contract.layout == ("Hugging Face" if layout == "hf" else "mlx + sidecar")
    accepted = proposed = longest = 0
    for prompt in PROMPTS:
        ar, _ = AutoregressiveDecoder(ad, sampler=GREEDY).generate(prompt, max_tokens=128)
        longest = max(longest, len(ar))
        for depth in (1, 2, 3):
            mtp, stats = SpeculativeDecoder(ad, sampler=GREEDY, depth=depth).generate(prompt, max_tokens=128)
            assert_greedy_equal(ad, prompt, mtp, ar, what=f"depth {depth}")
            assert stats.target_forwards == stats.cycles + 1
            accepted, proposed = accepted + stats.accepted, proposed + stats.proposed
    assert longest >= 128
    assert 0.05 < accepted / proposed < 0.95, accepted / proposed  # drafts both pass and fail


@pytest.mark.parametrize("family", FAMILIES)
def test_sampled_tokens_follow_the_exact_distribution(family_adapters, family):
    """Tokens 2 and 3 come out of the first cycle at depth 2: chi-square against the exact
    joint distribution enumerated from the trunk."""
    ad = family_adapters(family, "mlx", SURE)
    # 300 runs (1,200, then 600 before): at 400 (and 390), three acceptance mutants of
    # scripts/dev/mutation_check.py still failed both families (p < 1e-5, or the acceptance counts);
    # the fourth (the bonus drawn from the last draft's row) gave p = 0.1-0.75, so 1,200 caught it
    # only by chance (expected p ~2e-3): tests/test_acceptance_exact.py and test_engine_exactness's
    # depth-2 test catch that one (docs/bench/2026-12-01/sampled-tests-power.json)
    sampler, prompt, runs = SamplerConfig(temperature=1.0, top_p=1.0, top_k=4), [11, 12, 13], 300
    exact = marginal(exact_joint(ad, sampler, prompt, 3), (1, 2))
    counts, proposed, accepted = Counter(), 0, 0
    for seed in range(runs):
        ids, stats = SpeculativeDecoder(ad, sampler=sampler, seed=seed, depth=2).generate(prompt, max_tokens=4)
        if len(ids) >= 3:
            counts[tuple(ids[1:3])] += 1
        proposed, accepted = proposed + stats.proposed, accepted + stats.accepted
    assert 0.2 * proposed < accepted < 0.98 * proposed, (accepted, proposed)
    assert chi_square_pvalue(counts, exact, sum(counts.values())) > 1e-3


@pytest.mark.parametrize("family", FAMILIES)
def test_rollback_keeps_exactly_the_verified_prefix(family_adapters, family):
    """Verify `width` tokens with capture, keep any prefix: the caches equal a run that decoded
    those tokens one at a time (to fp32 rounding: a verify's rows come out of k-row matmuls)."""
    ad = family_adapters(family, "mlx")
    ctx, block = mx.array([[5, 9, 13, 21, 34, 55, 89, 144]]), mx.array([[3, 4, 5, 6]])
    for keep in range(1, 5):
        spec, ref = ad.make_cache(), ad.make_cache()
        ad.forward(ctx, spec)
        ad.forward(ctx, ref)
        _, _, cap = ad.forward(block, spec, capture=True)
        ad.rollback(spec, cap, keep=keep)
        for i in range(keep):
            ad.forward(block[:, i : i + 1], ref)
        a, b = ad.snapshot(spec, ad.make_draft(spec)), ad.snapshot(ref, ad.make_draft(ref))
        assert a.meta == b.meta
        for name in a.arrays:
            x, y = a.valid(name), b.valid(name)
            assert x.shape == y.shape and mx.allclose(x, y, rtol=ROUNDING, atol=ROUNDING).item(), (keep, name)


# --------------------------------------------------------------------------- prefix cache
@pytest.mark.parametrize("family,layout", CASES, ids=IDS)
def test_prefix_cache_changes_nothing_over_several_turns(family_adapters, family, layout):
    stats = turns_through_the_cache(family_adapters(family, layout), depth=2)
    assert stats.cached_tokens > 0  # the last turns came from the cache


@pytest.mark.parametrize("family", FAMILIES)
def test_a_restored_state_equals_a_fresh_prefill_tensor_by_tensor(family_adapters, family):
    assert_restore_equals_fresh_prefill(family_adapters(family, "hf"))


# --------------------------------------------------------------------------- the two layouts
@pytest.mark.parametrize("family", ("qwen3_5",) + FAMILIES)
def test_the_mlx_and_hugging_face_layouts_of_one_seed_are_the_same_model(tiny_checkpoint, family):
    paths = {l: tiny_checkpoint(family=family, layout=l, **{**OPTS, "mtp_dtype": "float32"}) for l in ("mlx", "hf")}
    ads = {l: load_adapter(p, hidden_variant="post_norm") for l, p in paths.items()}
    x = mx.array([[5, 9, 13, 21, 34, 55, 89, 144, 233, 377]])
    outs = {}
    for l, ad in ads.items():
        logits, hidden, _ = ad.forward(x, ad.make_cache())
        g = ad.mtp_forward(hidden[:, :-1], x[:, 1:], ad.make_mtp_cache())
        outs[l] = (logits, ad.lm_head(g))
    assert ads["hf"].contract.norm_convention_source == "Hugging Face layout"
    assert mx.array_equal(outs["mlx"][0], outs["hf"][0]).item()
    assert mx.array_equal(outs["mlx"][1], outs["hf"][1]).item()


# --------------------------------------------------------------------------- refusals
def _edit_head(path, edit):
    from adapters import sidecar

    found = sidecar.find(path, json.loads((path / "config.json").read_text()))
    for f in found.files:
        t = dict(mx.load(str(f)))
        edit(t)
        mx.save_safetensors(str(f), t)


def _refused(path) -> str:
    with pytest.raises(CheckpointError) as info:
        load_adapter(path)
    return str(info.value)


@pytest.mark.parametrize("layout", ["mlx", "hf"])
def test_a_missing_expert_is_refused_by_name(tiny_checkpoint, layout):
    path = tiny_checkpoint(fresh=True, family="qwen3_next", layout=layout, **OPTS)
    _edit_head(path, lambda t: t.pop("mtp.layers.0.mlp.experts.2.up_proj.weight"))
    msg = _refused(path)
    assert "Missing tensors: mtp.layers.0.mlp.experts.2.up_proj.weight." in msg


def test_a_wrong_expert_count_is_refused_by_name(tiny_checkpoint):
    path = tiny_checkpoint(fresh=True, family="qwen3_next", **OPTS)

    def one_more(t):
        for proj in ("gate_proj", "up_proj", "down_proj"):
            t[f"mtp.layers.0.mlp.experts.4.{proj}.weight"] = t[f"mtp.layers.0.mlp.experts.0.{proj}.weight"]

    _edit_head(path, one_more)
    msg = _refused(path)
    assert "Unexpected tensors: mtp.layers.0.mlp.experts.4.down_proj.weight" in msg
    assert "has 5 experts where config.json says num_experts 4" in msg
    assert "'mtp.layers.0.mlp.experts.4.gate_proj.weight' is one too many" in msg

    path = tiny_checkpoint(fresh=True, family="qwen3_5_moe", **OPTS)  # fused: stacked over 3 experts, not 4
    _edit_head(path, lambda t: t.update({k: t[k][:3] for k in ("mtp.layers.0.mlp.experts.gate_up_proj",
                                                                 "mtp.layers.0.mlp.experts.down_proj")}))
    msg = _refused(path)
    assert "tensor 'mtp.layers.0.mlp.experts" in msg and "has shape [3, " in msg and "expected [4, " in msg
    assert "The MTP head has 3 experts where config.json says num_experts 4" in msg


def test_a_head_of_another_shape_a_missing_router_and_no_head_are_refused_by_name(tiny_checkpoint):
    path = tiny_checkpoint(fresh=True, family="qwen3_5_moe", **OPTS)
    wider = tiny_checkpoint(family="qwen3_5_moe", hidden_size=128, **OPTS)
    side = path / "optiq" / "mtp.safetensors"
    side.write_bytes((wider / "optiq" / "mtp.safetensors").read_bytes())
    assert "tensor 'mtp.pre_fc_norm_embedding.weight' has shape [128], expected [64] for hidden_size=64" in _refused(path)

    path = tiny_checkpoint(fresh=True, family="qwen3_5_moe", layout="hf", **OPTS)
    _edit_head(path, lambda t: t.pop("mtp.layers.0.mlp.gate.weight"))
    assert "Missing tensors: mtp.layers.0.mlp.gate.weight." in _refused(path)
    _edit_head(path, lambda t: [t.pop(k) for k in list(t) if k.startswith("mtp.")])
    msg = _refused(path)
    assert "has no MTP head" in msg and "no mtp.* tensors in its model*.safetensors" in msg


def test_a_missing_expert_of_the_trunk_is_refused_by_name(tiny_checkpoint):
    path = tiny_checkpoint(fresh=True, family="qwen3_next", layout="hf", **OPTS)
    shard = path / "model.safetensors"
    t = dict(mx.load(str(shard)))
    del t["model.layers.0.mlp.experts.1.down_proj.weight"]
    mx.save_safetensors(str(shard), t)
    index = json.loads((path / "model.safetensors.index.json").read_text())
    del index["weight_map"]["model.layers.0.mlp.experts.1.down_proj.weight"]
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    msg = _refused(path)
    assert "mlx-lm could not load the trunk" in msg and "model.layers.0.mlp.experts.1.down_proj.weight" in msg


def test_a_moe_config_without_experts_is_refused(tiny_checkpoint):
    path = tiny_checkpoint(fresh=True, family="qwen3_5_moe", **OPTS)
    cfg = json.loads((path / "config.json").read_text())
    cfg["text_config"]["num_experts"] = 0
    (path / "config.json").write_text(json.dumps(cfg))
    assert "num_experts is 0; a qwen3_5_moe checkpoint has routed experts" in _refused(path)


def test_a_quantized_moe_head_loads_with_a_warning_about_acceptance(tiny_checkpoint):
    said = []
    ad = load_adapter(tiny_checkpoint(family="qwen3_5_moe", bits=4, mtp_bits=4), log=said.append,
                      compute_dtype="native")  # as stored (on the CPU, "auto" dequantizes to fp32)
    assert ad.contract.mtp_quantization == {"bits": 4, "group_size": 32}
    q = ad.head.layers[0].mlp
    assert type(q.gate).__name__ == "QuantizedLinear" and q.gate.bits == 8   # router gate kept at 8 bits
    assert type(q.switch_mlp.gate_proj).__name__ == "QuantizedSwitchLinear" and q.switch_mlp.gate_proj.bits == 4
    assert any("quantized" in s and "bf16" in s and "acceptance" in s for s in said), said
    assert ad.notes == tuple(said)


# --------------------------------------------------------------------------- people's view
@pytest.mark.parametrize("family", FAMILIES)
def test_inspect_model_says_what_it_loaded_and_measures_the_wiring(tiny_checkpoint, capsys, family):
    from scripts.checkpoints import inspect_model

    path = make_mixed_head(tiny_checkpoint(fresh=True, family=family, layout="hf", **OPTS))
    rc = inspect_model.main(["--model", str(path), "--measure"])
    out = capsys.readouterr().out
    assert rc == 0, out
    lines = out.splitlines()
    assert f"family: {family} (HybridAdapter), 4 routed experts" in lines
    assert "layout: Hugging Face; head from mtp.* in model.safetensors" in lines
    assert "norm convention: zero_centered (Hugging Face layout)" in lines
    assert "hidden variant: post_norm (family default (post-norm, as vLLM and SGLang feed it))" in lines
    rows = [l for l in lines if l.startswith("  hidden ")]
    assert len(rows) == 4 and sum("<- the checkpoint's" in r for r in rows) == 1
    assert "wiring: the checkpoint's own (post_norm, embedding_hidden) is the best measured." in lines


def test_inspect_model_finds_a_wrongly_declared_concat_order(tiny_checkpoint, capsys):
    from scripts.checkpoints import inspect_model

    path = make_mixed_head(tiny_checkpoint(fresh=True, family="qwen3_next", **OPTS))  # the head reads the embedding first
    cfg = json.loads((path / "config.json").read_text())
    cfg["mtp_concat_order"] = "hidden_embedding"
    (path / "config.json").write_text(json.dumps(cfg))
    rc = inspect_model.main(["--model", str(path), "--measure"])
    out = capsys.readouterr().out
    assert rc == 1, out
    flag = next(l for l in out.splitlines() if l.startswith("FLAG: the head accepts more"))
    assert "concat order embedding_hidden" in flag and '"mtp_concat_order": "embedding_hidden"' in flag


@pytest.mark.parametrize("family", FAMILIES)
def test_the_start_up_banner_names_the_family_and_the_backend(tiny_checkpoint, family):
    """The line `mtp-chat` prints after loading ("model: " + the host's description, webapp/cli.py;
    the CLI itself runs in tests/test_webapp_server.py) and the page's banner, on a served app."""
    import urllib.request

    from tests._webapp_helpers import make_host, served

    host = make_host(tiny_checkpoint(family=family, layout="hf", **OPTS))
    model = host.description
    assert f"({family}, 4 experts)" in model and "Hugging Face)" in model and "backend cpu-compiled" in model
    with served(host) as (url, _):
        with urllib.request.urlopen(f"{url}/config", timeout=10) as r:
            page = r.read().decode()
    assert f"{family}, 4 experts" in page and "backend cpu-compiled" in page  # the page's banner
    assert "greedy MTP = AR " in page and "on this machine" in page            # and what it measured
    assert "Memory:" in page and "per token of context" in page and "per token of context" in host.memory


@pytest.mark.parametrize("family", FAMILIES)
def test_one_api_conversation(tiny_checkpoint, family):
    from tests._webapp_helpers import make_host, two_turn_api_conversation

    two_turn_api_conversation(make_host(make_mixed_head(tiny_checkpoint(fresh=True, family=family, **OPTS))), depth=2)


# --------------------------------------------------------------------------- attach-head
@pytest.mark.parametrize("family", ("qwen3_5",) + FAMILIES)
def test_attach_head_round_trips(tiny_checkpoint, tmp_path, capsys, family):
    """Hugging Face checkpoint -> mlx_lm convert (head dropped) -> attach-head -> the same greedy
    tokens as loading the Hugging Face checkpoint directly; --bits 8 attaches a quantized head."""
    from mlx_lm import convert

    from webapp.attach_head import main as attach

    hf = make_mixed_head(tiny_checkpoint(fresh=True, family=family, layout="hf", **OPTS))
    for bits in (None, 8):
        conv = tmp_path / f"conv-{bits}"
        convert(str(hf), str(conv))
        assert not list(conv.glob("**/mtp.safetensors"))
        with pytest.raises(CheckpointError, match="has no MTP head"):
            load_adapter(conv)
        rc = attach(["--from", str(hf), "--to", str(conv)] + (["--bits", str(bits)] if bits else []))
        out = capsys.readouterr().out
        assert rc == 0, out
        assert f"wrote {conv / 'optiq' / 'mtp.safetensors'}" in out and "OK: the attached head accepts" in out
        ours, theirs = load_adapter(conv), load_adapter(hf)
        assert ours.contract.layout == "mlx + sidecar" and theirs.contract.layout == "Hugging Face"
        assert ours.contract.hidden_variant == theirs.contract.hidden_variant
        if bits is None:
            prompt = chat_prompt(ours, [{"role": "user", "content": "What is the sea?"}])
            for lane in (AutoregressiveDecoder(ours, sampler=GREEDY), SpeculativeDecoder(ours, sampler=GREEDY, depth=2)):
                other = type(lane)(theirs, sampler=GREEDY, **({"depth": 2} if isinstance(lane, SpeculativeDecoder) else {}))
                assert lane.generate(prompt, max_tokens=64)[0] == other.generate(prompt, max_tokens=64)[0]
        else:
            assert ours.contract.mtp_quantization["bits"] == 8
            assert ("note: a quantized MoE head loses acceptance" in out) == (family != "qwen3_5")


def test_attach_head_refuses_a_conversion_of_another_model(tiny_checkpoint, tmp_path, capsys):
    from webapp.attach_head import main as attach

    hf = tiny_checkpoint(family="qwen3_next", layout="hf", **OPTS)
    other = tiny_checkpoint(fresh=True, family="qwen3_next", hidden_size=128, **OPTS)
    assert attach(["--from", str(hf), "--to", str(other)]) == 1
    assert "config.json has hidden_size 128 where the head's checkpoint" in capsys.readouterr().err
    conv = tiny_checkpoint(fresh=True, family="qwen3_next", **OPTS)  # an MLX conversion: no mtp.* in its shards
    assert attach(["--from", str(conv), "--to", str(tiny_checkpoint(fresh=True, family="qwen3_next", **OPTS))]) == 1
    assert "has no mtp.* tensors in its model*.safetensors" in capsys.readouterr().err
