"""The KV block hooks of the disk tier: `read_block` returns one block's K and V across every
layer in the documented byte layout, and `write_block` of those bytes restores every bit."""

from __future__ import annotations

import numpy as np
import pytest

from agentkv.hal.base import KVSpec
from agentkv.hal.registry import lookup

SPEC = KVSpec(num_layers=2, num_blocks=4, block_size=3, num_kv_heads=2, head_dim=5)


@pytest.mark.parametrize("name", ["reference", "torch", "cpu"])
def test_read_block_layout_and_write_block_round_trip(name):
    backend = lookup(name)
    kv = backend.allocate_kv(SPEC)
    rng = np.random.default_rng(0)
    n = SPEC.num_blocks * SPEC.block_size
    rows = {}
    for layer in range(SPEC.num_layers):
        k, v = (rng.standard_normal((n, 2, 5)).astype(np.float32) for _ in range(2))
        backend.kv_store(kv, layer, backend.upload(k), backend.upload(v), np.arange(n))
        rows[layer] = (k, v)
    data = backend.read_block(kv, 2)
    got = np.frombuffer(data, "<f4").reshape(2, 2, 3, 2, 5)
    for layer, (k, v) in rows.items():
        assert np.array_equal(got[layer, 0], k[6:9]) and np.array_equal(got[layer, 1], v[6:9])
    backend.write_block(kv, 0, data)  # block 0 now holds block 2's bits
    assert backend.read_block(kv, 0) == data
    assert backend.read_block(kv, 1) != data  # a control: other blocks are untouched
    assert (
        np.frombuffer(backend.read_block(kv, 1), "<f4").reshape(2, 2, 3, 2, 5)[0, 0].tobytes()
        == rows[0][0][3:6].tobytes()
    )
