"""scripts/demo_model/loops.py, the demo evaluation's repetition measure, on the replies that
taught it: a made-up name run on ("Paolo Maolo Maolo ...") loops; a reply that names its long
subject in four sentences (" Leonardo da Vinci", 8 tokens in the demo's vocabulary) does not once
the prompt's words count as one token; a reply that repeats the prompt over and over still loops.
The demo's own tokenizer (models/demo), no model run."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts" / "demo_model"))
from loops import collapse_echoes, is_loop, loop_rate  # noqa: E402


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(REPO / "models" / "demo"))


def _case(tok, prompt, reply):
    return tok.encode(prompt), tok.encode(reply)


def test_a_long_subject_named_four_times_is_not_a_loop_and_a_run_on_is(tok):
    prompt, named = _case(tok, "Who was Leonardo da Vinci?",
                          "Leonardo da Vinci was an Italian painter. Leonardo da Vinci lived from 1452 to 1519. "
                          "Leonardo da Vinci is known as a painter. Leonardo da Vinci is also called da Vinci.")
    assert is_loop(named, False), "without the prompt, the name's 8 tokens count as a repeated span"
    assert not is_loop(collapse_echoes(named, prompt), False)
    _, run_on = _case(tok, "Who was Isaac Newton?", "Isaac Newton is also called Paolo" + " Maolo" * 30)
    echo = tok.encode(" ".join(["Who was Leonardo da Vinci?"] * 6))
    rate = loop_rate([(named, False), (run_on, True), (echo, False)],
                     [prompt, tok.encode("Who was Isaac Newton?"), prompt])
    assert rate["looping"] == [1, 2] and rate["loops"] == 2 and rate["replies"] == 3
    assert loop_rate([(named, False)])["loops"] == 1            # no prompts: the old measure


def test_runs_are_replaced_longest_first_and_short_ones_are_kept():
    prompt = [1, 2, 3, 4, 5]
    assert collapse_echoes([9, 1, 2, 3, 4, 5, 9, 2, 3, 4, 8, 1, 2, 7], prompt) == [9, -1, 9, -1, 8, 1, 2, 7]
    assert collapse_echoes([1, 2, 3], []) == [1, 2, 3]
