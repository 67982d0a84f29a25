"""Triton dequantization of GGUF weight rows, element by element, from the file's own block
bytes: the matmul and embedding kernels call `dequant` on a `[rows, cols]` tile.

Each element finds its block (`col // QK`) and its bytes inside it, so any tile shape reads
any format; the layouts are gguf's (ggml-quants.c), and the values equal gguf-py's
dequantization up to the order of one multiply-add (the witness floors cover that).

    Q8_0  34 B / 32:   | d f16 | qs int8 x32 |                       d * q
    Q4_0  18 B / 32:   | d f16 | qs x16 (lo nibbles: 0-15, hi: 16-31) | d * (q - 8)
    Q4_1  20 B / 32:   | d f16 | m f16 | qs x16 |                   d * q + m
    Q4_K 144 B / 256:  | d | dmin | scales 12 (6-bit sc, m x8) | qs 128 |
    Q5_K 176 B / 256:  | d | dmin | scales 12 | qh 32 | qs 128 |
    Q6_K 210 B / 256:  | ql 128 | qh 64 | scales int8 x16 | d f16 |
    F16 / BF16:        two bytes per element
    I4G32  24 B / 32:  | scale f32 | zero f32 | qs x16 (Q4_0 order) |  scale * (q - zero)
    I8G32  40 B / 32:  | scale f32 | zero f32 | qs u8 x32 |             scale * (q - zero)
    F8G32  36 B / 32:  | scale f32 | qs e4m3fn x32 |                   e4m3(q) * scale
    MXFP4  17 B / 32:  | e E8M0 | qs x16 (Q4_0 order) |      e2m1x2(q) * 2^(e - 128)
(the group-32 blocks of GPTQ, AWQ and compressed-tensors checkpoints: formats/quants/group32.py)
"""

from __future__ import annotations

import triton
import triton.language as tl

F16, Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K, BF16 = 1, 2, 3, 8, 12, 13, 14, 30
I4G32, I8G32, F8G32 = 1004, 1008, 1016
MXFP4 = 39
# the same codes as the kernels see them (a jitted function reads only constexpr globals)
_F16, _Q4_0, _Q4_1, _Q8_0 = tl.constexpr(F16), tl.constexpr(Q4_0), tl.constexpr(Q4_1), tl.constexpr(Q8_0)
_Q4_K, _Q5_K, _Q6_K, _BF16 = tl.constexpr(Q4_K), tl.constexpr(Q5_K), tl.constexpr(Q6_K), tl.constexpr(BF16)
_I4G32, _I8G32, _F8G32 = tl.constexpr(I4G32), tl.constexpr(I8G32), tl.constexpr(F8G32)
_MXFP4 = tl.constexpr(MXFP4)

# qtype -> (weights per block, bytes per block): the formats `dequant` reads
BLOCKS: dict[int, tuple[int, int]] = {
    F16: (1, 2),
    BF16: (1, 2),
    Q8_0: (32, 34),
    Q4_0: (32, 18),
    Q4_1: (32, 20),
    Q4_K: (256, 144),
    Q5_K: (256, 176),
    Q6_K: (256, 210),
    I4G32: (32, 24),
    I8G32: (32, 40),
    F8G32: (32, 36),
    MXFP4: (32, 17),
}


@triton.jit
def _u16(p, mask):
    """Two little-endian bytes at `p` as uint16."""
    lo = tl.load(p, mask=mask, other=0).to(tl.uint16)
    hi = tl.load(p + 1, mask=mask, other=0).to(tl.uint16)
    return lo | (hi << 8)


@triton.jit
def _f16(p, mask):
    return _u16(p, mask).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _f32(p, mask):
    """Four little-endian bytes at `p` as float32."""
    lo = _u16(p, mask).to(tl.uint32)
    hi = _u16(p + 2, mask).to(tl.uint32)
    return (lo | (hi << 16)).to(tl.float32, bitcast=True)


@triton.jit
def _e4m3(code):
    """float8 e4m3fn codes (int32 0..255) as float32, exactly: sign, 4 exponent bits (bias 7),
    3 mantissa bits, exponent 0 subnormal (m * 2^-9), S.1111.111 NaN."""
    exp, man = (code >> 3) & 0xF, code & 7
    normal = (((exp + 120) << 23) | (man << 20)).to(tl.float32, bitcast=True)
    value = tl.where(exp == 0, man.to(tl.float32) * 0.001953125, normal)
    value = tl.where((code & 0x7F) == 0x7F, float("nan"), value)
    return tl.where((code & 0x80) != 0, -value, value)


@triton.jit
def _byte(p, mask):
    return tl.load(p, mask=mask, other=0).to(tl.int32)


@triton.jit
def _k4_scale_min(sp, sub, mask):
    """gguf's get_scale_min_k4: the 6-bit scale and min of sub-block `sub` (0..7) from the
    12 packed bytes at `sp`."""
    a = _byte(sp + sub, mask)
    b = _byte(sp + sub + 4, mask)
    c = _byte(sp + tl.maximum(sub - 4, 0), mask)
    low = sub < 4
    sc = tl.where(low, a & 63, (b & 0xF) | ((c >> 6) << 4))
    mn = tl.where(low, b & 63, (b >> 4) | ((a >> 6) << 4))
    return sc.to(tl.float32), mn.to(tl.float32)


@triton.jit
def _e2m1x2(q):
    """An E2M1 code (sign in bit 3) doubled, as ggml keeps it: 0, 1, 2, 3, 4, 6, 8, 12."""
    m = q & 7
    e = m >> 1
    mag = tl.where(e == 0, m & 1, (1 << e) + (m & 1) * (1 << e) // 2).to(tl.float32)
    return tl.where(q >= 8, -mag, mag)


@triton.jit
def _e8m0_half(e):
    """2^(e - 128) from its float32 bits (e = 0 and 1 as the subnormals 2^-128 and 2^-127),
    as ggml's GGML_E8M0_TO_FP32_HALF; each product with `_e2m1x2` is exact in f32."""
    e = e.to(tl.uint32)
    bits = tl.where(e < 2, tl.full(e.shape, 0x00200000, tl.uint32) << e, (e - 1) << 23)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _mxfp4(blk, j, mask):
    """Element j of the MXFP4 blocks at `blk`: its nibble (Q4_0's order) times the scale."""
    return _e2m1x2((_byte(blk + 1 + j % 16, mask) >> (4 * (j // 16))) & 0xF) * _e8m0_half(_byte(blk, mask))


@triton.jit
def dequant(w_ptr, rows, cols, row_bytes, mask, QTYPE: tl.constexpr):
    """f32 weights at (`rows`, `cols`) (broadcast int32 index tensors) of a byte tensor of
    gguf rows `row_bytes` long; masked-out elements are 0."""
    if QTYPE == _F16 or QTYPE == _BF16:
        bits = _u16(w_ptr + rows * row_bytes + cols * 2, mask)
        if QTYPE == _F16:
            out = bits.to(tl.float16, bitcast=True).to(tl.float32)
        else:
            out = (bits.to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    elif QTYPE == _Q8_0:
        blk = w_ptr + rows * row_bytes + (cols // 32) * 34
        q = tl.load(blk + 2 + cols % 32, mask=mask, other=0).to(tl.int8, bitcast=True).to(tl.float32)
        out = _f16(blk, mask) * q
    elif QTYPE == _Q4_0 or QTYPE == _Q4_1:
        bb: tl.constexpr = 18 if QTYPE == _Q4_0 else 20
        head: tl.constexpr = 2 if QTYPE == _Q4_0 else 4
        blk = w_ptr + rows * row_bytes + (cols // 32) * bb
        j = cols % 32
        q = (_byte(blk + head + j % 16, mask) >> (4 * (j // 16))) & 0xF
        if QTYPE == _Q4_0:
            out = _f16(blk, mask) * (q - 8).to(tl.float32)
        else:
            out = _f16(blk, mask) * q.to(tl.float32) + _f16(blk + 2, mask)
    elif QTYPE == _Q4_K or QTYPE == _Q5_K:
        bb: tl.constexpr = 144 if QTYPE == _Q4_K else 176
        qs_at: tl.constexpr = 16 if QTYPE == _Q4_K else 48
        blk = w_ptr + rows * row_bytes + (cols // 256) * bb
        j = cols % 256
        group, jj = j // 64, j % 64
        upper = jj // 32  # 0: low nibbles, 1: high nibbles of the group's 32 bytes
        sc, mn = _k4_scale_min(blk + 4, 2 * group + upper, mask)
        q = (_byte(blk + qs_at + 32 * group + jj % 32, mask) >> (4 * upper)) & 0xF
        if QTYPE == _Q5_K:
            q += ((_byte(blk + 16 + jj % 32, mask) >> (2 * group + upper)) & 1) << 4
        out = _f16(blk, mask) * sc * q.to(tl.float32) - _f16(blk + 2, mask) * mn
    elif QTYPE == _I4G32 or QTYPE == _I8G32:
        bb: tl.constexpr = 24 if QTYPE == _I4G32 else 40
        blk = w_ptr + rows * row_bytes + (cols // 32) * bb
        j = cols % 32
        if QTYPE == _I4G32:
            q = (_byte(blk + 8 + j % 16, mask) >> (4 * (j // 16))) & 0xF
        else:
            q = _byte(blk + 8 + j, mask)
        out = _f32(blk, mask) * (q.to(tl.float32) - _f32(blk + 4, mask))
    elif QTYPE == _F8G32:
        blk = w_ptr + rows * row_bytes + (cols // 32) * 36
        out = _e4m3(_byte(blk + 4 + cols % 32, mask)) * _f32(blk, mask)
    elif QTYPE == _MXFP4:
        out = _mxfp4(w_ptr + rows * row_bytes + (cols // 32) * 17, cols % 32, mask)
    else:
        tl.static_assert(QTYPE == _Q6_K, "dequant: unsupported qtype")
        blk = w_ptr + rows * row_bytes + (cols // 256) * 210
        j = cols % 256
        half, jj = j // 128, j % 128
        lane, quarter = jj % 32, jj // 32
        ql = (_byte(blk + 64 * half + lane + 32 * (quarter % 2), mask) >> (4 * (quarter // 2))) & 0xF
        qh = (_byte(blk + 128 + 32 * half + lane, mask) >> (2 * quarter)) & 3
        sc = tl.load(blk + 192 + 8 * half + lane // 16 + 2 * quarter, mask=mask, other=0).to(tl.int8, bitcast=True)
        out = _f16(blk + 208, mask) * sc.to(tl.float32) * ((ql | (qh << 4)) - 32).to(tl.float32)
    return tl.where(mask, out, 0.0)
