"""Attention sinks in the compiled kernel (attention_ranges.cpp: a head's sink joins the merged
ranges as one last term): a chunk of rows in one call, in tile and split mode, gives each row
the bits it gets alone, across several 256-key ranges and gpt-oss's 128-token window, on both
ISA builds and 1 or 2 threads; the values follow the definition (a float64 oracle written from
transformers' eager attention: the sink concatenated to the scores, softmaxed, dropped)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.hal.conftest import K
from tests.hal.test_attention_kernel import paged_cache

if K is None:
    pytest.skip("agentkv CPU kernels unavailable here (see the logged reason)", allow_module_level=True)

H, KVH, HD = 8, 2, 64
SEQ_LEN = 700  # three key ranges, the last partial
CHUNK = range(500, 700)


def attend(q, k, v, tables, positions, window, sinks):
    seq = torch.zeros(len(positions), dtype=torch.int32)
    pos = torch.tensor(list(positions), dtype=torch.int32)
    return K.paged_attention(q, k, v, tables, seq, pos, 0.125, window, 0.0, sinks)


def oracle(q, k, v, tables, positions, window, sinks) -> np.ndarray:
    """float64, from the definition: softmax over [scores, sink], the sink's column dropped."""
    table = tables[0].numpy()
    keys = k.double().numpy()[table].reshape(-1, KVH, HD)
    vals = v.double().numpy()[table].reshape(-1, KVH, HD)
    out = np.empty((len(positions), H, HD))
    for i, p in enumerate(positions):
        lo = max(0, p + 1 - window) if window else 0
        for h in range(H):
            kv = h // (H // KVH)
            s = keys[lo : p + 1, kv] @ q[i, h].double().numpy() * 0.125
            logits = np.append(s, float(sinks[h]))
            w = np.exp(logits - logits.max())
            out[i, h] = (w[:-1] / w.sum()) @ vals[lo : p + 1, kv]
    return out


@pytest.mark.parametrize("window", [0, 128])
def test_sink_rows_in_one_call_equal_rows_alone(isa, threads, window):
    k, v, tables = paged_cache([SEQ_LEN], KVH, HD, 16, seed=window + 1)
    g = torch.Generator().manual_seed(3)
    q = torch.randn(len(CHUNK), H, HD, generator=g)
    sinks = torch.randn(H, generator=g) * 2
    together = attend(q, k, v, tables, CHUNK, window, sinks)
    alone = torch.cat(
        [attend(q[i : i + 1].contiguous(), k, v, tables, [p], window, sinks) for i, p in enumerate(CHUNK)]
    )
    assert torch.equal(together, alone)
    rows = [0, 100, 199]  # the oracle on a few rows: values, not only invariance
    want = oracle(q[rows], k, v, tables, [CHUNK[r] for r in rows], window, sinks.numpy())
    assert np.abs(together[rows].double().numpy() - want).max() < 1e-5


def test_control_the_sink_moves_only_the_denominator(isa):
    """A sink far below every score leaves plain attention's bits; a large one on one head
    scales that head's output down by one factor per row, L / (L + e^(sink - M)), and changes
    no other head."""
    k, v, tables = paged_cache([SEQ_LEN], KVH, HD, 16, seed=9)
    q = torch.randn(4, H, HD, generator=torch.Generator().manual_seed(4))
    plain = attend(q, k, v, tables, [20, 300, 511, 699], 0, None)
    assert torch.equal(attend(q, k, v, tables, [20, 300, 511, 699], 0, torch.full((H,), -1e30)), plain)
    sinks = torch.full((H,), -1e30)
    sinks[5] = 30.0
    sunk = attend(q, k, v, tables, [20, 300, 511, 699], 0, sinks)
    changed = (sunk != plain).any(dim=2)
    assert changed[:, 5].all() and changed.sum() == 4  # head 5 of each row, nothing else
    ratio = (sunk[:, 5] / plain[:, 5]).numpy()
    assert np.all(ratio < 1e-3) and np.allclose(ratio, ratio[:, :1], rtol=1e-3)
