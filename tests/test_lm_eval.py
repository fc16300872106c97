"""lm-eval (EleutherAI's harness) runs a local log-likelihood task (a JSONL multiple-choice task
made here) against /v1/completions (echo + logprobs, token-id prompts) of the demo model; every
score equals the one computed directly from the model's logits, and so does the accuracy."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests._webapp_helpers import make_host, served

lm_eval = pytest.importorskip("lm_eval")

DEMO = Path(__file__).resolve().parent.parent / "models" / "demo"
DOCS = [
    {"question": "The harbor was quiet in the early", "choices": [" morning", " banana", " seven"], "answer": 0},
    {"question": "Boats rocked at their", "choices": [" moorings", " keyboards", " the"], "answer": 0},
    {"question": "The capital of France is", "choices": [" Paris", " Berlin", " blue"], "answer": 0},
    {"question": "Two plus two equals", "choices": [" four", " green", " seventeen"], "answer": 0},
    {"question": "A noun is a word that names a", "choices": [" person, place or thing", " colour", " verb"],
     "answer": 0},
    {"question": "Water freezes at zero degrees", "choices": [" Celsius", " Kelvin", " sideways"], "answer": 0},
]
TASK = """task: mtp_local_ll
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
"""


def direct_loglikelihood(adapter, context_ids, continuation_ids) -> float:
    import mlx.core as mx

    ids = list(context_ids) + list(continuation_ids)
    logits, _, _ = adapter.forward(mx.array([ids]), adapter.make_cache(), all_logits=True, fast=False)
    x = logits[0].astype(mx.float32)
    lp = x - mx.logsumexp(x, axis=-1, keepdims=True)
    return sum(lp[len(context_ids) - 1 + i, t].item() for i, t in enumerate(continuation_ids))


def test_lm_eval_log_likelihood_scores_equal_the_models_own(tmp_path, monkeypatch):
    from lm_eval import simple_evaluate
    from lm_eval.api.registry import get_model
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    (tmp_path / "mtp_local_ll.yaml").write_text(TASK.format(data=data))
    host = make_host(DEMO)
    with served(host) as (url, _):
        lm = get_model("local-completions")(base_url=url + "/v1/completions", model="demo",
                                            tokenizer_backend="huggingface", tokenizer=str(DEMO),
                                            num_concurrent=1, max_retries=1, tokenized_requests=True)
        # only this task: indexing lm-eval's thousands of built-in task files costs ~20 CPU-seconds
        tasks = TaskManager(include_path=str(tmp_path), include_defaults=False)
        out = simple_evaluate(model=lm, tasks=["mtp_local_ll"], task_manager=tasks,
                              log_samples=True, random_seed=0, numpy_random_seed=0, torch_random_seed=0)
    samples = out["samples"]["mtp_local_ll"]
    assert len(samples) == len(DOCS)
    correct = 0
    for s in samples:
        direct = []
        for (context, continuation), ((ll, _greedy),) in zip(s["arguments"], s["resps"]):
            ctx_ids, cont_ids = lm._encode_pair(context, continuation)
            direct.append(direct_loglikelihood(host.adapter, ctx_ids, cont_ids))
            assert abs(ll - direct[-1]) < 1e-3, (context, continuation, ll, direct[-1])
        correct += max(range(len(direct)), key=direct.__getitem__) == s["target"]
    assert out["results"]["mtp_local_ll"]["acc,none"] == pytest.approx(correct / len(DOCS))
