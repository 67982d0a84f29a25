"""Many prefill rows of one sequence in one paged-attention call (tiles whose rows share a key
range run through one many-query unit on AVX-512) give each row the bits it gets alone, one
row per call, across key ranges, windows, softcap, GQA ratios and f16 / f32 K/V, on both ISA
builds and 1 or 2 threads."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.hal.conftest import K
from tests.hal.test_attention_kernel import paged_cache

if K is None:
    pytest.skip("agentkv CPU kernels unavailable here (see the logged reason)", allow_module_level=True)

SEQ_LEN = 1300  # six key ranges of 256, the last partial
CHUNK = range(1003, 1300)  # a chunk that starts off the 16-row tile grid: partial edge tiles
SHAPES = [  # (h, kvh, hd): the GQA group and head size decide how many queries share a call
    (9, 3, 64),  # SmolLM2: 3 heads a kv head, 16 rows = 48 queries a call
    (8, 2, 64),  # 4 heads a kv head at 64 wide: passes of 6 queries over V leave 4, 2 or 0
    (4, 1, 256),  # Gemma-3: one kv head, 4 heads
    (12, 2, 48),  # a group of 6 in runs of 3 + 3, an odd chunk count (3 of 16 lanes)
    (6, 6, 20),  # one head a kv head, a masked head_dim tail
    (16, 2, 128),
    (2, 1, 272),  # past the widest head whose f16 K rows AVX-512 widens once per 4-key step
]
VARIANTS = [(0, 0.0), (300, 0.0), (0, 30.0), (700, 50.0)]  # (window, softcap)


def cache(kvh, hd, dtype, seed):
    k, v, tables = paged_cache([SEQ_LEN, 600], kvh, hd, 16, seed)
    if dtype == "f16":
        k, v = k.half(), v.half()
    return k, v, tables


def attend(q, k, v, tables, rows, window, softcap):
    seq = torch.tensor([s for s, _ in rows], dtype=torch.int32)
    pos = torch.tensor([p for _, p in rows], dtype=torch.int32)
    return K.paged_attention(q, k, v, tables, seq, pos, 0.125, window, softcap)


def one_row_per_call(q, k, v, tables, rows, window, softcap):
    return torch.cat(
        [attend(q[i : i + 1].contiguous(), k, v, tables, rows[i : i + 1], window, softcap) for i in range(len(rows))]
    )


@pytest.mark.parametrize("dtype", ["f32", "f16"])
@pytest.mark.parametrize("window,softcap", VARIANTS)
@pytest.mark.parametrize("h,kvh,hd", SHAPES)
def test_a_chunk_in_one_call_gives_each_rows_own_bits(isa, threads, h, kvh, hd, window, softcap, dtype):
    """A 297-row chunk of one sequence, then the same chunk followed by rows of a second
    sequence, in one call each: every row equals that row computed alone."""
    k, v, tables = cache(kvh, hd, dtype, seed=h + hd + window)
    chunk = [(0, p) for p in CHUNK]
    rows = chunk + [(1, p) for p in range(560, 600)]
    q = torch.randn(len(rows), h, hd, generator=torch.Generator().manual_seed(hd))
    alone = one_row_per_call(q, k, v, tables, rows, window, softcap)
    assert torch.equal(attend(q[: len(chunk)].contiguous(), k, v, tables, chunk, window, softcap), alone[: len(chunk)])
    assert torch.equal(attend(q, k, v, tables, rows, window, softcap), alone)


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_control_one_ulp_in_one_query_changes_only_that_head(isa, threads, dtype):
    """The equality above is not vacuous: one ulp more in one query element of a row in the
    middle of the chunk (a row that shares its ranges with its neighbours) changes that row's
    head and nothing else, in the one-call run as well as alone."""
    h, kvh, hd = 9, 3, 64
    k, v, tables = cache(kvh, hd, dtype, seed=1)
    rows = [(0, p) for p in CHUNK]
    q = torch.randn(len(rows), h, hd, generator=torch.Generator().manual_seed(2))
    base = attend(q, k, v, tables, rows, 0, 0.0)
    nudged = q.clone()
    i = 100
    nudged[i, 4, 0] = float(np.nextafter(np.float32(q[i, 4, 0]), np.float32(np.inf)))
    together = attend(nudged, k, v, tables, rows, 0, 0.0)
    alone = attend(nudged[i : i + 1].contiguous(), k, v, tables, rows[i : i + 1], 0, 0.0)
    changed = (together != base).any(dim=2)
    assert changed[i, 4].item() and changed.sum().item() == 1
    assert torch.equal(together[i], alone[0])
