"""The `cuda` backend's Triton kernels: matmul (f32, f16/bf16 and GGUF quant weights, read
from their blocks), embedding rows, RMSNorm and paged attention.

Row invariance by construction: every program computes a fixed tile whose reduction runs in
one order (K in BK steps from 0; attention keys from the range start in BN steps), and no
tile shape or split depends on the number of rows. So a row's bits are the same alone, in a
batch or in any prefill chunk. Launch wrappers live in `ops.py`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from agentkv.hal.cuda.dequant import dequant

F32 = tl.constexpr(0)
KEY_RANGE = tl.constexpr(256)  # attention's keys are cut at absolute multiples of this, as on the CPU
NEG_BIG = tl.constexpr(-1.0e30)  # a finite -inf: exp(NEG_BIG - m) is 0 and never NaN


@triton.jit
def matmul_kernel(
    x_ptr, w_ptr, b_ptr, o_ptr, M, N, K, row_bytes,
    QTYPE: tl.constexpr, HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    """o[M, N] = x[M, K] @ w[N, K].T (+ b[N]); w f32 (QTYPE 0) or gguf rows of `row_bytes`."""
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + rk
        x = tl.load(x_ptr + rm[:, None] * K + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        wmask = (rn[:, None] < N) & (kk[None, :] < K)
        if QTYPE == F32:
            w = tl.load(w_ptr + rn[:, None] * K + kk[None, :], mask=wmask, other=0.0)
        else:
            w = dequant(w_ptr, rn[:, None], kk[None, :], row_bytes, wmask, QTYPE)
        acc += tl.dot(x, tl.trans(w), input_precision="ieee")
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=rn < N, other=0.0)[None, :]
    tl.store(o_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def embedding_kernel(ids_ptr, w_ptr, o_ptr, K, row_bytes, QTYPE: tl.constexpr, BK: tl.constexpr):
    """o[i, :] = the dequantized row ids[i] of w (gguf rows); one program per (id, BK cols)."""
    row = tl.load(ids_ptr + tl.program_id(0)).to(tl.int64)
    cols = tl.program_id(1) * BK + tl.arange(0, BK)
    mask = cols < K
    out = dequant(w_ptr, row, cols, row_bytes, mask, QTYPE)
    tl.store(o_ptr + tl.program_id(0).to(tl.int64) * K + cols, out, mask=mask)


@triton.jit
def _inv_rms(x_ptr, row, D, eps, BD: tl.constexpr):
    """1 / sqrt(mean(x^2) + eps) of one row: BD lanes over the row in BD steps, one tree."""
    lanes = tl.arange(0, BD)
    acc = tl.zeros((BD,), tl.float32)
    for d0 in range(0, D, BD):
        x = tl.load(x_ptr + row + d0 + lanes, mask=d0 + lanes < D, other=0.0)
        acc += x * x
    return 1.0 / tl.sqrt_rn(tl.sum(acc, axis=0) / D + eps)


@triton.jit
def rms_norm_kernel(x_ptr, g_ptr, o_ptr, D, eps, UNIT_OFFSET: tl.constexpr, BD: tl.constexpr):
    """One row per program: o = x / sqrt(mean(x^2) + eps) * gain."""
    row = tl.program_id(0).to(tl.int64) * D
    lanes = tl.arange(0, BD)
    inv = _inv_rms(x_ptr, row, D, eps, BD)
    for d0 in range(0, D, BD):
        mask = d0 + lanes < D
        g = tl.load(g_ptr + d0 + lanes, mask=mask, other=0.0)
        if UNIT_OFFSET:
            g = 1.0 + g
        tl.store(o_ptr + row + d0 + lanes, tl.load(x_ptr + row + d0 + lanes, mask=mask, other=0.0) * inv * g, mask=mask)


@triton.jit
def add_norm_kernel(
    h_ptr, d_ptr, g_ptr, p_ptr, hn_ptr, o_ptr, D, eps,
    POST: tl.constexpr, UNIT_OFFSET: tl.constexpr, BD: tl.constexpr,
):  # fmt: skip
    """One row per program: hn = h + (rms_norm(delta, post gain) if POST else delta), then
    o = rms_norm(hn, gain); the same arithmetic as rms_norm_kernel and an add, one launch."""
    row = tl.program_id(0).to(tl.int64) * D
    lanes = tl.arange(0, BD)
    inv_d = _inv_rms(d_ptr, row, D, eps, BD) if POST else 1.0
    for d0 in range(0, D, BD):
        mask = d0 + lanes < D
        delta = tl.load(d_ptr + row + d0 + lanes, mask=mask, other=0.0)
        if POST:
            gp = tl.load(p_ptr + d0 + lanes, mask=mask, other=0.0)
            if UNIT_OFFSET:
                gp = 1.0 + gp
            delta = delta * inv_d * gp
        hn = tl.load(h_ptr + row + d0 + lanes, mask=mask, other=0.0) + delta
        tl.store(hn_ptr + row + d0 + lanes, hn, mask=mask)
    inv = _inv_rms(hn_ptr, row, D, eps, BD)
    for d0 in range(0, D, BD):
        mask = d0 + lanes < D
        g = tl.load(g_ptr + d0 + lanes, mask=mask, other=0.0)
        if UNIT_OFFSET:
            g = 1.0 + g
        tl.store(
            o_ptr + row + d0 + lanes, tl.load(hn_ptr + row + d0 + lanes, mask=mask, other=0.0) * inv * g, mask=mask
        )


@triton.jit
def _range_partial(
    q, k_ptr, v_ptr, tables_ptr, seq, pos, lo, r0, kvh, scale, softcap, W, BS,
    KVH: tl.constexpr, HD: tl.constexpr, HDP: tl.constexpr, BN: tl.constexpr, SOFTCAP: tl.constexpr,
):  # fmt: skip
    """The softmax partial (max, sum, weighted V [HDP]) of one query over the keys of the
    range [r0, r0 + KEY_RANGE) that it attends (lo <= key <= pos), in BN-key steps."""
    dims = tl.arange(0, HDP)
    m = tl.full((), NEG_BIG, tl.float32)
    s = tl.zeros((), tl.float32)
    acc = tl.zeros((HDP,), tl.float32)
    for c0 in range(r0, tl.minimum(r0 + KEY_RANGE, pos + 1), BN):  # steps past pos would be all masked
        kpos = c0 + tl.arange(0, BN)
        valid = (kpos <= pos) & (kpos >= lo)
        block = tl.load(tables_ptr + seq * W + kpos // BS, mask=valid, other=0).to(tl.int64)
        at = ((block * BS + kpos % BS) * KVH + kvh)[:, None] * HD + dims[None, :]
        kv_mask = valid[:, None] & (dims[None, :] < HD)
        keys = tl.load(k_ptr + at, mask=kv_mask, other=0.0).to(tl.float32)
        score = tl.sum(keys * q[None, :], axis=1) * scale
        if SOFTCAP:
            score = softcap * (2.0 / (1.0 + tl.exp(-2.0 * score / softcap)) - 1.0)  # softcap * tanh(score / softcap)
        score = tl.where(valid, score, NEG_BIG)
        m_new = tl.maximum(m, tl.max(score, axis=0))
        p = tl.where(valid, tl.exp(score - m_new), 0.0)
        alpha = tl.exp(m - m_new)
        vals = tl.load(v_ptr + at, mask=kv_mask, other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * vals, axis=0)
        s = s * alpha + tl.sum(p, axis=0)
        m = m_new
    return m, s, acc


@triton.jit
def attention_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, tables_ptr, row_seq_ptr, pos_ptr, sinks_ptr, scale, window, softcap, W, BS,
    H: tl.constexpr, KVH: tl.constexpr, HD: tl.constexpr, HDP: tl.constexpr, BN: tl.constexpr,
    SOFTCAP: tl.constexpr, SINKS: tl.constexpr,
):  # fmt: skip
    """One program per (query row, head): causal attention over the row's paged keys
    [lo, pos], lo = max(pos + 1 - window, 0) (no window: a window past every position). Keys are cut at absolute
    multiples of KEY_RANGE; each range's partial softmax is merged into the running one in
    ascending order, so a query's bits never depend on the rows around it. With SINKS, the
    head's learned logit `sinks[head]` joins the denominator after the last range (gpt-oss),
    as the cpu kernel adds it."""
    r = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    kvh = head // (H // KVH)
    pos = tl.load(pos_ptr + r)
    seq = tl.load(row_seq_ptr + r).to(tl.int64)
    lo = tl.maximum(pos + 1 - window, 0)
    dims = tl.arange(0, HDP)
    q = tl.load(q_ptr + (r * H + head) * HD + dims, mask=dims < HD, other=0.0)
    m = tl.full((), NEG_BIG, tl.float32)
    s = tl.zeros((), tl.float32)
    acc = tl.zeros((HDP,), tl.float32)
    for r0 in range((lo // KEY_RANGE) * KEY_RANGE, pos + 1, KEY_RANGE):
        m_r, s_r, acc_r = _range_partial(
            q, k_ptr, v_ptr, tables_ptr, seq, pos, lo, r0, kvh, scale, softcap, W, BS, KVH, HD, HDP, BN, SOFTCAP
        )
        m_new = tl.maximum(m, m_r)
        a, b = tl.exp(m - m_new), tl.exp(m_r - m_new)
        acc = acc * a + acc_r * b
        s = s * a + s_r * b
        m = m_new
    if SINKS:
        sink = tl.load(sinks_ptr + head)
        m_new = tl.maximum(m, sink)
        a = tl.exp(m - m_new)
        acc = acc * a
        s = s * a + tl.exp(sink - m_new)
    tl.store(o_ptr + (r * H + head) * HD + dims, acc / s, mask=dims < HD)


@triton.jit
def grouped_matmul_kernel(
    x_ptr, w_ptr, b_ptr, o_ptr, tile_expert_ptr, tile_row_ptr, row_end_ptr, N, K, row_bytes, E,
    QTYPE: tl.constexpr, HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    """The experts' matmuls of one MoE layer in one launch: rows sorted by expert, tile t of
    BM rows from `tile_row[t]` (up to the expert's `row_end`) times expert `tile_expert[t]`'s
    weight (`w` holds the E experts' `[N, K]` weights back to back). A tile past the last
    expert's (`tile_expert` == E) stores nothing: the grid is sized without reading the
    counts back. Each output element sums K from 0 in BK steps, as `matmul_kernel` does, then
    adds the expert's bias (`b` `[E, N]`, with HAS_BIAS)."""
    t = tl.program_id(0)
    e = tl.load(tile_expert_ptr + t)
    end = tl.where(e < E, tl.load(row_end_ptr + tl.minimum(e, E - 1)), 0)  # an empty tile: no row is < 0
    e = tl.minimum(e, E - 1).to(tl.int64)
    rm = tl.load(tile_row_ptr + t) + tl.arange(0, BM)
    rows_ok = rm < end
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + rk
        x = tl.load(x_ptr + rm[:, None] * K + kk[None, :], mask=rows_ok[:, None] & (kk[None, :] < K), other=0.0)
        wmask = (rn[:, None] < N) & (kk[None, :] < K)
        if QTYPE == F32:
            w = tl.load(w_ptr + (e * N + rn[:, None]) * K + kk[None, :], mask=wmask, other=0.0)
        else:
            w = dequant(w_ptr, e * N + rn[:, None], kk[None, :], row_bytes, wmask, QTYPE)
        acc += tl.dot(x, tl.trans(w), input_precision="ieee")
    if HAS_BIAS:
        acc += tl.load(b_ptr + e * N + rn, mask=rn < N, other=0.0)[None, :]
    tl.store(o_ptr + rm[:, None] * N + rn[None, :], acc, mask=rows_ok[:, None] & (rn[None, :] < N))
