"""Context limits (core.limits): what does not fit is trimmed with a notice or refused, cheaply."""

import pytest

from adapters import load_adapter
from core import ContextError, InputTooLarge, chat_prompt, context_window, fit_chat


@pytest.fixture(scope="module")
def adapter(tiny_checkpoint):
    return load_adapter(tiny_checkpoint(max_position_embeddings=512))


def history(turns, words=12):
    msgs = [{"role": "system", "content": "Keep me."}]
    for i in range(turns):
        msgs += [{"role": "user", "content": f"Question {i}: " + "tell me more " * words},
                 {"role": "assistant", "content": f"Answer {i}: " + "the sea is wide " * words}]
    return msgs + [{"role": "user", "content": "The last question."}]


def test_the_context_is_the_models_own_or_a_lower_cap(adapter):
    assert context_window(adapter) == 512
    assert context_window(adapter, cap=300) == 300
    assert context_window(adapter, cap=10_000) == 512


def test_a_conversation_that_fits_is_untouched(adapter):
    msgs = history(1)
    fitted = fit_chat(adapter, msgs, max_tokens=32)
    assert fitted.dropped == 0 and fitted.notice is None
    assert fitted.prompt.ids == chat_prompt(adapter, msgs).ids


def test_oldest_turns_are_dropped_with_a_notice_keeping_the_system_prompt(adapter):
    msgs = history(12)
    assert len(chat_prompt(adapter, msgs).ids) + 64 > 512
    fitted = fit_chat(adapter, msgs, max_tokens=64)
    assert len(fitted.prompt.ids) + 64 <= 512
    assert fitted.dropped > 0 and fitted.dropped % 2 == 0          # whole turns
    assert f"{fitted.dropped} oldest messages" in fitted.notice and "512" in fitted.notice
    text = adapter.tokenizer.decode(fitted.ids)
    assert text.startswith("<|im_start|>system\nKeep me.") and "The last question." in text
    assert "Question 0:" not in text and "Question 11:" in text
    # the fewest turns that fit are dropped: one more turn would not fit
    kept = [msgs[0]] + msgs[1 + fitted.dropped - 2:]
    assert len(chat_prompt(adapter, kept).ids) + 64 > 512


def test_refused_instead_of_trimmed_when_asked(adapter):
    with pytest.raises(ContextError, match="context of 512 tokens"):
        fit_chat(adapter, history(12), max_tokens=64, trim=False)


def test_a_message_that_alone_is_too_long_is_refused_with_how_to_fix_it(adapter):
    long = [{"role": "user", "content": "word " * 700}]   # ~700 tokens: under the character budget
    with pytest.raises(ContextError, match="shorten the message") as e:
        fit_chat(adapter, long, max_tokens=16)
    assert not isinstance(e.value, InputTooLarge)
    with pytest.raises(ContextError, match="lower max tokens"):
        fit_chat(adapter, [{"role": "user", "content": "hi"}], max_tokens=600)
    with pytest.raises(ContextError, match="lower max tokens to"):
        fit_chat(adapter, [{"role": "user", "content": "word " * 150}], max_tokens=300)
    with pytest.raises(InputTooLarge, match="or lower max tokens"):
        fit_chat(adapter, [{"role": "user", "content": "word " * 300}], max_tokens=400)


def test_huge_input_is_refused_before_tokenising(adapter, monkeypatch):
    def no_tokenising(*a, **k):
        raise AssertionError("tokenised a huge message")

    monkeypatch.setattr(adapter.tokenizer, "apply_chat_template", no_tokenising)
    monkeypatch.setattr(adapter.tokenizer._tokenizer, "encode", no_tokenising)
    with pytest.raises(InputTooLarge, match="1,048,576 characters"):
        fit_chat(adapter, [{"role": "user", "content": "x" * 2**20}], max_tokens=16)
    with pytest.raises(InputTooLarge, match="system prompt"):
        fit_chat(adapter, [{"role": "system", "content": "x" * 2**20}, {"role": "user", "content": "hi"}], max_tokens=16)


def test_a_ten_thousand_turn_history_is_trimmed_quickly(adapter, monkeypatch):
    """Quickly, counted in renderings: the characters drop most turns without tokenising, then a
    binary search over the rest renders the prompt a logarithmic number of times."""
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": "hi"} for i in range(10_001)]
    calls = []
    real = adapter.tokenizer.apply_chat_template

    def counted(*a, **k):
        calls.append(len(a[0]))
        return real(*a, **k)

    monkeypatch.setattr(adapter.tokenizer, "apply_chat_template", counted)
    fitted = fit_chat(adapter, msgs, max_tokens=16)
    assert len(fitted.prompt.ids) + 16 <= 512 and fitted.dropped > 9_000
    assert len(calls) <= 2 * 16, calls   # log2(10,001) < 14 prompts, each rendered twice (its marks)
