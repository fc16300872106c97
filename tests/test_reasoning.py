"""Thinking text: the streaming splitter, and stop strings / EOS inside the reasoning."""
import pytest

from adapters import load_adapter
from core import SamplerConfig, SpeculativeDecoder, ThinkSplitter, chat_prompt, opens_thinking, split_reply
from tests._engine_helpers import seed_that_closes_thinking


def pieces(text_chunks, inside=False):
    s = ThinkSplitter(inside)
    out = []
    for c in text_chunks:
        out += s.feed(c)
    out += s.flush()
    merged = []
    for kind, t in out:
        if merged and merged[-1][0] == kind:
            merged[-1] = (kind, merged[-1][1] + t)
        else:
            merged.append((kind, t))
    return merged


@pytest.mark.parametrize("chunks", [
    ["<think>\nplan it\n</think>\n\nThe answer."],
    ["<thi", "nk>\nplan", " it\n</th", "ink>", "\n\nThe", " answer."],          # tags split across chunks
    list("<think>\nplan it\n</think>\n\nThe answer."),                          # one character at a time
])
def test_tags_split_anywhere_give_the_same_pieces(chunks):
    assert pieces(chunks) == [("reasoning", "plan it\n"), ("content", "The answer.")]


def test_reply_that_starts_inside_the_block_and_partial_tags_at_the_end():
    assert pieces(["plan\n</think>\n\nok"], inside=True) == [("reasoning", "plan\n"), ("content", "ok")]
    assert pieces(["no thinking here <thin"]) == [("content", "no thinking here <thin")]   # held, then flushed
    assert pieces(["still thinking"], inside=True) == [("reasoning", "still thinking")]  # EOS inside the block
    assert split_reply("a</think>b", inside=True) == ("a", "b")
    assert split_reply("plain") == ("", "plain")


def test_opens_thinking_reads_the_generation_prompt():
    assert opens_thinking("<|im_start|>assistant\n<think>\n")
    assert not opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not opens_thinking("<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def thinking(tiny_checkpoint):
    return load_adapter(tiny_checkpoint(template="qwen3_5"))


def test_stop_strings_apply_to_the_answer_not_the_reasoning(thinking):
    ad = thinking
    prompt = chat_prompt(ad, [{"role": "user", "content": "Hello"}])
    sampler = SamplerConfig(temperature=1.0, top_p=1.0, top_k=0)
    seed, text = seed_that_closes_thinking(ad)    # a reply that closes its thinking, then answers
    in_reasoning = text[: text.index("</think>")][1:4]
    in_answer = text[text.index("</think>") + len("</think>"):].lstrip()[2:5]
    lane = SpeculativeDecoder(ad, sampler=sampler, seed=seed, depth=2)
    out = "".join(e.text for e in lane.stream(prompt, max_tokens=40, stop_strings=[in_reasoning], thinking=True))
    if in_reasoning not in text[text.index("</think>"):]:
        assert out == text                            # a stop string inside the reasoning does not stop
    events = list(lane.stream(prompt, max_tokens=40, stop_strings=[in_answer], thinking=True))
    out = "".join(e.text for e in events)
    assert events[-1].finish_reason == "stop_string"
    assert "</think>" in out and out == text[: text.index(in_answer, text.index("</think>"))]


def test_no_text_of_a_stop_string_is_sent_before_the_match_completes(thinking):
    """A stop string split across events: the part before the match must not leak out."""
    ad = thinking
    prompt = chat_prompt(ad, [{"role": "user", "content": "Hello"}], enable_thinking=False)
    sampler = SamplerConfig(temperature=0)
    text = "".join(e.text for e in SpeculativeDecoder(ad, sampler=sampler, depth=1).stream(prompt, max_tokens=40))
    stop = text[10:22]                          # long enough to span several tokens
    events = list(SpeculativeDecoder(ad, sampler=sampler, depth=1).stream(prompt, max_tokens=40, stop_strings=[stop]))
    sent = ""
    for e in events:
        sent += e.text
        assert stop not in sent and text.startswith(sent)
    assert sent == text[: text.index(stop)] and events[-1].finish_reason == "stop_string"
    # every streamed piece so far is a prefix of the final text, never more
    assert all(text.startswith("".join(e.text for e in events[:i])) for i in range(len(events)))
