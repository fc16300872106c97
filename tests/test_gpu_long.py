"""scripts/gpu/gpu_long.py's parts on a tiny checkpoint (the H200 runs them at the 9B shape): a
greedy cycle is the lane's (its verify's logits are those of a forward of [t, the greedy drafts]),
and a context's row holds what the cost model and the write-up read."""
from __future__ import annotations

import mlx.core as mx
import numpy as np

from adapters import load_adapter
from scripts.gpu import gpu_long
from scripts.gpu.gpu_long import prefilled


def test_a_greedy_cycle_verifies_the_heads_own_greedy_drafts(tiny_model_dir):
    ad = load_adapter(tiny_model_dir)
    ids, (cache, draft, hidden) = prefilled(ad, 32)
    t = mx.array([ids[-1:]], dtype=mx.int32)
    kv = [c for c in cache if hasattr(c, "offset")]
    assert kv, "the tiny checkpoint has attention layers"
    before = kv[0].offset
    # The same drafts by hand, on copies of the state: the head's argmax, fed back.
    _, (c2, d2, h2) = prefilled(ad, 32)
    toks, h, x = [], h2, t
    for _ in range(3):
        h, logits = ad.draft_step(d2, c2, h, x)
        x = mx.argmax(logits, axis=-1)[None]
        toks.append(x)
    want, _, _ = ad.forward(mx.concatenate([t] + toks, axis=1), c2)
    logits, _ = gpu_long.greedy_cycle(ad, draft, cache, hidden, t, 3)
    np.testing.assert_array_equal(np.array(logits.astype(mx.float32)), np.array(want.astype(mx.float32)))
    assert kv[0].offset == before + 1   # the commit of one position, as the verifies here


def test_a_contexts_row_has_the_cycles_costs(tiny_model_dir):
    ad = load_adapter(tiny_model_dir)
    row = gpu_long.one_context(ad, 48, tokens=8)
    assert set(row["cycle_in_ar_steps"]) == set(row["mtp_step_in_cycle_in_ar_steps"]) == {"1", "2", "3"}
    assert all(c > 0 for c in row["cycle_in_ar_steps"].values())
    assert set(row["projected_from_cycles"]) == {"1", "2", "3"}
    assert row["greedy_mtp_equals_ar"]
