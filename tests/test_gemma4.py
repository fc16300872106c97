"""Gemma 4 with its assistant drafter through the adapter contract, in both backbone layouts.

Tiny random pairs (scripts/checkpoints/tiny_gemma4.py via make_tiny_checkpoint family="gemma4", the published
config keys and tensor names): "small" is E2B/E4B-like (per-layer inputs, KV-shared layers, the
drafter's centroid head), "large" 31B-like (keys equal values on full attention, the full tied
head). Their drafters are "aligned" (they copy part of the backbone), so drafts pass and fail.
Prompts run past the sliding window (16 tokens here).
"""
from __future__ import annotations

import inspect
import json
import shutil
from collections import Counter

import mlx.core as mx
import numpy as np
import pytest

from adapters import CheckpointError, load_adapter
from core import AutoregressiveDecoder, SamplerConfig, SpeculativeDecoder
from core.acceptance import acceptance_probability, correction_distribution
from core.model import Adapter
from adapters.gemma4.drafter import NEG
from tests._prefix_checks import assert_restore_equals_fresh_prefill, turns_through_the_cache
from tests._engine_helpers import GREEDY, chi_square_pvalue, exact_joint, marginal
from tests._ties import ROUNDING, assert_greedy_equal

SIZES = ("small", "large")
CASES = [(s, l) for s in SIZES for l in ("hf", "mlx")]
IDS = [f"{s}-{l}" for s, l in CASES]
WINDOW = 16
PROMPTS = [list(range(5, 45)), [100, 7, 300, 42], [3]]   # the first is longer than the sliding window


def pair(tiny_checkpoint, size="small", layout="hf", fresh=False, **opts):
    return tiny_checkpoint(fresh=fresh, family="gemma4", layout=layout, bits=None, gemma4={"size": size, **opts})


@pytest.fixture(scope="module")
def gemma_adapters(tiny_checkpoint):
    cache = {}

    def get(size, layout="hf"):
        if (size, layout) not in cache:
            cache[size, layout] = load_adapter(pair(tiny_checkpoint, size, layout))
        return cache[size, layout]

    return get


# --------------------------------------------------------------------------- the contract
@pytest.mark.parametrize("size", SIZES)
def test_the_adapter_has_the_contracts_members_with_its_signatures(gemma_adapters, size):
    ad = gemma_adapters(size)
    assert isinstance(ad, Adapter)
    for name, want in vars(Adapter).items():
        if callable(want) and not name.startswith("_"):
            got = inspect.signature(getattr(ad, name)).parameters
            assert list(got) == [p for p in inspect.signature(want).parameters if p != "self"], name
    for name in Adapter.__annotations__:
        assert getattr(ad, name) is not None, name
    assert ad.vocab_size == ad.lm_head(mx.zeros((1, 1, ad.args.hidden_size))).shape[-1] == 512


# --------------------------------------------------------------------------- exactness
@pytest.mark.parametrize("size,layout", CASES, ids=IDS)
def test_greedy_mtp_is_token_identical_to_ar_over_128_tokens(gemma_adapters, size, layout):
    """One prompt per layout, 128 tokens each, so every reply runs past the sliding window: on the
    Hugging Face layout the prompt longer than the window, on the mlx layout the one-token prompt.
    The two layouts' forward and draft step are bit-identical
    (test_the_two_layouts_of_one_seed_are_the_same_model), so between them each size sees both
    kinds of prefill (three prompts per case took ~34-47 CPU-seconds on a 2-core CPU)."""
    ad = gemma_adapters(size, layout)
    assert ad.drafter.centroid == (size == "small") and ad.args.sliding_window == WINDOW
    prompt, accepted, proposed = (PROMPTS[0] if layout == "hf" else PROMPTS[2]), 0, 0
    ar, _ = AutoregressiveDecoder(ad, sampler=GREEDY).generate(prompt, max_tokens=128)
    assert len(ar) == 128 > 4 * WINDOW
    if layout == "hf":
        auto, _ = SpeculativeDecoder(ad, sampler=GREEDY, depth="auto").generate(prompt, max_tokens=128)
        assert_greedy_equal(ad, prompt, auto, ar, what="auto")
    for depth in (1, 2, 3, 4):
        mtp, stats = SpeculativeDecoder(ad, sampler=GREEDY, depth=depth).generate(prompt, max_tokens=128)
        assert_greedy_equal(ad, prompt, mtp, ar, what=f"depth {depth}")
        assert stats.target_forwards == stats.cycles + 1
        accepted, proposed = accepted + stats.accepted, proposed + stats.proposed
    assert 0.05 < accepted / proposed < 0.95, accepted / proposed  # drafts both pass and fail


@pytest.mark.parametrize("size", SIZES)
def test_the_draft_step_is_the_published_one(tiny_checkpoint, gemma_adapters, size):
    """Three recursive draft steps against tests/_gemma4_reference.py (numpy, from Hugging Face's
    modeling code): the next h_prev and the scored logits, on a prompt past the sliding window."""
    from tests._gemma4_reference import ReferenceDrafter

    ad = gemma_adapters(size)
    path = pair(tiny_checkpoint, size)
    ref = ReferenceDrafter(path, path / "assistant")
    cache = ad.make_cache()
    _, h, _ = ad.forward(mx.array([PROMPTS[0]]), cache)
    embed = np.array(ad.inner.embed_tokens.weight)
    h_ours = h_ref = h[:, -1:]
    h_ref, token = np.array(h[0, -1]), 77
    for _ in range(3):
        h_ours, logits = ad.draft_step({}, cache, h_ours, mx.array([[token]]))
        h_ref, want = ref.step(embed, cache, h_ref, token, position=len(PROMPTS[0]))
        got = np.array(logits[0])
        scored = np.isfinite(want)
        assert (got[~scored] == NEG).all() and scored.sum() == (128 if size == "small" else 512)
        assert np.allclose(got[scored], want[scored], atol=2e-4), np.abs(got[scored] - want[scored]).max()
        assert np.allclose(np.array(h_ours[0, 0]), h_ref, atol=2e-4)
        token = int(np.argmax(want))


def test_the_two_layouts_of_one_seed_are_the_same_model(gemma_adapters):
    for size in SIZES:
        x = mx.array([PROMPTS[0]])
        outs = []
        for layout in ("hf", "mlx"):
            ad = gemma_adapters(size, layout)
            cache = ad.make_cache()
            logits, hidden, _ = ad.forward(x, cache)
            _, draft = ad.draft_step({}, cache, hidden[:, -1:], mx.array([[7]]))
            outs.append((logits, draft))
        assert mx.array_equal(outs[0][0], outs[1][0]).item() and mx.array_equal(outs[0][1], outs[1][1]).item()


@pytest.mark.parametrize("size", SIZES)
def test_sampled_tokens_follow_the_exact_distribution(gemma_adapters, size):
    """Tokens 2 and 3 come out of the first cycle at depth 2: chi-square against the exact joint
    distribution enumerated from the backbone alone."""
    ad = gemma_adapters(size)
    # 250 runs (800 before): at 264 the acceptance mutants that change this distribution failed
    # both sizes at p < 1e-18 (docs/bench/2026-12-01/sampled-tests-power.json); the one they
    # cannot see at any count here (the bonus drawn from the last draft's row) is caught by
    # tests/test_acceptance_exact.py and test_engine_exactness's depth-2 test.
    sampler, prompt, runs = SamplerConfig(temperature=1.0, top_p=1.0, top_k=4), PROMPTS[0], 250
    exact = marginal(exact_joint(ad, sampler, prompt, 3), (1, 2))
    counts, proposed, accepted = Counter(), 0, 0
    for seed in range(runs):
        ids, stats = SpeculativeDecoder(ad, sampler=sampler, seed=seed, depth=2).generate(prompt, max_tokens=4)
        if len(ids) >= 3:
            counts[tuple(ids[1:3])] += 1
        proposed, accepted = proposed + stats.proposed, accepted + stats.accepted
    assert 0.1 * proposed < accepted < 0.98 * proposed, (accepted, proposed)
    assert chi_square_pvalue(counts, exact, sum(counts.values())) > 1e-3


def test_a_token_outside_the_drafters_clusters_is_reached_through_the_residual(gemma_adapters):
    """The centroid head gives q = 0 to every token outside its top clusters. Enumerating one
    draft step's outcomes (accept x with min(1, p/q), else draw from the residual) gives back p,
    those tokens included; and sampled runs do emit them, as corrections."""
    ad = gemma_adapters("small")
    sampler = SamplerConfig(temperature=1.0, top_p=1.0, top_k=0)
    prompt = mx.array([PROMPTS[0]])
    cache = ad.make_cache()
    logits, hidden, _ = ad.forward(prompt, cache)
    bonus = int(mx.argmax(logits[0, -1]).item())
    _, dlogits = ad.draft_step({}, cache, hidden[:, -1:], mx.array([[bonus]]))
    p_logits, _, _ = ad.forward(mx.array([[bonus]]), cache)
    p, q = sampler.probs(p_logits[0, -1:]), sampler.probs(dlogits)
    outside = np.array(q[0]) == 0
    assert outside.sum() == 512 - 4 * 32 and float(np.array(p[0])[outside].sum()) > 0.05
    V = q.shape[-1]
    drafts = mx.arange(V)
    accept = acceptance_probability(mx.broadcast_to(p, (V, V)), mx.broadcast_to(q, (V, V)), drafts)
    _, residual = correction_distribution(p, q)
    out = np.array(q[0] * accept) + float((q[0] * (1 - accept)).sum()) * np.array(residual[0])
    assert np.allclose(out, np.array(p[0]), atol=1e-6)

    # In runs: corrections the drafter gave q = 0 (checked by redoing that cycle's draft step).
    reached = 0
    for seed in range(40):
        seq, origins = list(PROMPTS[0]), []
        for ev in SpeculativeDecoder(ad, sampler=sampler, seed=seed, depth=1).stream(PROMPTS[0], max_tokens=12):
            seq += ev.tokens
            origins += ev.origins
        for j, origin in enumerate(origins):
            if origin != "correction":
                continue
            at = len(PROMPTS[0]) + j        # seq[at] replaced the draft made from (hidden at-2, token at-1)
            cache = ad.make_cache()
            _, h, _ = ad.forward(mx.array([seq[: at - 1]]), cache)
            _, d = ad.draft_step({}, cache, h[:, -1:], mx.array([[seq[at - 1]]]))
            reached += int(d[0, seq[at]].item() == NEG)
    assert reached > 0


def test_rollback_keeps_exactly_the_verified_prefix(gemma_adapters):
    """Verify 4 tokens with capture, keep any prefix: the caches equal a run that decoded those
    tokens one at a time (to fp32 rounding: a verify's rows come out of 4-row matmuls), and a
    rollback then a replay of the dropped tokens is bit-identical to the verify's own cache."""
    for size in SIZES:
        ad = gemma_adapters(size)
        ctx, block = mx.array([PROMPTS[0]]), mx.array([[3, 4, 5, 6]])
        whole = ad.make_cache()
        ad.forward(ctx, whole)
        ad.forward(block, whole)
        for keep in range(1, 5):
            spec, ref = ad.make_cache(), ad.make_cache()
            ad.forward(ctx, spec)
            ad.forward(ctx, ref)
            _, _, cap = ad.forward(block, spec, capture=True)
            ad.rollback(spec, cap, keep=keep)
            for i in range(keep):
                ad.forward(block[:, i : i + 1], ref)
            a, b = ad.snapshot(spec, ad.make_draft(spec)), ad.snapshot(ref, ad.make_draft(ref))
            assert a.meta == b.meta and sorted(a.arrays) == sorted(b.arrays)
            for name in a.arrays:
                x, y = a.valid(name), b.valid(name)
                assert x.shape == y.shape and mx.allclose(x, y, rtol=ROUNDING, atol=ROUNDING).item(), (size, keep, name)
            # the drafter reads what the cache holds: the kept prefix, nothing of the dropped drafts
            kv = ad.shared_kv(spec)
            assert kv["full_attention"][0].shape[-2] == len(PROMPTS[0]) + keep
            assert kv["sliding_attention"][0].shape[-2] == WINDOW - 1


# --------------------------------------------------------------------------- prefix cache
@pytest.mark.parametrize("size", SIZES)
def test_prefix_cache_changes_nothing_over_several_turns(gemma_adapters, size):
    stats = turns_through_the_cache(gemma_adapters(size), depth=3)
    assert stats.cached_tokens > WINDOW  # the last turns came from the cache, past the window


def test_a_restored_state_equals_a_fresh_prefill_tensor_by_tensor(gemma_adapters):
    assert_restore_equals_fresh_prefill(gemma_adapters("small"))


# --------------------------------------------------------------------------- refusals
def _refused(path, **kw) -> str:
    with pytest.raises(CheckpointError) as info:
        load_adapter(path, **kw)
    return str(info.value)


def test_pairs_that_do_not_belong_together_are_refused_naming_both_sides(tiny_checkpoint):
    small = pair(tiny_checkpoint, "small", fresh=True)
    wider = pair(tiny_checkpoint, "small", hidden_size=128)
    msg = _refused(small, drafter=wider / "assistant")
    assert f"drafter {wider / 'assistant'} reads a backbone of backbone_hidden_size 128, backbone {small} " \
           "has hidden_size 64" in msg

    bigger_vocab = tiny_checkpoint(family="gemma4", bits=None, vocab_size=768, gemma4={"size": "small"})
    msg = _refused(small, drafter=bigger_vocab / "assistant")
    assert f"vocabulary: drafter {bigger_vocab / 'assistant'} has vocab_size 768, backbone {small} has 512" in msg

    other_window = tiny_checkpoint(family="gemma4", bits=None, gemma4={"size": "small", "sliding_window": 32})
    msg = _refused(small, drafter=other_window / "assistant")
    assert "sliding window: drafter" in msg and "has 32, backbone" in msg

    # the drafter's full-attention queries must match the K/V of the layer it reads
    d = small / "assistant"
    cfg = json.loads((d / "config.json").read_text())
    cfg["text_config"]["global_head_dim"] = 16
    (d / "config.json").write_text(json.dumps(cfg))
    msg = _refused(small)
    assert "full_attention queries have head dim 16, backbone" in msg and "layer 2 (full_attention: 1 K/V heads of 32)" in msg


def test_a_small_model_drafter_without_centroids_is_refused_by_name(tiny_checkpoint):
    path = pair(tiny_checkpoint, "small", fresh=True)
    f = path / "assistant" / "model.safetensors"
    t = dict(mx.load(str(f)))
    del t["masked_embedding.centroids.weight"]
    mx.save_safetensors(str(f), t)
    msg = _refused(path)
    assert "use_ordered_embeddings" in msg and "'masked_embedding.centroids.weight' is missing" in msg

    t["masked_embedding.centroids.weight"] = mx.zeros((16, 64))
    t["masked_embedding.token_ordering"] = mx.zeros((512,), dtype=mx.int32)
    mx.save_safetensors(str(f), t)
    assert "'masked_embedding.token_ordering' must list each of the 512 tokens once" in _refused(path)

    del t["model.layers.2.self_attn.q_proj.weight"]
    mx.save_safetensors(str(f), t)
    assert "Missing tensors: model.layers.2.self_attn.q_proj.weight." in _refused(path)


def test_no_drafter_a_wrong_drafter_and_a_drafter_for_qwen_are_refused(tiny_checkpoint):
    path = pair(tiny_checkpoint, "large", fresh=True)
    shutil.rmtree(path / "assistant")
    msg = _refused(path)
    assert "its drafter is a separate checkpoint" in msg and "--drafter DIR" in msg and str(path / "assistant") in msg
    assert "model_type is 'gemma4', expected 'gemma4_assistant'" in _refused(path, drafter=path)
    qwen = tiny_checkpoint(bits=None)
    assert "Leave --drafter out" in _refused(qwen, drafter=pair(tiny_checkpoint, "large") / "assistant")


# --------------------------------------------------------------------------- people's view
def test_inspect_model_says_what_it_loaded(tiny_checkpoint, capsys):
    from scripts.checkpoints import inspect_model

    path = pair(tiny_checkpoint, "small")
    rc = inspect_model.main(["--model", str(path), "--measure"])
    out = capsys.readouterr().out
    assert rc == 0, out
    lines = out.splitlines()
    assert "family: gemma4 (Gemma4Adapter)" in lines
    assert f"drafter: {path / 'assistant'} (4-layer assistant drafter, hidden 64, centroid head (top 4 of 16 " \
           "clusters, 128 tokens))" in lines
    assert "backbone layers: 6 = 4 sliding-window (16) + 2 full attention; 4 compute K/V, 2 reuse them" in lines
    assert any(l.startswith("drafter layers: 4 (") and "full_attention <- backbone layer 2, sliding_attention <- "
               "backbone layer 3" in l for l in lines)
    assert any(l.startswith("measured acceptance (greedy, depth 2): ") for l in lines)
    assert lines[-1] == "OK: the pair loaded and passed its checks."


def test_the_start_up_banner_names_the_pair_given_with_drafter(tiny_checkpoint, tmp_path):
    """The pair as `--drafter DIR` gives it (settings.drafter): the host's description is the line
    `mtp-chat` prints after loading ("model: ...", webapp/cli.py; the CLI runs in
    tests/test_webapp_server.py)."""
    from tests._webapp_helpers import make_host

    path = pair(tiny_checkpoint, "large", fresh=True)
    drafter = tmp_path / "gemma-assistant"
    shutil.move(str(path / "assistant"), drafter)
    model = make_host(path, drafter=drafter).description
    assert "(gemma4)" in model and "drafter gemma-assistant: 4-layer assistant drafter" in model
    assert "full tied head" in model


def test_one_api_conversation(tiny_checkpoint):
    from tests._webapp_helpers import make_host, two_turn_api_conversation

    two_turn_api_conversation(make_host(pair(tiny_checkpoint, "small")), depth=3)


def test_gemma4s_thought_channel_is_reasoning(tiny_checkpoint):
    """Gemma 4 writes its reasoning as <|channel>thought ... <channel|> (thinking on: the model
    opens it; off: the template closes an empty one in the generation prompt). The host takes its
    markers from the template, and the API's shaper and the chat's reply split on them."""
    from core import THOUGHT_CHANNEL, split_reply
    from tests._webapp_helpers import make_host
    from webapp.api.text import ReplyShaper, join
    from webapp.ui.chat import Reply

    host = make_host(pair(tiny_checkpoint, "small", template="gemma4"))
    assert host.has_thinking and host.reasoning == THOUGHT_CHANNEL
    tok = host.tokenizer
    assert len(tok.encode("<|channel>", add_special_tokens=False)) == 1
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "<|channel>thought\nsecret plan<channel|>Hello."},
            {"role": "user", "content": "Why?"}]
    off = tok.decode(list(host.fit(msgs, 32, enable_thinking=False).prompt.ids))
    on = tok.decode(list(host.fit(msgs, 32, enable_thinking=True).prompt.ids))
    assert off.endswith("<|turn>model\n<|channel>thought\n<channel|>") and "<|think|>" not in off
    assert on.endswith("<|turn>model\n") and on.startswith("<|turn>system\n<|think|>\nBe brief.")
    assert "secret plan" not in on and "<|turn>model\nHello.<turn|>" in on     # earlier thoughts dropped
    assert not host.opens_thinking(host.fit(msgs, 32, enable_thinking=False).prompt)
    assert not host.opens_thinking(host.fit(msgs, 32, enable_thinking=True).prompt)

    raw = "<|channel>thought\nFirst, the sky.\n<channel|>It is blue."
    assert split_reply(raw, markers=THOUGHT_CHANNEL) == ("First, the sky.", "It is blue.")
    assert split_reply(raw) == ("", raw)                   # the <think> markers would not see it
    for cut in range(1, len(raw)):                         # any split of the stream, a marker cut too
        shaper = ReplyShaper(reasoning=True, markers=host.reasoning)
        deltas = shaper.feed(raw[:cut]) + shaper.feed(raw[cut:])
        deltas += shaper.finish()[0]
        content, reasoning = join(deltas)
        assert (content, reasoning.strip()) == ("It is blue.", "First, the sky."), cut
        reply = Reply(False, host.reasoning)
        reply.feed(raw[:cut])
        reply.feed(raw[cut:], finished=True)
        assert (reply.reasoning.strip(), reply.answer) == ("First, the sky.", "It is blue."), cut
    eos = set(tok.eos_token_ids)
    assert tok.encode("<turn|>", add_special_tokens=False)[0] in eos    # a turn's end stops the reply


def test_sliding_layers_hold_the_window_not_the_context(gemma_adapters):
    """A sliding-window layer's cache holds at most the window plus one block (adapters/gemma4/
    sliding.py), gives the logits a whole-context cache gives, and still drops any rejected
    suffix after it has slid."""
    from mlx_lm.models.cache import KVCache

    from adapters.gemma4.sliding import SlidingKVCache

    ad = gemma_adapters("small")
    ids = [(7 * i + 3) % 500 for i in range(300)]
    sliding, whole = ad.make_cache(), [KVCache() for _ in range(ad.n_cache)]
    kinds = ad.args.layer_types[: ad.n_cache]
    assert [isinstance(c, SlidingKVCache) for c in sliding] == [k == "sliding_attention" for k in kinds]
    for chunk in ([ids[:100]] + [ids[i:i + 1] for i in range(100, 200)] + [ids[200:204]]):
        a, _, _ = ad.forward(mx.array([chunk]), sliding)
        b, _, _ = ad.forward(mx.array([chunk]), whole)
        assert mx.allclose(a, b, rtol=1e-4, atol=1e-4).item()
    for c in sliding:
        if isinstance(c, SlidingKVCache):
            assert c.start > 0 and c.held <= WINDOW + c.every and c.offset == 204
    # a verify of 4 after the slide, rolled back to 1: the same as decoding that one token
    _, _, cap = ad.forward(mx.array([[9, 8, 7, 6]]), sliding, capture=True)
    ad.rollback(sliding, cap, keep=1)
    _ = ad.forward(mx.array([[9]]), whole)
    a, _, _ = ad.forward(mx.array([[11]]), sliding)
    b, _, _ = ad.forward(mx.array([[11]]), whole)
    assert mx.allclose(a, b, rtol=1e-4, atol=1e-4).item()
