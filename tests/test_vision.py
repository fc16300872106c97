"""Pictures through Qwen3.5's vision tower (mlx-vlm) into our trunk, with MTP drafting the answer."""
import json
from collections import Counter

import mlx.core as mx
import pytest

from adapters import load_adapter
from core import AutoregressiveDecoder, SamplerConfig, SpeculativeDecoder
from core.chat import chat_prompt
from core.images import ImageError, decode, from_base64, from_url
from core.prefix_cache import PrefixCache
from tests._engine_helpers import chi_square_pvalue, exact_joint, make_mixed_head, marginal
from tests._pictures import VL, data_url, image_message, picture, png

GREEDY = SamplerConfig(temperature=0)


@pytest.fixture(scope="module")
def vl(tiny_checkpoint):
    """The Hugging Face layout (the tower inside, as `model.visual.*`), a head that accepts some drafts."""
    return load_adapter(make_mixed_head(tiny_checkpoint(fresh=True, **VL)), log=lambda m: None)


@pytest.fixture(scope="module")
def vl_sure(tiny_checkpoint):
    """A head that agrees with the trunk on most sampled drafts (tests/_engine_helpers.SURE)."""
    return load_adapter(make_mixed_head(tiny_checkpoint(fresh=True, **{**VL, "residual_gain": 0.3})),
                        log=lambda m: None)


def test_the_tower_loads_in_both_layouts_and_our_trunk_computes_what_mlx_vlm_does(tiny_checkpoint, vl):
    """mlx-vlm's own Qwen3.5 model (tower, merge, multimodal RoPE) on the same weights is the
    reference: the prompt's logits, then a decode step after it (the rope delta at work)."""
    from mlx_vlm.models.qwen3_5 import qwen3_5 as reference
    from mlx_vlm.models.qwen3_5.config import ModelConfig

    path = tiny_checkpoint(**VL)
    mlx_layout = load_adapter(tiny_checkpoint(**{**VL, "layout": "mlx"}), log=lambda m: None)
    assert vl.vision is not None and mlx_layout.vision is not None
    config = json.loads((path / "config.json").read_text())
    model = reference.Model(ModelConfig.from_dict(config))
    weights = {}
    for f in path.glob("model*.safetensors"):
        weights.update(mx.load(str(f)))
    model.load_weights([(k, v) for k, v in model.sanitize(weights).items()], strict=True)

    ad = load_adapter(path, log=lambda m: None)
    prompt = chat_prompt(ad, [image_message(picture(1))])
    span = prompt.images[0]
    processed = ad.vision.processor([span.picture.pixels.transpose(2, 0, 1)], resized_height=span.grid[1] * 16,
                                    resized_width=span.grid[2] * 16)
    ids = mx.array([prompt.ids])
    cache = model.language_model.make_cache()
    want = model(ids, pixel_values=mx.array(processed["pixel_values"]),
                 image_grid_thw=mx.array(processed["image_grid_thw"]), cache=cache).logits
    want_next = model.language_model(mx.array([[7]]), cache=cache).logits
    for adapter in (ad, mlx_layout):
        ours = adapter.make_cache()
        got, _, _ = adapter.forward(ids, ours, fast=False, images=prompt.images)
        assert mx.abs(got - want).max().item() < 2e-3
        assert ours.rope_delta == 3 - 6   # a 3x2 merged grid: the text after it goes on from 3
        got_next, _, _ = adapter.forward(mx.array([[7]]), ours)
        assert mx.abs(got_next - want_next).max().item() < 1e-3
    wrong = ad.make_cache()   # the same without the rope delta (positions as token indices) disagrees
    ad.forward(ids, wrong, fast=False, images=prompt.images)
    wrong.rope_delta = 0
    assert mx.abs(ad.forward(mx.array([[7]]), wrong)[0] - want_next).max().item() > 1e-2


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_greedy_mtp_is_token_identical_to_ar_on_a_picture(vl, depth):
    prompt = chat_prompt(vl, [image_message(picture(1))])
    ar, _ = AutoregressiveDecoder(vl, sampler=GREEDY).generate(prompt, max_tokens=64)
    mtp, stats = SpeculativeDecoder(vl, sampler=GREEDY, depth=depth).generate(prompt, max_tokens=64)
    assert mtp == ar and len(ar) == 64
    assert stats.target_forwards == stats.cycles + 1
    assert 0 < stats.accepted < stats.proposed   # drafts both pass and fail


def test_two_pictures_give_different_answers(vl):
    """The picture really reaches the model: same text, same size, other pixels."""
    answers = [AutoregressiveDecoder(vl, sampler=GREEDY).generate(chat_prompt(vl, [image_message(picture(s))]),
                                                                  max_tokens=16)[0] for s in (1, 2)]
    assert answers[0] != answers[1]


def test_sampled_mtp_follows_the_exact_distribution_on_a_picture(vl_sure):
    """Tokens 2 and 3 of a sampled reply (the first cycle's drafts at depth 2) against the exact
    joint distribution enumerated from the trunk with the picture in its prompt."""
    sampler, runs = SamplerConfig(temperature=1.0, top_p=1.0, top_k=3), 300
    prompt = chat_prompt(vl_sure, [image_message(picture(1))])
    exact = marginal(exact_joint(vl_sure, sampler, prompt, 3), (1, 2))
    counts, accepted, proposed = Counter(), 0, 0
    for seed in range(runs):
        ids, stats = SpeculativeDecoder(vl_sure, sampler=sampler, seed=seed, depth=2).generate(prompt, max_tokens=3)
        accepted, proposed = accepted + stats.accepted, proposed + stats.proposed
        if len(ids) >= 3:
            counts[tuple(ids[1:3])] += 1
    assert 0.1 * proposed < accepted < 0.9 * proposed   # the acceptance rule both passes and fails drafts
    assert chi_square_pvalue(counts, exact, sum(counts.values())) > 1e-3


def test_a_follow_up_about_the_same_picture_prefills_only_the_new_text(vl, tmp_path):
    from core.disk_cache import DiskCache

    pc = PrefixCache(2**30, disk=DiskCache(tmp_path, "vl", 2**30, 3600.0))
    first = [image_message(picture(1)), {"role": "assistant", "content": "A picture."}]
    prompt = chat_prompt(vl, first + [{"role": "user", "content": "And its colours?"}])
    fresh, _ = AutoregressiveDecoder(vl, sampler=GREEDY).generate(prompt, max_tokens=8)
    lane = AutoregressiveDecoder(vl, sampler=GREEDY, prefix_cache=pc)
    lane.generate(chat_prompt(vl, first[:1]), max_tokens=4)   # the first turn: its prompt is snapshotted
    ids, stats = lane.generate(prompt, max_tokens=8)
    assert ids == fresh and stats.cached_tokens >= prompt.images[0].end
    # on disk: a new process's cache finds it; another picture of the same size does not
    reopened = PrefixCache(2**30, disk=DiskCache(tmp_path, "vl", 2**30, 3600.0))
    ids, stats = AutoregressiveDecoder(vl, sampler=GREEDY, prefix_cache=reopened).generate(prompt, max_tokens=8)
    assert ids == fresh and stats.cached_tokens >= prompt.images[0].end
    other = chat_prompt(vl, [image_message(picture(2))] + first[1:] + [{"role": "user", "content": "And its colours?"}])
    _, stats = AutoregressiveDecoder(vl, sampler=GREEDY, prefix_cache=reopened).generate(other, max_tokens=2)
    assert stats.cached_tokens <= other.images[0].start


@pytest.mark.parametrize("bad, says", [
    (lambda: from_url("https://example.com/cat.png", max_bytes=10**6), "never fetches"),
    (lambda: from_url("file:///etc/passwd", max_bytes=10**6), "never fetches"),
    (lambda: from_url("/etc/passwd", max_bytes=10**6), "file path"),
    (lambda: from_url("data:image/svg+xml;base64,PHN2Zy8+", max_bytes=10**6), "SVG"),
    (lambda: decode(b"<svg xmlns='http://www.w3.org/2000/svg'/>", max_bytes=10**6), "SVG"),
    (lambda: decode(png(1)[:200], max_bytes=10**6), "could not be decoded"),
    (lambda: decode(b"\x89PNG\r\n\x1a\n" + b"\0" * 64, max_bytes=10**6), "could not be decoded"),
    (lambda: from_base64("A" * 2_000_000, max_bytes=10**6), "at most 1.0 MB"),
    (lambda: from_base64("not base64!", max_bytes=10**6), "base64"),
])
def test_bad_pictures_are_refused_saying_what_is_allowed(bad, says):
    with pytest.raises(ImageError, match=says) as e:
        bad()
    assert "PNG, JPEG" in str(e.value) or "never fetches" in str(e.value)


def test_the_pixel_budget_bounds_the_resize_as_the_processor_does(tiny_checkpoint):
    from core.settings import get_settings

    small = load_adapter(tiny_checkpoint(**VL), settings=get_settings(image_max_pixels=64 * 64), log=lambda m: None)
    assert small.vision.max_pixels == 64 * 64 and "4,096" in small.describe()
    # 400x300 -> 64x32 px (aspect kept, sides multiples of 32, within 4,096 px): 4x2 patches of 16 px, 2 tokens
    span = chat_prompt(small, [image_message(picture(1, width=400, height=300))]).images[0]
    assert span.grid == (1, 2, 4) and span.length == 2


def test_a_model_without_a_tower_refuses_pictures(tiny_checkpoint):
    ad = load_adapter(tiny_checkpoint(), log=lambda m: None)
    assert ad.vision is None
    with pytest.raises(ImageError, match="no vision tower"):
        chat_prompt(ad, [image_message(picture(1))])


def test_image_tokens_typed_as_text_are_refused(vl):
    text = vl.vision.placeholder + " twice " + vl.vision.placeholder
    with pytest.raises(ImageError, match="placeholder"):
        chat_prompt(vl, [image_message(picture(1), text)])
    assert data_url(1).startswith("data:image/png;base64,")


@pytest.mark.parametrize("mode", ["ar", "mtp"])
def test_pictures_decode_in_a_batch_exactly_as_alone(vl, mode):
    """Two image turns (other pictures, so other rope deltas) and a text one, decoded together."""
    from tests.test_batch import run_batched

    prompts = [chat_prompt(vl, [image_message(picture(s), "Describe it.")]) for s in (1, 2)]
    prompts.append(chat_prompt(vl, [{"role": "user", "content": "Hello there"}]))
    lengths = [24, 20, 16]
    alone = [(AutoregressiveDecoder(vl, sampler=GREEDY) if mode == "ar" else
              SpeculativeDecoder(vl, sampler=GREEDY, depth=2)).generate(p, max_tokens=n)[0]
             for p, n in zip(prompts, lengths)]
    batched, sizes, _ = run_batched(vl, mode, 2, prompts, lengths, {0: [0, 2], 3: [1]})
    assert batched == alone and max(sizes) == 3
