"""The prefix cache: turns reuse the prompt state of earlier ones, and change nothing.

Greedy replies with the cache are token-identical to replies from a fresh prefill, for both
lanes, across many turns, with regenerate, undo, an edited earlier message, a changed system
prompt and a reply stopped half-way; the head's history restores consistently; sampled replies
keep their distribution.

A restore point is often not where a fresh prefill of the new prompt ends a chunk (a history
snapshot, an edited turn), and a prefill split elsewhere rounds differently (float32, on every
machine: measured 4.5e-6 on the demo's logits). So these replies are compared up to near-ties
(tests/_ties.py); tests/test_prefix_state.py compares a restore with a fresh prefill of the same
chunks, which is bit for bit.
"""
import threading
from collections import Counter

import mlx.core as mx
import pytest

from adapters import load_adapter
from core import (AutoregressiveDecoder, PrefixCache, SamplerConfig, SpeculativeDecoder, chat_prompt,
                  split_reply)
from core.prefix_cache import common_prefix
from tests._engine_helpers import GREEDY, MIXED, chi_square_pvalue, exact_joint, make_mixed_head, marginal
from tests._ties import assert_greedy_equal

QUESTIONS = ["Hi there", "What is the sea?", "Tell me about the moon.", "And the robot?", "Why?",
             "Write one more line.", "Thanks, bye."]


@pytest.fixture(scope="module")
def adapter(tiny_checkpoint):
    return load_adapter(make_mixed_head(tiny_checkpoint(fresh=True, **MIXED)))


@pytest.fixture(scope="module")
def thinking_adapter(tiny_checkpoint):
    return load_adapter(make_mixed_head(tiny_checkpoint(fresh=True, template="qwen3_5", **MIXED)))


def lane(kind, adapter, cache, sampler=GREEDY, seed=0):
    if kind == "ar":
        return AutoregressiveDecoder(adapter, sampler=sampler, seed=seed, prefix_cache=cache)
    return SpeculativeDecoder(adapter, sampler=sampler, seed=seed, depth=int(kind[-1]), prefix_cache=cache)


def reply(adapter, kind, messages, cache, max_tokens=24, stop=None):
    prompt = chat_prompt(adapter, messages)
    out, stats = [], None
    for ev in lane(kind, adapter, cache).stream(prompt, max_tokens=max_tokens, stop=stop):
        out += ev.tokens
        stats = ev.stats
        if stop is not None and len(out) >= 5:
            stop.set()
    return out, stats


def conversation(adapter, kind, cache):
    """Six+ turns with regenerate, undo, an edit, a system prompt change and a stopped reply;
    returns every reply's token ids, the stats of each and the messages each answered."""
    replies, stats_seen, asked = [], [], []
    msgs = [{"role": "system", "content": "You are brief."}]

    def turn(messages, **kw):
        ids, stats = reply(adapter, kind, messages, cache, **kw)
        replies.append(ids)
        stats_seen.append(stats)
        asked.append(list(messages))
        return adapter.tokenizer.decode(ids)

    for q in QUESTIONS[:4]:
        msgs.append({"role": "user", "content": q})
        msgs.append({"role": "assistant", "content": turn(msgs)})
    turn(msgs[:-1])                                    # regenerate the last reply
    msgs = msgs[:-2]                                   # undo the last exchange
    msgs.append({"role": "user", "content": QUESTIONS[4]})
    msgs.append({"role": "assistant", "content": turn(msgs, stop=threading.Event())})  # stopped mid-reply
    msgs.append({"role": "user", "content": QUESTIONS[5]})
    msgs.append({"role": "assistant", "content": turn(msgs)})
    edited = [dict(m) for m in msgs]
    edited[3]["content"] = "What is the ocean?"       # an edited earlier message
    turn(edited + [{"role": "user", "content": QUESTIONS[6]}])
    changed = [{"role": "system", "content": "You are a pirate."}] + msgs[1:]  # a new system prompt
    turn(changed + [{"role": "user", "content": QUESTIONS[6]}])
    return replies, stats_seen, asked


def assert_turns_equal(adapter, asked, got, want):
    """Turn by turn, up to near-ties; after the first reply that parts at one, the histories differ."""
    for messages, g, w in zip(asked, got, want):
        assert_greedy_equal(adapter, chat_prompt(adapter, messages), g, w, what=messages[-1]["content"])
        if g != w:
            return
    assert len(got) == len(want)


@pytest.mark.parametrize("kind", ["ar", "mtp1", "mtp2", "mtp3"])
def test_greedy_replies_identical_with_and_without_the_cache(adapter, kind):
    cache = PrefixCache(2**30)
    with_cache, stats, _ = conversation(adapter, kind, cache)
    fresh, fresh_stats, asked = conversation(adapter, kind, None)
    assert_turns_equal(adapter, asked, with_cache, fresh)
    assert all(len(r) > 0 for r in fresh)
    cached = [s.cached_tokens for s in stats]
    assert all(c == 0 for c in (s.cached_tokens for s in fresh_stats))
    # every turn after the first reuses something, and prefills only its new part; a new
    # system prompt shares no snapshot with what was cached
    assert cached[0] == 0 and all(c > 0 for c in cached[1:-1]) and cached[-1] == 0, cached
    assert all(s.cached_tokens + s.prefilled_tokens == s.prompt_tokens for s in stats)
    # turn 4 shares all of turn 3's prompt but the generation prompt
    assert stats[3].prefilled_tokens < 0.5 * stats[3].prompt_tokens
    if kind != "ar":
        # The head's history restores as a fresh prefill builds it: the same acceptance, to the
        # drafts at a near-tie of the head's logits, which may go either way (its history is
        # restored bit for bit in tests/test_prefix_state.py, against the same chunks).
        rate = [sum(s.accepted for s in run) / max(1, sum(s.proposed for s in run)) for run in (stats, fresh_stats)]
        assert abs(rate[0] - rate[1]) < 0.05, rate
        assert sum(s.proposed for s in stats) > 0


@pytest.mark.parametrize("kind", ["ar", "mtp2"])
def test_thinking_template_reuses_the_history_before_the_generation_prompt(thinking_adapter, kind):
    ad = thinking_adapter
    cache = PrefixCache(2**30)
    msgs = [{"role": "system", "content": "Think, then answer."}]
    previous = None
    for q in QUESTIONS[:3]:
        msgs.append({"role": "user", "content": q})
        prompt = chat_prompt(ad, msgs)
        text = ad.tokenizer.decode(list(prompt.ids))
        assert text.endswith("<|im_start|>assistant\n<think>\n")       # the template opened the block
        ids, stats = lane(kind, ad, cache).generate(prompt, max_tokens=20)
        fresh, _ = lane(kind, ad, None).generate(prompt, max_tokens=20)
        assert_greedy_equal(ad, prompt, ids, fresh)
        # each turn restores the snapshot taken just before the previous generation prompt
        assert stats.cached_tokens == (previous.marks[-1] if previous else 0)
        previous = prompt
        _, answer = split_reply("<think>\n" + ad.tokenizer.decode(ids))
        msgs.append({"role": "assistant", "content": "<think>\nhm\n</think>\n\n" + answer})
    # the re-rendered history drops the earlier turns' thinking, so the reply's own state is no
    # use to the next turn; the snapshot before the generation prompt is
    assert len(prompt.marks) == 2
    nxt = chat_prompt(ad, msgs + [{"role": "user", "content": "Again?"}])
    assert common_prefix(nxt.ids, prompt.ids) >= prompt.marks[-1]


@pytest.mark.parametrize("depth", [2, 3])
def test_sampled_replies_from_a_restored_state_follow_the_exact_distribution(sure_adapter, depth):
    """Every run restores the cached prompt, then samples; tokens 2 and 3 (inside the first cycle)
    follow the exact distribution computed from a fresh prefill (chi-square)."""
    ad = sure_adapter
    sampler = SamplerConfig(temperature=1.0, top_k=4, top_p=1.0)
    prompt = chat_prompt(ad, [{"role": "system", "content": "x"}, {"role": "user", "content": "Hello"}])
    exact = marginal(exact_joint(ad, sampler, list(prompt.ids), 3), (1, 2))
    # 400 runs (1,200 before): at 396 the acceptance mutants that change this distribution failed
    # at p < 1e-15 (docs/bench/2026-12-01/sampled-tests-power.json). A head history restored short
    # or not at all changes only q, which exact sampling never lets through: the tensor-level
    # checks of tests/test_prefix_state.py catch those.
    cache, runs = PrefixCache(2**30), 400
    lane("ar", ad, cache).generate(prompt, max_tokens=1)              # the prompt is cached
    counts, drafted = Counter(), 0
    for seed in range(runs):
        ids, stats = lane(f"mtp{depth}", ad, cache, sampler, seed=seed).generate(prompt, max_tokens=depth + 2)
        assert stats.cached_tokens == prompt.marks[-1]
        drafted += len(stats.proposed_per_depth) >= depth and stats.proposed_per_depth[depth - 1] > 0
        if len(ids) >= 3:
            counts[tuple(ids[1:3])] += 1
    assert drafted > runs * 0.3          # depth D really was drafted
    assert chi_square_pvalue(counts, exact, sum(counts.values())) > 1e-3


def test_memory_stays_within_the_budget(adapter):
    budget = 3 * 2**20
    cache = PrefixCache(budget)
    for c in range(12):
        msgs = [{"role": "system", "content": f"Conversation {c}."}, {"role": "user", "content": QUESTIONS[c % 7] * 6}]
        lane("mtp1", adapter, cache).generate(chat_prompt(adapter, msgs), max_tokens=4)
        assert cache.nbytes <= budget
    assert len(cache) > 0


def test_prefill_stops_between_chunks(adapter, monkeypatch):
    import core.stream

    monkeypatch.setattr(core.stream, "PREFILL_CHUNK", 64)
    stop = threading.Event()
    calls = []
    real = adapter.forward

    def counting(tokens, cache, **kw):
        calls.append(tokens.shape[1])
        if len(calls) == 3:
            stop.set()          # Stop pressed while the third chunk runs
        return real(tokens, cache, **kw)

    monkeypatch.setattr(adapter, "forward", counting)
    events = list(lane("mtp2", adapter, None).stream(list(range(5, 500)), max_tokens=10, stop=stop))
    assert len(calls) == 3                      # no chunk after the one running when Stop came
    assert events[-1].finish_reason == "stopped" and events[-1].stats.generated_tokens == 0


TOOL = {"type": "function", "function": {"name": "lookup", "description": "Look a word up.",
                                         "parameters": {"type": "object", "properties": {"word": {"type": "string"}}}}}


@pytest.mark.parametrize("think", [None, False, True])
@pytest.mark.parametrize("tools", [None, [TOOL]])
@pytest.mark.parametrize("system", [True, False])
def test_the_prompt_encoded_once_has_the_ids_and_marks_of_each_part_encoded(system, tools, think):
    """core.chat.chat_prompt reads its marks off one encoding of the prompt (an agent's 20k-token
    prompt was encoded three times a request): the same ids and marks as rendering each part,
    on the demo's tokenizer (the one encoding is used only where a probe at load agrees)."""
    from core import chat as chat_mod

    ad = load_adapter("models/demo")
    assert chat_mod._encodes_once(ad)
    msgs = ([{"role": "system", "content": "You are brief. " * 30}] if system else []) + [
        {"role": "user", "content": "What is a harbor? " * 20}, {"role": "assistant", "content": "A port. é 12"},
        {"role": "user", "content": "And a river?\n\n  spaced  "}]
    once = chat_prompt(ad, msgs, tools=tools, enable_thinking=think)
    ad.tokenizer._mtp_encodes_once = False
    try:
        each = chat_prompt(ad, msgs, tools=tools, enable_thinking=think)
    finally:
        ad.tokenizer._mtp_encodes_once = True
    assert once.ids == each.ids and once.marks == each.marks and len(once.marks) == (2 if system else 1)


@pytest.mark.parametrize("model", ["demo", "qwen3_5"])
def test_a_conversation_encoded_a_piece_at_a_time_is_the_whole_encoding_and_encodes_only_what_is_new(
        model, tiny_checkpoint, monkeypatch):
    """core/pieces.py: an agent's conversation, turn after turn (a system prompt, tool calls and
    results, thinking), encoded a piece at a time gives the whole text's ids and spans; a turn
    encodes only its new pieces (the rest were kept); history_prompt gives render's ids; the
    pieces kept stay under their budget."""
    import core.pieces
    from core import history_prompt
    from core.chat import _encodes_once, _template_text, render

    ad = load_adapter("models/demo" if model == "demo" else tiny_checkpoint(template="qwen3_5"))
    tok = ad.tokenizer
    assert _encodes_once(ad)
    tok._mtp_pieces = None   # a fresh store for this test
    encoded = []
    real = tok._tokenizer

    class Counting:   # counts the characters the tokenizer is handed
        def __call__(self, text, **kw):
            encoded.append(len(text))
            return real(text, **kw)

        def __getattr__(self, name):
            return getattr(real, name)

    monkeypatch.setattr(tok, "_tokenizer", Counting())
    msgs = [{"role": "system", "content": "You help with words.\n<tool_call>\n not a call " * 40},
            {"role": "user", "content": "Look up harbor. é 12"}]
    for turn in range(4):
        text = _template_text(tok, msgs, True, {"tools": [TOOL], "enable_thinking": None})
        encoded.clear()
        got = core.pieces.encode(tok, text).tolist()
        enc = real(text, add_special_tokens=False, return_offsets_mapping=True)
        assert got == [list(enc["input_ids"]), [a for a, _ in enc["offset_mapping"]], [b for _, b in enc["offset_mapping"]]]
        if turn:
            assert 0 < sum(encoded) < len(text) / 3, (turn, sum(encoded), len(text))   # the new messages only
        msgs += [{"role": "assistant", "content": "", "reasoning_content": f"think {turn}",
                  "tool_calls": [{"type": "function", "id": "x", "function": {"name": "lookup", "arguments": {"word": "w"}}}]},
                 {"role": "tool", "tool_call_id": "x", "content": f"result {turn}\n\n  spaced  "}]
    hist = history_prompt(ad, msgs, tools=[TOOL])
    assert list(hist.ids) == render(ad, msgs, add_generation_prompt=False, tools=[TOOL])
    monkeypatch.setattr(core.pieces, "MAX_TOKENS", 50)   # a new piece makes room: the oldest go
    core.pieces.encode(tok, _template_text(tok, msgs + [{"role": "user", "content": "and boat?"}], True,
                                        {"tools": None, "enable_thinking": None}))
    assert 0 < tok._mtp_pieces.tokens <= 50 or len(tok._mtp_pieces.pieces) == 1


def test_overlapping_chunks_compute_what_chunks_one_after_another_do(adapter, monkeypatch):
    """core.stream.PIPELINE (on by default on a GPU: the device runs a chunk while the host builds
    the next) changes when chunks run, never what they compute: forced on here (the CPU's default
    is off), a chunked prefill with a mark gives the same logits, hidden, caches and snapshot as
    forced off, bit for bit."""
    import core.stream
    from core.stream import Prompt, prefill

    monkeypatch.setattr(core.stream, "PREFILL_CHUNK", 64)
    ids = tuple((i * 7) % 500 + 3 for i in range(300))
    got = {}
    for overlap in (True, False):
        monkeypatch.setattr(core.stream, "PIPELINE", overlap)
        pc = PrefixCache(2**30)
        cache = adapter.make_cache()
        draft = adapter.make_draft(cache)
        done = prefill(adapter, Prompt(ids, (150,)), cache, draft, pc)
        snap = pc.lookup(ids[:200])
        got[overlap] = [done.logits, done.hidden, *adapter.state_arrays(cache, draft), *snap.state.arrays.values()]
        assert done.parts["chunks"] == 6 and 0 < done.parts["build_s"] <= done.parts["chunks_s"] and snap.length == 150
    flat = lambda xs: [a for x in xs for a in (x if isinstance(x, (list, tuple)) else [x]) if isinstance(a, mx.array)]  # noqa: E731
    assert all(bool(mx.array_equal(a, b)) for a, b in zip(flat(got[True]), flat(got[False])))



def test_chunks_end_at_every_mark_and_every_chunk_after_it():
    """core.stream.chunk_ends: chunks end at every mark and at the end, and every `chunk` tokens
    counted from the last mark (so a prompt restored at a mark runs the chunks a fresh prefill
    runs after it)."""
    import random

    from core.stream import chunk_ends

    assert chunk_ends(0, 2000, [], 512) == [512, 1024, 1536, 2000]
    assert chunk_ends(0, 2000, [1200, 1995], 512) == [512, 1024, 1200, 1712, 1995, 2000]
    assert chunk_ends(1200, 2000, [1995], 512) == [1712, 1995, 2000]   # restored at 1200: the same ends
    rng = random.Random(0)
    for _ in range(500):
        end = rng.randint(1, 3000)
        start = rng.randint(0, end - 1)
        marks = sorted(rng.sample(range(start + 1, end), min(3, end - start - 1)))
        for chunk in (16, 64, 512):
            ends = chunk_ends(start, end, marks, chunk)
            assert ends == sorted(set(ends)) and ends[-1] == end and set(marks) <= set(ends)
            assert all(0 < b - a <= chunk for a, b in zip([start] + ends, ends))
