"""DeepSeek sparse attention's compiled kernel (kernels/sparse_mla.cpp) against the numpy rule
(hal/mla_sparse.py `attend_sparse`, itself matched to transformers in test_mla_families):
the same chosen keys (top-k by falling index score, the lower position first on a tie, every
key while the context is at most top_k) and the same outputs within f32 rounding, over f32 and
f16 stores; a row's bits alone, in a batch, on one thread or two and on either ISA build are
equal. Controls: a changed chosen key moves the row and a changed unchosen one does not."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agentkv.hal.base import BackendUnavailable
from agentkv.hal.kernels import load
from agentkv.hal.mla import MLASpec
from agentkv.hal.mla_sparse import IndexerSpec, attend_sparse
from agentkv.hal.specs import AttnMeta, RopeSpec

try:
    K = load()
except BackendUnavailable as e:
    pytest.skip(f"agentkv CPU kernels unavailable here: {e}", allow_module_level=True)

H_Q, KV_RANK, ROPE, H_INDEX, D_INDEX, TOP_K, BS = 4, 64, 16, 2, 32, 8, 4
SPEC = MLASpec(num_heads=H_Q, nope_dim=16, rope_dim=ROPE, v_dim=16, kv_rank=KV_RANK, rope=RopeSpec(ROPE), scale=0.11)
ISPEC = IndexerSpec(num_heads=H_INDEX, head_dim=D_INDEX, top_k=TOP_K, rope=RopeSpec(8))
L = KV_RANK + ROPE


def problem(lens: tuple[int, ...], seed: int = 0, dtype=torch.float32):
    """Sequences with contexts `lens`, their last rows querying (a prefill-like span of 3 rows
    for the first): (q_abs, q_index, head_w, store, meta)."""
    rng = np.random.default_rng(seed)
    tables, blocks = [], 0
    for n in lens:
        used = (n + BS - 1) // BS
        tables.append(tuple(int(b) for b in rng.permutation(np.arange(blocks, blocks + used))))
        blocks += used
    store = torch.from_numpy(rng.standard_normal((blocks + 1, BS, 1, L + D_INDEX)).astype(np.float32)).to(dtype)
    qlens = tuple(min(3, n) if i == 0 else 1 for i, n in enumerate(lens))
    positions = np.concatenate([np.arange(n - q, n) for n, q in zip(lens, qlens)]).astype(np.int64)
    rows = len(positions)
    meta = AttnMeta(qlens, tuple(lens), tuple(tables), positions, np.zeros(rows, np.int64))
    q_abs = rng.standard_normal((rows, H_Q, L)).astype(np.float32)
    q_index = rng.standard_normal((rows, H_INDEX, D_INDEX)).astype(np.float32)
    head_w = rng.standard_normal((rows, H_INDEX)).astype(np.float32)
    return q_abs, q_index, head_w, store, meta


def kernel(q_abs, q_index, head_w, store, meta) -> np.ndarray:
    from agentkv.hal.portable.steps import kernel_meta

    tables, row_seq, row_pos = kernel_meta(meta)
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
    return K.sparse_latent_attention(
        t(q_abs), t(q_index), t(head_w), store, tables, row_seq, row_pos,
        KV_RANK, TOP_K, SPEC.scale, D_INDEX**-0.5,
    ).numpy()  # fmt: skip


def reference(q_abs, q_index, head_w, store, meta) -> np.ndarray:
    return attend_sparse(q_abs, q_index, head_w, store.numpy(), meta, SPEC, ISPEC)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["f32", "f16"])
def test_kernel_matches_the_numpy_rule(dtype, isa, threads):
    args = problem((3, 7, 8, 9, 30, 61), seed=1, dtype=dtype)  # contexts below, at and past top_k
    got, want = kernel(*args), reference(*args)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def test_a_row_alone_in_a_batch_and_on_either_isa_has_the_same_bits(threads):
    q_abs, q_index, head_w, store, meta = problem((30, 61, 9), seed=2)
    batch = kernel(q_abs, q_index, head_w, store, meta)
    last = len(meta.positions) - 2  # the 61-key sequence's row, alone
    alone = AttnMeta((1,), (61,), (meta.block_tables[1],), meta.positions[last : last + 1], np.zeros(1, np.int64))
    one = kernel(q_abs[last : last + 1], q_index[last : last + 1], head_w[last : last + 1], store, alone)
    assert np.array_equal(one[0], batch[last])
    before = K.isa()
    try:
        bits = []
        for name in [i for i in ("avx2", "avx512") if K.isa_supported(i)]:
            K.override_isa_unchecked(name)
            bits.append(kernel(q_abs, q_index, head_w, store, meta))
    finally:
        K.override_isa_unchecked(before)
    assert all(np.array_equal(b, bits[0]) for b in bits)


def chosen_keys(q_index, head_w, store, table, pos) -> list[int]:
    """The rule's chosen positions for one row (numpy, in float64: the scores have margins)."""
    rows = store.numpy()[np.asarray(table)].reshape(-1, L + D_INDEX)[: pos + 1, L:].astype(np.float64)
    scores = np.maximum(q_index.astype(np.float64) @ rows.T * D_INDEX**-0.5, 0.0)
    index = head_w.astype(np.float64) @ scores
    return sorted(np.argsort(-index, kind="stable")[:TOP_K].tolist())


def test_control_only_the_chosen_keys_move_a_row():
    q_abs, q_index, head_w, store, meta = problem((40,), seed=3)
    r, pos, table = len(meta.positions) - 1, 39, meta.block_tables[0]
    chosen = chosen_keys(q_index[r], head_w[r], store, table, pos)
    base = kernel(q_abs, q_index, head_w, store, meta)[r]
    unchosen = next(t for t in range(pos + 1) if t not in chosen)
    for t, moves in ((chosen[3], True), (unchosen, False)):
        changed = store.clone()
        changed[table[t // BS], t % BS, 0, :KV_RANK] += 1.0  # its latent only: the index score stays
        got = kernel(q_abs, q_index, head_w, changed, meta)[r]
        assert (not np.array_equal(got, base)) == moves, (t, chosen)


def test_equal_index_scores_choose_the_lower_position():
    q_abs, q_index, head_w, store, meta = problem((20,), seed=4)
    r, table = len(meta.positions) - 1, meta.block_tables[0]
    store[:, :, 0, L:] = 0.0  # every index score 0: a tie across all 20 keys
    head_w[r] = (1.0, 0.0)
    hot = 17  # the one key that scores above 0: |q_index[r, 0]|^2 / sqrt(D)
    store[table[hot // BS], hot % BS, 0, L:] = torch.from_numpy(q_index[r, 0])
    base = kernel(q_abs, q_index, head_w, store, meta)[r]
    want = sorted({hot, *range(TOP_K - 1)})  # the one key that scores, then the lowest positions
    np.testing.assert_allclose(base, reference(q_abs, q_index, head_w, store, meta)[r], rtol=2e-5, atol=2e-6)
    for t in range(20):  # a key outside the expected set does not reach the row
        changed = store.clone()
        changed[table[t // BS], t % BS, 0, :KV_RANK] += 1.0
        moved = not np.array_equal(kernel(q_abs, q_index, head_w, changed, meta)[r], base)
        assert moved == (t in want), (t, want)


def test_bad_shapes_are_refused_by_name():
    q_abs, q_index, head_w, store, meta = problem((9,), seed=5)
    with pytest.raises(RuntimeError, match="store row has"):
        kernel(q_abs, q_index, head_w, store[..., :-1].contiguous(), meta)
    with pytest.raises(RuntimeError, match="head_w"):
        kernel(q_abs, q_index, head_w[:, :1].copy(), store, meta)
