"""Batched decoding (core/batch.py): every sequence of a batch gets what it gets alone.

Greedy: 8 requests with different prompts and lengths, joining and leaving mid-way, token for
token equal to the same request decoded alone, in both lanes and at depths 1-3, up to near-ties
(tests/_ties.py). A batch's rows go through matmuls of B times the rows; on the CPU the BLAS
may sum those in another order than a lone sequence's (on an AMD EPYC with OpenBLAS a batched
verify of the demo model came out 6.7e-6 from the lone one; on other hosts bit for bit), so what
holds on every machine is agreement to float32 rounding (test_batched_rows_agree_with_alone_to_rounding)
and greedy tokens equal unless two logits tie within it. Where MLX's own kernels compute each row
alike (bf16 and quantized matmuls on the CPU: no BLAS), batched equals alone with == , sampled
replies with the same seed included. Sampled: a chi-square per sequence of a batch against the
exact distribution."""
import re
from pathlib import Path
import threading
from collections import Counter

import mlx.core as mx
import pytest

from adapters import load_adapter
from core import AutoregressiveDecoder, SamplerConfig, SpeculativeDecoder
from core.batch import Batch, Sequence
from core.settings import DEMO_MODEL_DIR
from core.exactness import probe
from tests._engine_helpers import (MIXED, SURE, chi_square_pvalue, exact_joint, load_modules_path,
                                   make_mixed_head, marginal)
from tests._ties import ROUNDING, assert_greedy_equal

GREEDY = SamplerConfig(temperature=0)
PROMPTS = [list(range(5, 25)), [100, 7, 300, 42], [3], list(range(200, 460, 3)), [9, 8, 7, 6, 5],
           [44] * 30, [17, 2], list(range(60, 90))]
LENGTHS = [40, 25, 60, 33, 50, 45, 12, 36]
# step -> requests that join then: three at the start, the rest while others decode (and after
# some have left: request 6 is short)
JOIN_AT = {0: [0, 1, 2], 3: [3], 5: [4, 6], 9: [5], 20: [7]}


def assert_as_alone(adapter, prompts, batched, alone, what=""):
    for i, (p, got, want) in enumerate(zip(prompts, batched, alone)):
        assert_greedy_equal(adapter, p, got, want, what=f"{what} request {i}")
    assert len(batched) == len(alone)


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


@pytest.fixture(scope="module")
def bf16_adapter(tiny_checkpoint):
    """What a GPU runs when its kernels are off (and around them when on): MLX's own ops in the
    checkpoint's bf16, attention computed row by row (row_invariant, as backends.choose sets it on
    a GPU), a batch's rows through the same `few` runner [B, S, H]. On the CPU no BLAS is in it:
    MLX's quantized and bf16 matmuls compute each row alike whatever the row count, so batched
    rows equal lone rows bit for bit on every machine."""
    from adapters.qwen3_5.backends import Backend, MlxOps

    adapter = load_adapter(make_mixed_head(tiny_checkpoint(fresh=True, **{**MIXED, "bits": 4, "dtype": "bfloat16"})),
                           compiled=False, compute_dtype="native", log=lambda m: None)
    adapter.backend = Backend("mlx", MlxOps(row_invariant=True), MlxOps())
    assert adapter.forward(mx.array([[5, 6]]), adapter.make_cache())[1].dtype == mx.bfloat16
    assert probe(adapter).batched.exact
    return adapter


@pytest.mark.parametrize("mode,depth", [("ar", 0), ("mtp", 1), ("mtp", 2), ("mtp", 3)])
@pytest.mark.parametrize("which", ["mixed_adapter", "mixed_modules"])
def test_greedy_batched_equals_alone_with_joins_and_leaves(request, which, mode, depth):
    adapter = request.getfixturevalue(which)
    alone = [_decoder(adapter, mode, depth).generate(p, max_tokens=n)[0] for p, n in zip(PROMPTS, LENGTHS)]
    batched, sizes, seqs = run_batched(adapter, mode, depth)
    assert_as_alone(adapter, PROMPTS, batched, alone)
    assert max(sizes) >= 5 and len(set(sizes)) > 3   # several together, the batch grew and shrank
    if mode == "mtp":
        stats = [s.last.stats for s in seqs.values()]
        assert sum(s.accepted for s in stats) > 0 and sum(s.proposed - s.accepted for s in stats) > 0


def test_batched_rows_agree_with_alone_to_rounding(demo_adapter, mixed_adapter, mixed_modules):
    """What "as alone" rests on, measured with the app's own probe (core/exactness.py): a batched
    verify and a batched one-token step of 3 sequences against each alone, and a verify against
    the decode steps. Within float32 rounding on every machine; bit for bit on some (which one
    this machine gives is what the start-up banner says, not something to assert: AVX-512
    OpenBLAS rounds the demo's batched verify 6.7e-6 away, other hosts its one-token step)."""
    for adapter in (demo_adapter, mixed_adapter, mixed_modules):
        found = probe(adapter)
        for a in (found.verify_vs_steps, found.batched_verify, found.batched_step):
            assert a.max_diff < ROUNDING, found


def test_demo_model_batched_equals_alone(demo_adapter):
    prompts = [[p % 1000 + 10 for p in q] for q in PROMPTS[:6]]
    lengths = [24, 16, 30, 20, 28, 10]
    join_at = {0: [0, 1], 2: [2, 3], 6: [4, 5]}
    for mode, depth in (("ar", 0), ("mtp", 2)):
        alone = [_decoder(demo_adapter, mode, depth).generate(p, max_tokens=n)[0] for p, n in zip(prompts, lengths)]
        batched, sizes, _ = run_batched(demo_adapter, mode, depth, prompts, lengths, join_at)
        assert_as_alone(demo_adapter, prompts, batched, alone, mode)
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
        alone = _decoder(mixed_adapter, "mtp", 2).generate(PROMPTS[i], max_tokens=30)[0]
        assert_greedy_equal(mixed_adapter, PROMPTS[i], out[i], alone, what=str(i))
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
    # 200 batches (700 before): at 231 the acceptance mutants that change this distribution failed
    # at p < 1e-15 (docs/bench/2026-12-01/sampled-tests-power.json)
    runs, n_tokens = 200, depth + 2
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


@pytest.mark.parametrize("mode,depth", [("ar", 0), ("mtp", 2)])
def test_a_long_prompt_admitted_in_chunks_equals_alone(mixed_adapter, mode, depth):
    """A newcomer admitted while four decode prefills one chunk per step, after their cycle:
    the others keep getting a token every step, and its output equals decoding it alone (one
    whole prefill); one admitted into an empty batch prefills whole in one step."""
    long = [(i * 7) % 500 + 3 for i in range(300)]
    alone = _decoder(mixed_adapter, mode, depth).generate(long, max_tokens=20)[0]
    batch = Batch(mixed_adapter, prefill_chunk=32)
    others = [Sequence(_decoder(mixed_adapter, mode, depth), PROMPTS[i], 200) for i in range(4)]
    for s in others:
        batch.join(s)
    batch.step()
    new = Sequence(_decoder(mixed_adapter, mode, depth), long, 20)
    batch.admit(new)
    out, prefill_steps = [], 0
    while new in batch.joining or new in batch.running:
        decoding = [s for s in others if s in batch.running]
        events = batch.step()
        assert all(events[s].tokens or events[s].finished for s in decoding)   # nobody waits a step out
        if new in batch.joining:
            prefill_steps += 1
            assert new not in events
        if new in events:
            out += events[new].tokens
    assert_greedy_equal(mixed_adapter, long, out, alone)   # chunked prefill: rounds as any other chunking
    assert prefill_steps == 300 // 32   # the tenth chunk ends the prefill and gives the first token

    empty = Batch(mixed_adapter, prefill_chunk=32)
    first = Sequence(_decoder(mixed_adapter, mode, depth), long, 20)
    empty.admit(first)
    assert empty.step()[first].tokens == alone[:1] and first in empty.running


def test_a_newcomer_stopped_while_it_prefills_leaves(mixed_adapter):
    batch = Batch(mixed_adapter, prefill_chunk=16)
    batch.join(Sequence(_decoder(mixed_adapter, "mtp", 2), PROMPTS[0], 40))
    stop = threading.Event()
    new = Sequence(_decoder(mixed_adapter, "mtp", 2), list(range(5, 200)), 20, stop=stop)
    batch.admit(new)
    batch.step()
    batch.step()
    assert new in batch.joining and 0 < new.prefilled < 195
    stop.set()
    events = batch.step()
    assert events[new].finish_reason == "stopped" and events[new].tokens == []
    assert new not in batch.joining and new.cache is None and len(batch.running) == 1


def test_sampled_and_constrained_sequences_in_a_batch_equal_alone(bf16_adapter):
    """The AR lane's sequences are pipelined in a batch as the lane pipelines itself (the next
    step queued before this token is read): each draws its keys in the lane's order, and a
    grammar advances over the token in flight before its next mask. So sampled replies with
    the same seed, and grammar-constrained ones, equal decoding alone, in both lanes, with ==:
    on the bf16 path (bf16_adapter) a batch's rows are a lone sequence's bit for bit on every
    machine. (Where rows round differently, as float32 through the BLAS may, a sampled draw can
    flip wherever it falls within rounding of a boundary, which no near-tie of the logits shows.)"""
    adapter = bf16_adapter
    from core import Constraint
    from core.constraints import lark_grammar

    words = lark_grammar(r'start: /([a-z]+ [0-9]+ )*[a-z]*/')   # a state the mask depends on
    hot = SamplerConfig(temperature=1.0, top_p=0.95, top_k=20)

    def make(mode, k):
        constraint = Constraint(adapter.tokenizer, words, adapter.contract.vocab_size) if k % 2 else None
        sampler = hot if k < 4 else GREEDY
        return (AutoregressiveDecoder(adapter, sampler=sampler, seed=k, constraint=constraint) if mode == "ar"
                else SpeculativeDecoder(adapter, sampler=sampler, seed=k, depth=2, constraint=constraint))

    for mode in ("ar", "mtp"):
        alone = [make(mode, k).generate(PROMPTS[k], max_tokens=30)[0] for k in range(6)]
        batch, out = Batch(adapter), {}
        seqs = [Sequence(make(mode, k), PROMPTS[k], 30) for k in range(6)]
        for k, s in enumerate(seqs):
            out[k] = list(batch.join(s).tokens)
        while batch.running:
            for s, ev in batch.step().items():
                out[seqs.index(s)] += ev.tokens
        assert [out[k] for k in range(6)] == alone, mode
        texts = [adapter.tokenizer.decode(alone[k]) for k in (1, 3, 5)]
        # what the grammar allows, cut at max_tokens anywhere
        assert all(re.fullmatch(r"([a-z]+ [0-9]+ )*([a-z]+( [0-9]*)?)?", t) for t in texts), texts
        assert any(re.search(r"[0-9]", t) for t in texts), texts   # the grammar's state changed the mask


def test_the_gpu_path_batched_equals_alone_in_bf16(bf16_adapter):
    """The GPU's path (bf16_adapter): batched greedy decoding equals each request alone in both
    lanes, bit for bit (MLX's own kernels compute a batch's rows as one row)."""
    adapter = bf16_adapter
    for mode, depth in (("ar", 0), ("mtp", 2)):
        alone = [_decoder(adapter, mode, depth).generate(p, max_tokens=n)[0] for p, n in zip(PROMPTS[:5], LENGTHS[:5])]
        batched, sizes, _ = run_batched(adapter, mode, depth, PROMPTS[:5], LENGTHS[:5], {0: [0, 1, 2], 3: [3, 4]})
        assert batched == alone, mode
        assert max(sizes) == 5


RECORDED = Path(__file__).resolve().parent.parent / "docs" / "bench" / "cpu-batch-demo.json"


def _threshold(costs, depths=(1, 2, 3)) -> float:
    """The lowest acceptance (the same at every depth) at which some depth beats plain AR."""
    from core.costs import predicted_speedup

    lo, hi = 0.0, 1.0
    for _ in range(40):
        a = (lo + hi) / 2
        if max(predicted_speedup(costs, [a] * 3, d) for d in depths if d in costs.cycles) > 1.0:
            hi = a
        else:
            lo = a
    return hi


def _stats_at(acceptance: float, cycles: int = 100_000):
    from core.stats import GenerationStats

    stats = GenerationStats(mode="mtp")
    reached = cycles
    for _ in range(3):
        stats.proposed_per_depth.append(reached)
        stats.accepted_per_depth.append(round(reached * acceptance))
        reached = round(reached * acceptance)
    return stats


def test_auto_prices_the_batch_size_on_the_recorded_costs():
    """The cost model measured on the demo model on this CPU (scripts/bench/bench_batch.py --costs:
    core/batch.py's own steps at 2, 4 and 8 sequences): a batched AR step costs more than one
    sequence's and less than B of them (one pass over the weights), and 'auto' decides at each
    batch size with that size's measured cycles: the acceptance a draft needs to pay differs
    from alone, and between the two the policy speculates at one size and not at the other."""
    import json

    from core.costs import Costs, DepthPolicy

    costs = Costs.from_dict(json.loads(RECORDED.read_text())["costs"])
    assert set(costs.batches) == {2, 4, 8}
    for size, row in costs.batches.items():
        assert 1.0 < row[0] < size, (size, row)
        assert costs.at_batch(size).cycles == {d: c for d, c in row.items() if d > 0}
    alone = _threshold(costs)
    # Measured (docs/bench/cpu-batch-demo.json): a draft needs acceptance 0.44 to pay alone, 0.57
    # at 2 sequences, 0.44 at 4, 0.71 at 8: in a batch of 8 speculation pays less.
    assert _threshold(costs.at_batch(8)) > alone + 0.1
    for size in (2, 4, 8):
        together = _threshold(costs.at_batch(size))
        if abs(together - alone) < 0.01:
            continue   # priced as alone at this size
        between = _stats_at((alone + together) / 2)
        policy = DepthPolicy("auto", 3, costs)
        speculates = {b: policy.choose(between, b) > 0 for b in (1, size)}
        assert speculates[1] == (together > alone) and speculates[size] == (together < alone), (size, alone, together)


def test_each_sequence_is_priced_at_the_batch_size_it_decodes_in(mixed_adapter):
    """The batch hands every sequence's depth policy the number of sequences stepping together
    (those not stopped), each step, so a batch that shrinks is priced smaller."""
    import json

    from core.costs import Costs

    costs = Costs.from_dict(json.loads(RECORDED.read_text())["costs"])
    batch, seen = Batch(mixed_adapter), []
    for i in range(6):
        d = SpeculativeDecoder(mixed_adapter, sampler=GREEDY, depth="auto", max_depth=3)
        d.costs = costs
        batch.join(Sequence(d, PROMPTS[i], LENGTHS[i]))
    for s in batch.running:
        choose = s.policy.choose
        s.policy.choose = lambda stats, size, choose=choose: (seen.append(size), choose(stats, size))[1]
    sizes = []
    while batch.running:
        n = len(batch.running)
        seen.clear()
        batch.step()
        assert seen == [n] * n
        sizes.append(n)
    assert len(set(sizes)) > 2


def test_greedy_rows_sample_in_one_launch_as_each_row_alone():
    """core.sampling.greedy_rows_or_flag (a batch's greedy AR steps without a grammar): each row's
    token is sample_or_flag's on that row alone, a tie to the lowest index, a non-finite row -1."""
    from core.sampling import greedy_rows_or_flag, sample_or_flag

    greedy = SamplerConfig(temperature=0)
    x = mx.random.normal((5, 300), key=mx.random.key(7)).astype(mx.bfloat16)
    x[1, 17] = x[1, 250] = 9.0                    # a tie
    x[3, 40] = float("nan")                      # a broken row
    x[4, 0] = float("inf")
    got = greedy_rows_or_flag(x).tolist()
    alone = [sample_or_flag(greedy, x[b:b + 1], None).item() for b in range(5)]
    assert got == alone and got[1] == 17 and got[3] == -1 and got[4] == -1


def test_a_batch_of_greedy_sequences_samples_once_for_all(mixed_adapter, monkeypatch):
    """Batch._ar_step: greedy sequences without a grammar sample in one launch (one call of
    greedy_rows_or_flag a step, none of sample_or_flag), and decode what they decode alone."""
    import core.batch as batch_mod

    calls = Counter()
    for name in ("greedy_rows_or_flag", "sample_or_flag"):
        real = getattr(batch_mod, name)
        monkeypatch.setattr(batch_mod, name, lambda *a, _real=real, _name=name, **k: (calls.update([_name]), _real(*a, **k))[1])
    prompts = [[5, 9, 13, 21], [3, 4, 5, 6, 7, 8], [40, 41]]
    alone = [AutoregressiveDecoder(mixed_adapter, sampler=GREEDY).generate(p, max_tokens=12)[0] for p in prompts]
    calls.clear()
    batch = Batch(mixed_adapter)
    seqs = [Sequence(AutoregressiveDecoder(mixed_adapter, sampler=GREEDY), p, 12) for p in prompts]
    out = {id(s): [] for s in seqs}
    for s in seqs:
        out[id(s)] += list(batch.join(s).tokens)
    while batch.running:
        for s, ev in batch.step().items():
            out[id(s)] += list(ev.tokens)
    assert [out[id(s)] for s in seqs] == [list(a) for a in alone]
    assert calls["greedy_rows_or_flag"] >= 8 and calls["sample_or_flag"] <= len(prompts) * 2


@pytest.mark.parametrize("keeps", [[1, 3, 2], [2, 2, 2], [1, 1, 1]])
def test_a_batch_rolls_back_together_as_each_sequence_alone(bf16_adapter, keeps):
    """rollback_batch (the kept rows of every Gated-DeltaNet layer gathered once for the batch,
    or sliced where every row keeps as many) leaves each sequence's caches bit for bit as
    `rollback` one at a time does, at mixed keeps (1, all 3, 2 of 3 verified positions) and at
    one keep for all, keeps the batch's rows stacked for its next step (no concatenation), and
    the next verify computes the same; all kept, nothing moves."""
    from adapters.qwen3_5 import layers

    ad = bf16_adapter
    prompts = [[5, 9, 13, 21, 34], [100, 7, 300], [3, 8, 2, 11]]
    verify = mx.array([[40, 41, 42], [50, 51, 52], [60, 61, 62]])

    def verified():
        caches = [ad.make_cache() for _ in prompts]
        for ids, c in zip(prompts, caches):
            ad.forward(mx.array([ids]), c)
        _, _, captured = ad.forward_batch(verify, caches, capture=True)
        return caches, captured

    def arrays(caches):
        out = []
        for c in caches:
            for layer in c:
                if isinstance(layer, list) or hasattr(layer, "stacked"):
                    out += [layer[0], layer[1]]
                else:
                    out += [layer.keys[..., :layer.offset, :], layer.values[..., :layer.offset, :]]
        return out

    one, together = verified(), verified()
    for cache, cap, keep in zip(*one, keeps):
        ad.rollback(cache, cap, keep)
    ad.rollback_batch(*together, keeps)
    a, b = arrays(one[0]), arrays(together[0])
    assert len(a) == len(b) and all(x.shape == y.shape and bool(mx.array_equal(x, y)) for x, y in zip(a, b))
    assert [c[0].offset if hasattr(c[0], "offset") else None for c in one[0]] == \
        [c[0].offset if hasattr(c[0], "offset") else None for c in together[0]]
    i, p = next((i, p) for i, p in enumerate(ad.stack.layers) if isinstance(p, layers.GdnParams))
    cs = [c[i] for c in together[0]]
    assert layers._stacked_states(p, cs, mx.bfloat16)[1] is cs[0].stacked[1]   # stacked, for the next step
    assert one[0][0][i].stacked is None and one[0][2][i].stacked is None   # one at a time: the note goes
    nxt = mx.array([[70, 71], [80, 81], [90, 91]])
    got_one, got_together = ad.forward_batch(nxt, one[0])[0], ad.forward_batch(nxt, together[0])[0]
    assert bool(mx.array_equal(got_one, got_together))
    caches, captured = verified()
    held = lambda: [(id(l[0]), id(l[1])) if not hasattr(l, "offset") else l.offset for c in caches for l in c]  # noqa: E731
    before = held()
    ad.rollback_batch(caches, captured, [3, 3, 3])                      # every position kept
    assert held() == before and all(c.batch is None for c in captured)
