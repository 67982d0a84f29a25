"""A decode step of sequences that share cached prefix blocks (agents on one system prompt):
the rows whose key range lies in the same blocks run through one many-query call, and every
row still gets the bits it gets alone, one row per call, and the bits it gets when its prefix
is a copy in blocks of its own (no sharing), on both ISA builds and 1 or 2 threads."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.hal.conftest import K

if K is None:
    pytest.skip("agentkv CPU kernels unavailable here (see the logged reason)", allow_module_level=True)

BS = 16
SHAPES = [(9, 3, 64), (4, 1, 256), (12, 2, 48), (6, 6, 20), (2, 1, 272)]


def fleet(kvh, hd, dtype, seed, groups):
    """K, V and block tables for sequences given as (prefix group, prefix keys, own keys): the
    sequences of one group read the same prefix blocks (as many as their prefix covers)."""
    g = torch.Generator().manual_seed(seed)
    prefix_blocks = {}
    for grp, prefix, _ in groups:
        prefix_blocks[grp] = max(prefix_blocks.get(grp, 0), prefix // BS)
    num_blocks = sum(prefix_blocks.values()) + sum(-(-own // BS) for _, _, own in groups) + 1
    order = torch.randperm(num_blocks, generator=g).to(torch.int32)
    k = torch.randn(num_blocks, BS, kvh, hd, generator=g)
    v = torch.randn(num_blocks, BS, kvh, hd, generator=g)
    width = max(prefix_blocks[grp] + -(-own // BS) for grp, _, own in groups)
    tables = torch.full((len(groups), width), -1, dtype=torch.int32)
    free, first = 0, {}
    for s, (grp, prefix, own) in enumerate(groups):
        if grp not in first:
            first[grp] = order[free : free + prefix_blocks[grp]]
            free += prefix_blocks[grp]
        n, m = prefix // BS, -(-own // BS)
        tables[s, :n] = first[grp][:n]
        tables[s, n : n + m] = order[free : free + m]
        free += m
    if dtype == "f16":
        k, v = k.half(), v.half()
    rows = [(s, prefix + own - 1) for s, (_, prefix, own) in enumerate(groups)]
    return k, v, tables, rows


def copied(k, v, tables, groups):
    """The same fleet with every sequence's prefix a copy in blocks of its own: the same keys
    and values at every position, no block shared."""
    tables = tables.clone()
    extra = []
    for s, (_, prefix, _) in enumerate(groups):
        n = prefix // BS
        ids = tables[s, :n].long()
        tables[s, :n] = torch.arange(n, dtype=torch.int32) + k.shape[0] + sum(len(e) for e in extra)
        extra.append(ids)
    ids = torch.cat(extra)
    return torch.cat([k, k[ids]]), torch.cat([v, v[ids]]), tables


def attend(q, k, v, tables, rows, window=0, softcap=0.0):
    seq = torch.tensor([s for s, _ in rows], dtype=torch.int32)
    pos = torch.tensor([p for _, p in rows], dtype=torch.int32)
    return K.paged_attention(q, k, v, tables, seq, pos, 0.125, window, softcap)


def alone(q, k, v, tables, rows, softcap=0.0):
    return torch.cat(
        [attend(q[i : i + 1].contiguous(), k, v, tables, rows[i : i + 1], 0, softcap) for i in range(len(rows))]
    )


# (prefix group, prefix keys, own keys) per sequence: five agents on a 1,024-key prompt with
# tails of different lengths (one ends inside a range, one on a range edge, one is a single
# key), two on another prompt, one on its own, and one whose shared keys end mid-range
FLEET = [(0, 1024, 300), (0, 1024, 77), (0, 1024, 256), (0, 1024, 1), (0, 1024, 520), (1, 640, 90), (1, 640, 400)]
FLEET += [(2, 0, 700), (0, 512 + 48, 35)]


@pytest.mark.parametrize("dtype", ["f32", "f16"])
@pytest.mark.parametrize("softcap", [0.0, 30.0])
@pytest.mark.parametrize("h,kvh,hd", SHAPES)
def test_rows_sharing_prefix_blocks_get_their_own_bits(isa, threads, h, kvh, hd, softcap, dtype):
    k, v, tables, rows = fleet(kvh, hd, dtype, seed=h + hd, groups=FLEET)
    q = torch.randn(len(rows), h, hd, generator=torch.Generator().manual_seed(hd))
    together = attend(q, k, v, tables, rows, 0, softcap)
    assert torch.equal(together, alone(q, k, v, tables, rows, softcap))
    ck, cv, ctables = copied(k, v, tables, FLEET)
    assert len(ctables[:, 0].unique()) == len(FLEET)
    assert torch.equal(attend(q, ck, cv, ctables, rows, 0, softcap), together)


def test_more_sharing_rows_than_one_call_takes(isa, threads):
    """20 agents on one prompt: more rows than one many-query call takes (16), so a range's
    rows go in two calls; each row still equals itself alone."""
    groups = [(0, 768, 40 + 13 * i) for i in range(20)]
    k, v, tables, rows = fleet(3, 64, "f16", seed=5, groups=groups)
    q = torch.randn(len(rows), 9, 64, generator=torch.Generator().manual_seed(6))
    assert torch.equal(attend(q, k, v, tables, rows), alone(q, k, v, tables, rows))


def test_a_windowed_step_is_left_to_the_row_modes(isa, threads):
    """A sliding-window layer (its start moves with each row) keeps its own modes; its rows
    equal themselves alone too."""
    k, v, tables, rows = fleet(1, 256, "f32", seed=7, groups=FLEET)
    q = torch.randn(len(rows), 4, 256, generator=torch.Generator().manual_seed(8))
    one = [attend(q[i : i + 1].contiguous(), k, v, tables, rows[i : i + 1], 300) for i in range(len(rows))]
    assert torch.equal(attend(q, k, v, tables, rows, 300), torch.cat(one))


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_control_one_ulp_in_one_agents_query_changes_only_its_head(isa, threads, dtype):
    """The equalities above are not vacuous: one ulp more in one query element of an agent
    whose prefix ranges run with four others changes that agent's head and nothing else,
    together as well as alone."""
    k, v, tables, rows = fleet(3, 64, dtype, seed=9, groups=FLEET)
    q = torch.randn(len(rows), 9, 64, generator=torch.Generator().manual_seed(10))
    base = attend(q, k, v, tables, rows)
    nudged = q.clone()
    i = 2
    nudged[i, 4, 0] = float(np.nextafter(np.float32(q[i, 4, 0]), np.float32(np.inf)))
    together = attend(nudged, k, v, tables, rows)
    changed = (together != base).any(dim=2)
    assert changed[i, 4].item() and changed.sum().item() == 1
    assert torch.equal(together[i], attend(nudged[i : i + 1].contiguous(), k, v, tables, rows[i : i + 1])[0])
