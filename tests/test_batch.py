"""Batched decoding (core/batch.py): every sequence of a batch gets exactly what it gets alone.

Greedy: 8 requests with different prompts and lengths, joining and leaving mid-way, token for
token equal to the same request decoded alone, in both lanes and at depths 1-3. On this CPU a batched
verify of the demo model is bit-identical to the lone one, a batched one-token step agrees to
fp32 rounding (~1e-5: the several-row matmul kernel against the one-row one;
test_batched_rows_agree_with_alone_to_rounding), so greedy equality holds except at near-ties. Sampled: a chi-square per sequence of a batch against the exact distribution."""
import threading
from collections import Counter

import mlx.core as mx
import pytest

from adapters import load_adapter
from core import AutoregressiveDecoder, SamplerConfig, SpeculativeDecoder
from core.batch import Batch, Sequence
from core.settings import DEMO_MODEL_DIR
from core.stream import Prompt, prefill
from tests._engine_helpers import (MIXED, SURE, chi_square_pvalue, exact_joint, load_modules_path,
                                   make_mixed_head, marginal)

GREEDY = SamplerConfig(temperature=0)
PROMPTS = [list(range(5, 25)), [100, 7, 300, 42], [3], list(range(200, 460, 3)), [9, 8, 7, 6, 5],
           [44] * 30, [17, 2], list(range(60, 90))]
LENGTHS = [40, 25, 60, 33, 50, 45, 12, 36]
# step -> requests that join then: three at the start, the rest while others decode (and after
# some have left: request 6 is short)
JOIN_AT = {0: [0, 1, 2], 3: [3], 5: [4, 6], 9: [5], 20: [7]}


def _decoder(adapter, mode, depth, sampler=GREEDY, seed=0):
    if mode == "ar":
        return AutoregressiveDecoder(adapter, sampler=sampler, seed=seed)
    return SpeculativeDecoder(adapter, sampler=sampler, seed=seed, depth=depth)


def run_batched(adapter, mode, depth, prompts=PROMPTS, lengths=LENGTHS, join_at=JOIN_AT, stops=None):
    """Decode the requests in one Batch, joining at the steps given; -> (tokens per request, the
    batch sizes each step ran at, the Sequences)."""
    batch, out, seqs, sizes, step = Batch(adapter), {}, {}, [], 0
    last_join = max(join_at)
    while step <= last_join or batch.running:
        for i in join_at.get(step, []):
            seqs[i] = Sequence(_decoder(adapter, mode, depth), prompts[i], lengths[i],
                               stop=(stops or {}).get(i))
            out[i] = list(batch.join(seqs[i]).tokens)
        sizes.append(len(batch.running))
        for s, ev in batch.step().items():
            out[next(i for i, x in seqs.items() if x is s)] += ev.tokens
        step += 1
    return [out[i] for i in range(len(prompts))], sizes, seqs


@pytest.fixture(scope="module")
def mixed_modules(tiny_checkpoint):
    return load_modules_path(make_mixed_head(tiny_checkpoint(fresh=True, **MIXED)))


@pytest.fixture(scope="module")
def demo_adapter():
    return load_adapter(DEMO_MODEL_DIR)


@pytest.mark.parametrize("mode,depth", [("ar", 0), ("mtp", 1), ("mtp", 2), ("mtp", 3)])
@pytest.mark.parametrize("which", ["mixed_adapter", "mixed_modules"])
def test_greedy_batched_equals_alone_with_joins_and_leaves(request, which, mode, depth):
    adapter = request.getfixturevalue(which)
    alone = [_decoder(adapter, mode, depth).generate(p, max_tokens=n)[0] for p, n in zip(PROMPTS, LENGTHS)]
    batched, sizes, seqs = run_batched(adapter, mode, depth)
    assert batched == alone
    assert max(sizes) >= 5 and len(set(sizes)) > 3   # several together, the batch grew and shrank
    if mode == "mtp":
        stats = [s.last.stats for s in seqs.values()]
        assert sum(s.accepted for s in stats) > 0 and sum(s.proposed - s.accepted for s in stats) > 0


def _rows_vs_alone(adapter, T):
    """max |batched row - lone forward| over 4 sequences, logits and hidden, one token or a verify of T."""
    caches = [[adapter.make_cache() for _ in PROMPTS[:4]] for _ in range(2)]
    for group in caches:
        for c, p in zip(group, PROMPTS[:4]):
            prefill(adapter, Prompt(tuple(p)), c, None)
    tokens = mx.array([[11 + b + t for t in range(T)] for b in range(4)])
    logits, hidden, _ = adapter.forward_batch(tokens, caches[0], capture=T > 1)
    worst = 0.0
    for b in range(4):
        lone, lone_h, _ = adapter.forward(tokens[b:b + 1], caches[1][b], capture=T > 1)
        worst = max(worst, float(mx.abs(logits[b] - lone[0]).max()), float(mx.abs(hidden[b] - lone_h[0]).max()))
    return worst


def test_batched_rows_agree_with_alone_to_rounding(demo_adapter, mixed_adapter, mixed_modules):
    """What "exact" rests on, measured: a batched verify (3 positions) of the 4-bit demo model
    equals each lone verify bit for bit (MLX's quantized matmul takes both as several rows). A
    batched one-token step does not: alone, 1 row goes through the one-row kernel (quantized
    matvec; OpenBLAS's sgemv-like path for float weights), batched B rows through the several-row
    one, which sums in another order: rows agree to ~1e-5 (fp32 rounding), so greedy outputs
    match unless two logits tie within that (none on these prompts; the greedy tests above)."""
    assert _rows_vs_alone(demo_adapter, 3) == 0.0
    for adapter in (demo_adapter, mixed_adapter, mixed_modules):
        assert 0.0 < _rows_vs_alone(adapter, 1) < 1e-4


def test_demo_model_batched_equals_alone(demo_adapter):
    prompts = [[p % 1000 + 10 for p in q] for q in PROMPTS[:6]]
    lengths = [24, 16, 30, 20, 28, 10]
    join_at = {0: [0, 1], 2: [2, 3], 6: [4, 5]}
    for mode, depth in (("ar", 0), ("mtp", 2)):
        alone = [_decoder(demo_adapter, mode, depth).generate(p, max_tokens=n)[0] for p, n in zip(prompts, lengths)]
        batched, sizes, _ = run_batched(demo_adapter, mode, depth, prompts, lengths, join_at)
        assert batched == alone, mode
        assert max(sizes) >= 4


def test_cancel_removes_only_that_sequence_within_one_step(mixed_adapter):
    """A stop set between two steps: that sequence's next event is its last ('stopped'), its
    caches are dropped then, and the others' outputs do not change."""
    stops = {2: threading.Event()}
    batch, seqs = Batch(mixed_adapter), {}
    for i in range(4):
        seqs[i] = Sequence(_decoder(mixed_adapter, "mtp", 2), PROMPTS[i], 30, stop=stops.get(i))
        batch.join(seqs[i])
    out = {i: list(s.last.tokens) for i, s in seqs.items()}
    for step in range(12):
        if step == 4:
            stops[2].set()
        events = batch.step()
        for i, s in seqs.items():
            if s in events:
                out[i] += events[s].tokens
        if step == 4:
            assert events[seqs[2]].finish_reason == "stopped" and seqs[2] not in batch.running
            assert seqs[2].cache is None and seqs[2].draft is None   # its memory is free now
            assert len(batch.running) == 3
    while batch.running:
        for s, ev in batch.step().items():
            out[next(i for i, x in seqs.items() if x is s)] += ev.tokens
    for i in (0, 1, 3):
        assert out[i] == _decoder(mixed_adapter, "mtp", 2).generate(PROMPTS[i], max_tokens=30)[0]
    assert len(out[2]) < 30


@pytest.mark.parametrize("depth", [2])
def test_sampled_batched_sequences_follow_the_exact_distribution(sure_adapter, depth):
    """Four sequences per batch (two prompts, two samplers), many batches with distinct seeds;
    per sequence slot, the joint of tokens 2-3 (the first cycle's drafts/corrections) against
    the exact distribution by enumeration. Depth 2 only (two drafts: every acceptance branch a
    cycle has; the greedy tests cover depths 1-3): the suite's time on a 2-core CI host."""
    slots = [([11, 12, 13], SamplerConfig(temperature=1.0, top_p=1.0, top_k=4)),
             ([40, 41], SamplerConfig(temperature=0.8, top_p=0.9, top_k=5)),
             ([11, 12, 13], SamplerConfig(temperature=0.8, top_p=0.9, top_k=5)),
             ([40, 41], SamplerConfig(temperature=1.0, top_p=1.0, top_k=4))]
    runs, n_tokens = 700, depth + 2
    exact = [marginal(exact_joint(sure_adapter, s, p, 3), (1, 2)) for p, s in slots]
    counts = [Counter() for _ in slots]
    for run in range(runs):
        batch = Batch(sure_adapter)
        seqs = [Sequence(_decoder(sure_adapter, "mtp", depth, s, seed=run * 4 + k), p, n_tokens)
                for k, (p, s) in enumerate(slots)]
        out = [list(batch.join(s).tokens) for s in seqs]
        while batch.running:
            for s, ev in batch.step().items():
                out[seqs.index(s)] += ev.tokens
        for k, ids in enumerate(out):
            if len(ids) >= 3:
                counts[k][tuple(ids[1:3])] += 1
    for k in range(len(slots)):
        assert chi_square_pvalue(counts[k], exact[k], sum(counts[k].values())) > 1e-3, k
