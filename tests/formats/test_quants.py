"""agentkv.formats.quants against gguf-py's gguf.quants (the oracle): exact bits, shapes, errors."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T
from hypothesis import given, settings
from hypothesis import strategies as st

from agentkv.formats.errors import QuantError
from agentkv.formats.quants import (
    QUANT_NAMES,
    QUANTIZABLE,
    block_info,
    dequantize,
    quantize,
    repack_q4k_as_group32,
    row_bytes,
)
from agentkv.formats.quants import base as quants_base

# Byte offsets of the float16 scale fields inside one block of each block format.
F16_FIELDS = {
    T.Q8_0: (0,),
    T.Q4_0: (0,),
    T.Q4_1: (0, 2),
    T.Q5_0: (0,),
    T.Q5_1: (0, 2),
    T.Q2_K: (80, 82),
    T.Q3_K: (108,),
    T.Q4_K: (0, 2),
    T.Q5_K: (0, 2),
    T.Q6_K: (208,),
}
BLOCK_TYPES = list(F16_FIELDS)
FLOAT_TYPES = [T.F32, T.F16, T.BF16]
QUANTIZE_TYPES = [T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.BF16, T.F16, T.F32]
SHAPES = [(1,), (3, 2), (2, 3, 4)]  # leading dims..., blocks per row


def random_raw(rng, qtype, shape, finite=True) -> np.ndarray:
    """Random blocks: uint8 [*shape[:-1], shape[-1] * type_size]; f16 scales finite if asked."""
    _, type_size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (*shape[:-1], shape[-1] * type_size), dtype=np.uint8)
    if finite and qtype in F16_FIELDS:
        blocks = raw.reshape(-1, type_size)
        for offset in F16_FIELDS[qtype]:
            scale = rng.standard_normal((blocks.shape[0], 1)) * 10.0 ** rng.integers(-4, 3)
            blocks[:, offset : offset + 2] = scale.astype(np.float16).view(np.uint8)
    elif finite and qtype == T.F16:
        raw = rng.standard_normal(raw.shape[:-1] + (raw.shape[-1] // 2,)).astype(np.float16)
    elif finite and qtype == T.BF16:  # the top halves of finite float32s
        x = rng.standard_normal((*shape[:-1], shape[-1])).astype(np.float32)
        raw = (x.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    elif finite:
        raw = rng.standard_normal((*shape[:-1], shape[-1])).astype(np.float32).view(np.uint8)
    return raw


def assert_same_bits(ours: np.ndarray, oracle: np.ndarray) -> None:
    assert ours.dtype == oracle.dtype
    assert ours.shape == oracle.shape
    width = {1: np.uint8, 2: np.uint16, 4: np.uint32}[ours.dtype.itemsize]
    assert np.array_equal(ours.view(width), oracle.view(width))


def quant_inputs(rng, n_cols: int) -> np.ndarray:
    """float32 [8, n_cols]: zeros, tiny, huge, negative-dominated, positive-only, ties."""
    x = rng.standard_normal((8, n_cols)).astype(np.float32)
    x[0] = 0
    x[1] *= np.float32(1e-30)
    x[2] *= np.float32(6e4)
    x[3] = -np.abs(x[3])
    x[3, ::7] *= 100
    x[4] = np.abs(x[4]) + 3
    x[5] = np.round(x[5] * 4) / 4  # many exact halves to hit the rounding ties
    x[6, :] = np.float32(0.5)
    x[7] *= np.float32(1e5)  # f16 scale overflow for the 4/5-bit offsets
    return x


# -- dequantize ------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("qtype", BLOCK_TYPES + FLOAT_TYPES, ids=lambda t: t.name)
def test_dequantize_matches_gguf_bits(qtype, shape):
    raw = random_raw(np.random.default_rng(int(qtype) * 10 + len(shape)), qtype, shape)
    assert_same_bits(dequantize(raw, qtype), gguf.quants.dequantize(raw, qtype))


@pytest.mark.parametrize("qtype", BLOCK_TYPES + [T.BF16, T.F16, T.F32], ids=lambda t: t.name)
def test_dequantize_matches_gguf_bits_with_nan_and_inf(qtype):
    # unpatched random bytes: inf/NaN scales and NaN payloads must come out the same
    raw = random_raw(np.random.default_rng(7), qtype, (64, 4), finite=False)
    with np.errstate(all="ignore"):
        assert_same_bits(dequantize(raw, qtype), gguf.quants.dequantize(raw, qtype))


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q8_0, T.BF16], ids=lambda t: t.name)
def test_dequantize_across_chunk_boundaries(qtype, monkeypatch):
    monkeypatch.setattr(quants_base, "CHUNK_ELEMENTS", 300)  # 1..300 blocks per chunk
    raw = random_raw(np.random.default_rng(3), qtype, (5, 7))
    assert_same_bits(dequantize(raw, qtype), gguf.quants.dequantize(raw, qtype))


def test_dequantize_control_detects_one_flipped_bit():
    raw = random_raw(np.random.default_rng(5), T.Q4_K, (2, 3))
    flipped = raw.copy()
    flipped[1, 200] ^= 1  # a quant nibble in the second block of row 1
    ours, oracle = dequantize(flipped, T.Q4_K), gguf.quants.dequantize(raw, T.Q4_K)
    assert not np.array_equal(ours.view(np.uint32), oracle.view(np.uint32))


def test_dequantize_typed_float_inputs():
    rng = np.random.default_rng(11)
    x32 = rng.standard_normal((3, 5)).astype(np.float32)
    assert np.shares_memory(dequantize(x32, T.F32), x32)
    assert_same_bits(dequantize(x32.view(np.uint8), T.F32), x32)
    x16 = x32.astype(np.float16)
    assert_same_bits(dequantize(x16, T.F16), x16.astype(np.float32))
    assert_same_bits(dequantize(x16.view(np.uint8), T.F16), x16.astype(np.float32))
    bf = (x32.view(np.uint32) >> 16).astype(np.uint16)  # bfloat16 bits as uint16 [3, 5]
    expect = (bf.astype(np.uint32) << 16).view(np.float32)
    assert_same_bits(dequantize(bf, T.BF16), expect)
    assert_same_bits(dequantize(bf.view(np.uint8), T.BF16), expect)


def test_dequantize_non_contiguous_and_empty():
    raw = random_raw(np.random.default_rng(13), T.Q8_0, (4, 6))
    strided = raw[::2]
    assert_same_bits(dequantize(strided, T.Q8_0), gguf.quants.dequantize(raw, T.Q8_0)[::2])
    empty = dequantize(np.zeros((0, 34), np.uint8), T.Q8_0)
    assert empty.shape == (0, 32) and empty.dtype == np.float32


@settings(max_examples=40, deadline=None)
@given(
    qtype=st.sampled_from(BLOCK_TYPES + FLOAT_TYPES),
    lead=st.lists(st.integers(1, 3), min_size=0, max_size=2),
    num_blocks=st.integers(1, 4),
    seed=st.integers(0, 2**32 - 1),
)
def test_dequantize_property_any_shape(qtype, lead, num_blocks, seed):
    raw = random_raw(np.random.default_rng(seed), qtype, (*lead, num_blocks))
    ours = dequantize(raw, qtype)
    block_size, _ = GGML_QUANT_SIZES[qtype]
    assert ours.shape == (*lead, num_blocks * block_size)
    assert_same_bits(ours, gguf.quants.dequantize(raw, qtype))


# -- quantize --------------------------------------------------------------------------------


@pytest.mark.parametrize("qtype", QUANTIZE_TYPES, ids=lambda t: t.name)
def test_quantize_matches_gguf_bytes_and_round_trip(qtype):
    x = quant_inputs(np.random.default_rng(int(qtype)), 96)
    with np.errstate(all="ignore"):
        ours, oracle = quantize(x, qtype), gguf.quants.quantize(x, qtype)
        assert_same_bits(ours, oracle)
        assert_same_bits(dequantize(ours, qtype), gguf.quants.dequantize(oracle, qtype))


@pytest.mark.parametrize("qtype", QUANTIZE_TYPES, ids=lambda t: t.name)
def test_quantize_float64_and_multi_dim(qtype):
    # gguf-py casts block formats to float32 first but F16 straight from float64
    x = np.random.default_rng(17).standard_normal((2, 3, 64)) * 1e3
    assert_same_bits(quantize(x, qtype), gguf.quants.quantize(x, qtype))


@pytest.mark.parametrize("nudge", [0.0, -np.inf, np.inf], ids=["halves", "below", "above"])
def test_quantize_q8_0_rounds_halves_away_from_zero(nudge):
    # amax 127 makes the scale exactly 1, so k/2 lands on (or one ulp beside) a rounding tie
    halves = (np.random.default_rng(23).integers(-254, 255, (256, 32)) / 2).astype(np.float32)
    halves[:, 0] = 127
    x = halves if nudge == 0.0 else np.nextafter(halves, np.float32(nudge))
    x[:, 0] = 127
    assert_same_bits(quantize(x, T.Q8_0), gguf.quants.quantize(x, T.Q8_0))
    assert quantize(np.array([[127.0, 2.5, -2.5] + [0.0] * 29]), T.Q8_0)[0, 2:5].view(np.int8).tolist() == [127, 3, -3]


def test_quantize_all_zero_block_keeps_negative_zero_scale():
    raw = quantize(np.zeros((1, 32), np.float32), T.Q4_0)
    assert raw.tolist() == [[0x00, 0x80] + [0x88] * 16]  # d = 0 / -8 = -0.0; q = 8


def test_quantize_bf16_quiets_nan_and_rounds_to_even():
    x = np.array([[1.0, np.nan, -np.inf, 1.00390625, 1.01171875]], np.float32)
    x.view(np.uint32)[0, 1] = 0x7F800001  # signalling NaN
    bits = quantize(x, T.BF16).view(np.uint16).tolist()
    assert bits == [[0x3F80, 0x7FC0, 0xFF80, 0x3F80, 0x3F82]]


@settings(max_examples=30, deadline=None)
@given(
    qtype=st.sampled_from(QUANTIZE_TYPES),
    lead=st.lists(st.integers(1, 3), min_size=0, max_size=2),
    num_blocks=st.integers(1, 3),
    scale=st.sampled_from([0.0, 1e-20, 1e-3, 1.0, 1e3, 1e30]),
    seed=st.integers(0, 2**32 - 1),
)
def test_quantize_property_any_shape(qtype, lead, num_blocks, scale, seed):
    block_size = 32 if qtype not in FLOAT_TYPES else 1
    x = np.random.default_rng(seed).standard_normal((*lead, num_blocks * block_size)) * scale
    with np.errstate(all="ignore"):
        assert_same_bits(quantize(x, qtype), gguf.quants.quantize(x, qtype))


# -- geometry and names ----------------------------------------------------------------------


def test_quant_names_and_quantizable_exact():
    assert dict(QUANT_NAMES) == {
        0: "F32",
        1: "F16",
        2: "Q4_0",
        3: "Q4_1",
        6: "Q5_0",
        7: "Q5_1",
        8: "Q8_0",
        10: "Q2_K",
        11: "Q3_K",
        12: "Q4_K",
        13: "Q5_K",
        14: "Q6_K",
        30: "BF16",
        39: "MXFP4",
        1004: "I4G32",
        1008: "I8G32",
        1016: "F8G32",  # agentkv's own group-32 blocks (quant checkpoints)
    }
    assert QUANTIZABLE == {0, 1, 2, 3, 6, 7, 8, 30, 39}


def test_block_info_and_row_bytes():
    for qtype, sizes in GGML_QUANT_SIZES.items():
        assert block_info(qtype) == sizes
        assert block_info(int(qtype)) == sizes
    assert row_bytes(T.Q4_K, 512) == 288
    assert row_bytes(T.Q8_0, 576) == 612
    assert row_bytes(T.BF16, 7) == 14
    assert row_bytes(T.IQ2_XXS, 256) == 66  # known geometry even without a codec


# -- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize("call", [dequantize, quantize], ids=["dequantize", "quantize"])
@pytest.mark.parametrize("qtype, label", [(99, "unknown (99)"), (T.IQ2_XXS, "IQ2_XXS (16)")])
def test_unsupported_qtype_names_it_and_lists_supported(call, qtype, label):
    with pytest.raises(QuantError, match=r"^quant type ") as err:
        call(np.zeros((1, 66), np.uint8), qtype)
    assert label in str(err.value)
    assert "Q4_K (12)" in str(err.value) and "BF16 (30)" in str(err.value)


def test_quantize_decode_only_type_lists_quantizable():
    with pytest.raises(QuantError, match=r"quantizing to Q4_K \(12\) is not supported") as err:
        quantize(np.zeros((1, 256), np.float32), T.Q4_K)
    assert "Q8_0 (8)" in str(err.value) and "Q2_K" not in str(err.value)


@pytest.mark.parametrize(
    "qtype, n_bytes, type_size",
    [(T.Q4_K, 145, 144), (T.Q8_0, 33, 34), (T.BF16, 3, 2), (T.F32, 6, 4), (T.F16, 5, 2)],
    ids=lambda v: getattr(v, "name", str(v)),
)
def test_dequantize_ragged_bytes(qtype, n_bytes, type_size):
    label = rf"{qtype.name} \({int(qtype)}\)"
    expect = rf"^{n_bytes} bytes per row is not a multiple of the {label} type size {type_size}$"
    with pytest.raises(QuantError, match=expect):
        dequantize(np.zeros((2, n_bytes), np.uint8), qtype)


@pytest.mark.parametrize("qtype, n_cols", [(T.Q8_0, 33), (T.Q4_1, 16), (T.Q5_0, 48)])
def test_quantize_ragged_row(qtype, n_cols):
    label = rf"{qtype.name} \({int(qtype)}\)"
    expect = rf"^row length {n_cols} is not a multiple of the {label} block size 32$"
    with pytest.raises(QuantError, match=expect):
        quantize(np.zeros((2, n_cols), np.float32), qtype)


def test_zero_dim_and_geometry_errors():
    with pytest.raises(QuantError, match=r"0-d"):
        dequantize(np.uint8(3), T.Q8_0)
    with pytest.raises(QuantError, match=r"0-d"):
        quantize(np.float32(3), T.Q8_0)
    with pytest.raises(QuantError, match=r"unknown \(99\) has no known block size"):
        block_info(99)
    with pytest.raises(QuantError, match=r"row length 100 .* Q4_K \(12\) block size 256"):
        row_bytes(T.Q4_K, 100)


# -- Q4_K repack -----------------------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_repack_q4k_group32_reproduces_dequantize_bits(shape):
    raw = random_raw(np.random.default_rng(19), T.Q4_K, shape)
    q, scale, offset = repack_q4k_as_group32(raw)
    n_cols = shape[-1] * 256
    assert q.shape == (*shape[:-1], n_cols) and q.dtype == np.uint8 and int(q.max()) <= 15
    assert scale.shape == offset.shape == (*shape[:-1], n_cols // 32)
    assert scale.dtype == offset.dtype == np.float32
    groups = q.reshape(*shape[:-1], n_cols // 32, 32).astype(np.float32)
    rebuilt = (groups * scale[..., None] - offset[..., None]).reshape(q.shape)
    assert_same_bits(rebuilt, gguf.quants.dequantize(raw, T.Q4_K))


def test_repack_q4k_ragged_bytes():
    with pytest.raises(QuantError, match=r"^200 bytes per row .* Q4_K \(12\) type size 144$"):
        repack_q4k_as_group32(np.zeros((1, 200), np.uint8))
