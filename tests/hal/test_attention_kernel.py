"""Paged attention kernel at decode shapes: long rows across many shuffled blocks (the 4-key
steps, padded tails and prefetches past the last key), compared with a float64 oracle, and
each row's bits unchanged by batch size, batch order, other rows' lengths and thread count
(units are handed out longest-first from a shared counter, so which thread runs a row varies)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agentkv.hal.kernels import load

K = load()
if K is None:
    pytest.skip(
        "agentkv CPU kernels unavailable here (see the logged reason: no compiler or no AVX2/FMA)",
        allow_module_level=True,
    )

# |out - ref| <= 1e-5 * max|V|, as in test_kernels.py: f32 scores carry ~hd * 2^-24 relative
# error, exp ~1 ulp, so the convex combination of V rows is off by ~1e-6 of max|V| at these
# lengths (the per-key error does not grow with the number of keys: weights are normalised).
ATTN_TOL = 1e-5


def paged_cache(seq_lens, kvh, hd, block_size, seed):
    """K, V [num_blocks, block_size, kvh, hd] and block tables over shuffled blocks."""
    g = torch.Generator().manual_seed(seed)
    per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(per_seq) + 2
    k = torch.randn(num_blocks, block_size, kvh, hd, generator=g)
    v = torch.randn(num_blocks, block_size, kvh, hd, generator=g)
    ids = torch.randperm(num_blocks, generator=g).to(torch.int32)
    tables = torch.full((len(seq_lens), max(per_seq)), -1, dtype=torch.int32)
    at = 0
    for s, nb in enumerate(per_seq):
        tables[s, :nb] = ids[at : at + nb]
        at += nb
    return k, v, tables


def run(q, k, v, tables, rows, scale, window=0, softcap=0.0):
    seq = torch.tensor([s for s, _ in rows], dtype=torch.int32)
    pos = torch.tensor([p for _, p in rows], dtype=torch.int32)
    return K.paged_attention(q, k, v, tables, seq, pos, scale, window, softcap)


def reference(q, k, v, tables, rows, scale, window=0, softcap=0.0):
    """float64 oracle, written from the spec."""
    kc, vc, tab, qn = k.double().numpy(), v.double().numpy(), tables.numpy(), q.double().numpy()
    bs, group = kc.shape[1], qn.shape[1] // kc.shape[2]
    out = np.zeros_like(qn)
    for i, (s, pos) in enumerate(rows):
        ps = np.arange(max(0, pos - window + 1) if window else 0, pos + 1)
        blocks, offs = tab[s][ps // bs], ps % bs
        for head in range(qn.shape[1]):
            sc = kc[blocks, offs, head // group] @ qn[i, head] * scale
            if softcap:
                sc = softcap * np.tanh(sc / softcap)
            e = np.exp(sc - sc.max())
            out[i, head] = e @ vc[blocks, offs, head // group] / e.sum()
    return out


@pytest.mark.parametrize(
    "h,kvh,hd,bs,window,softcap",
    [
        (9, 3, 64, 16, 0, 0.0),  # SmolLM2's decode shape: the hd = 64 unrolled path
        (9, 3, 64, 16, 100, 0.0),
        (6, 2, 64, 16, 0, 30.0),
        (8, 1, 20, 7, 0, 0.0),  # runs of 3 + 3 + 2 heads, masked head_dim tail
        (4, 4, 40, 16, 0, 0.0),  # one head per kv head
    ],
)
def test_long_rows_match_float64_oracle(h, kvh, hd, bs, window, softcap):
    lens = [613, 300, 1]
    k, v, tables = paged_cache(lens, kvh, hd, bs, seed=hd + h)
    rows = [(0, 612), (0, 401), (1, 299), (1, 3), (2, 0)]
    q = torch.randn(len(rows), h, hd, generator=torch.Generator().manual_seed(3))
    ours = run(q, k, v, tables, rows, hd**-0.5, window, softcap).double().numpy()
    ref = reference(q, k, v, tables, rows, hd**-0.5, window, softcap)
    assert np.abs(ours - ref).max() <= ATTN_TOL * v.abs().max().item()


@pytest.mark.parametrize("threads", [1, 2])
def test_row_bits_do_not_depend_on_batch_or_threads(threads):
    """Each row alone (n = 1) gives the same bits as inside shuffled batches of 1..8 rows of
    very different lengths, whatever the thread count."""
    lens = [700, 257, 64, 9]
    k, v, tables = paged_cache(lens, 3, 64, 16, seed=5)
    rows = [(0, 699), (0, 698), (1, 256), (1, 130), (2, 63), (3, 8), (3, 0), (0, 17)]
    q = torch.randn(len(rows), 9, 64, generator=torch.Generator().manual_seed(6))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        alone = torch.cat(
            [run(q[i : i + 1].contiguous(), k, v, tables, rows[i : i + 1], 0.125) for i in range(len(rows))]
        )
        rng = np.random.default_rng(threads)
        for n in (2, 5, 8):
            pick = rng.permutation(len(rows))[:n]
            batch = run(q[torch.from_numpy(pick)].contiguous(), k, v, tables, [rows[i] for i in pick], 0.125)
            assert torch.equal(batch, alone[torch.from_numpy(pick)]), pick
    finally:
        torch.set_num_threads(before)


def _at_threads(threads, fn, *args):
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        return fn(*args)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("h,kvh,hd,window", [(9, 3, 64, 0), (4, 1, 256, 0), (9, 3, 64, 700)])
def test_long_row_bits_equal_across_threads_batches_and_chunks(h, kvh, hd, window):
    """Rows over several key ranges (the kernel cuts keys every 256 positions): each row
    decoded alone, where two threads split its ranges between them and merge after, gives
    the bits of the same row inside a prefill chunk (tiles of rows walking the ranges
    together) and inside a batch mixed with another sequence, on 1 and 2 threads.
    Control: one ulp more in one query element changes that row's bits and no other's, so
    the equality is not vacuous at these lengths."""
    lens = [1100, 600]
    k, v, tables = paged_cache(lens, kvh, hd, 16, seed=hd + h + window)
    chunk = [(0, p) for p in range(1060, 1100)]  # the last 40 rows of a prefill
    other = [(1, 599), (1, 300), (1, 40)]
    rows = chunk + other
    q = torch.randn(len(rows), h, hd, generator=torch.Generator().manual_seed(7))

    def alone():
        return torch.cat(
            [run(q[i : i + 1].contiguous(), k, v, tables, rows[i : i + 1], 0.125, window) for i in range(len(rows))]
        )

    ref = _at_threads(1, alone)
    assert torch.equal(_at_threads(2, alone), ref)
    for threads in (1, 2):
        prefill = _at_threads(threads, run, q[: len(chunk)].contiguous(), k, v, tables, chunk, 0.125, window)
        assert torch.equal(prefill, ref[: len(chunk)]), threads
        pick = np.random.default_rng(threads).permutation(len(rows))
        shuffled = q[torch.from_numpy(pick)].contiguous()
        mixed = _at_threads(threads, run, shuffled, k, v, tables, [rows[i] for i in pick], 0.125, window)
        assert torch.equal(mixed, ref[torch.from_numpy(pick)]), threads
    nudged = q.clone()
    nudged[0, 0, 0] = float(np.nextafter(np.float32(q[0, 0, 0]), np.float32(np.inf)))
    out = _at_threads(2, run, nudged[:1].contiguous(), k, v, tables, rows[:1], 0.125, window)
    assert not torch.equal(out[0, 0], ref[0, 0])
    assert torch.equal(out[0, 1:], ref[0, 1:])


@pytest.mark.parametrize("window", [0, 300])
def test_rows_over_many_ranges_match_float64_oracle(window):
    """Rows of 2,000 keys (eight ranges, a partial last one; with a window, ranges cut at
    absolute positions that do not start at the row's first key) against the oracle, alone
    (split over threads) and as a prefill chunk (tiles)."""
    k, v, tables = paged_cache([2000], 3, 64, 16, seed=21)
    rows = [(0, 1999), (0, 1500), (0, 257), (0, 255), (0, 256)]
    q = torch.randn(len(rows), 9, 64, generator=torch.Generator().manual_seed(8))
    ref = reference(q, k, v, tables, rows, 0.125, window)
    batch = run(q, k, v, tables, rows, 0.125, window).double().numpy()
    assert np.abs(batch - ref).max() <= ATTN_TOL * v.abs().max().item()
    single = _at_threads(2, run, q[:1].contiguous(), k, v, tables, rows[:1], 0.125, window)
    assert np.abs(single.double().numpy() - ref[:1]).max() <= ATTN_TOL * v.abs().max().item()
