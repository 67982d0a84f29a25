"""MXFP4 against its oracles: gguf-py's codec (GGUF blocks) and transformers' dequantization
(the `*_blocks` + `*_scales` form gpt-oss checkpoints are saved in)."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from agentkv.formats.errors import QuantError
from agentkv.formats.quants import dequantize, quantize
from agentkv.formats.quants.mxfp4 import from_hf_blocks


def every_code_and_scale() -> np.ndarray:
    """uint8 [256, 2 * 17]: row e holds scale byte e (0 and 1 subnormal, 255 the edge) over two
    blocks whose 32 + 32 elements run through all 16 codes, four times, in both nibbles."""
    codes = np.tile(np.arange(16, dtype=np.uint8), 4).reshape(2, 32)
    codes[1] = codes[1][::-1]
    qs = codes[:, :16] | (codes[:, 16:] << np.uint8(4))  # [2, 16]
    raw = np.empty((256, 2, 17), np.uint8)
    raw[:, :, 0] = np.arange(256, dtype=np.uint8)[:, None]
    raw[:, :, 1:] = qs
    return raw.reshape(256, 34)


def test_every_code_at_every_scale_decodes_as_gguf_py():
    raw = every_code_and_scale()
    with np.errstate(over="ignore"):
        ours, oracle = dequantize(raw, T.MXFP4), gguf.quants.dequantize(raw, T.MXFP4)
    assert ours.dtype == oracle.dtype == np.float32 and ours.shape == oracle.shape == (256, 64)
    assert np.array_equal(ours.view(np.uint32), oracle.view(np.uint32))
    assert ours[127, 1] == 0.5 and ours[0, 1] == 2.0**-128 and ours[255, 1] == 2.0**127  # spot values
    assert np.isinf(ours[255, 7])  # 12 * 2^127 overflows, in gguf-py too
    flipped = raw.copy()
    flipped[3, 5] ^= 0x10  # control: one code bit of element 20 of row 3
    assert not np.array_equal(dequantize(flipped, T.MXFP4), oracle)


def test_quantize_matches_gguf_py_bytes():
    rng = np.random.default_rng(39)
    x = rng.standard_normal((7, 96)).astype(np.float32)
    x[0] = 0
    x[1] *= np.float32(1e-30)  # scales near the E8M0 floor
    x[2] *= np.float32(1e30)
    x[3] = np.round(x[3] * 8) / 8  # exact values and midpoints: nearest-value ties
    x[4, ::5] = -0.0
    x[5] = -np.abs(x[5])
    with np.errstate(all="ignore"):
        ours, oracle = quantize(x, T.MXFP4), gguf.quants.quantize(x, T.MXFP4)
    assert ours.shape == oracle.shape == (7, 3 * 17)
    assert np.array_equal(ours, oracle)


def test_transformers_form_decodes_as_transformers():
    torch = pytest.importorskip("torch")
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    rng = np.random.default_rng(4)
    blocks = rng.integers(0, 256, (2, 5, 3, 16), dtype=np.uint8)  # [experts, out, groups, 16]
    scales = rng.integers(0, 255, (2, 5, 3), dtype=np.uint8)
    scales[0, 0] = [0, 1, 254]  # the subnormal scales and the largest finite one
    want = convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales), dtype=torch.float32)
    want = want.transpose(1, 2).numpy()  # transformers returns [experts, in, out]
    raw = from_hf_blocks(blocks, scales)
    assert raw.shape == (2, 5, 3 * 17)
    got = dequantize(raw, T.MXFP4)
    # equal as numbers: code 8 is -0.0 in transformers' table and +0.0 in ggml's
    assert np.array_equal(got, want)
    assert np.array_equal(np.signbit(got) & (got != 0), np.signbit(want) & (want != 0))
    swapped = from_hf_blocks(blocks, scales)
    swapped[..., 1:] = (swapped[..., 1:] >> 4) | (swapped[..., 1:] << 4)  # control: Q4_0-style order read wrong
    assert not np.array_equal(dequantize(swapped, T.MXFP4), want)


def test_transformers_form_errors_name_the_tensor():
    blocks = np.zeros((4, 2, 16), np.uint8)
    with pytest.raises(QuantError, match=r"experts\.down_proj: MXFP4 blocks \[4, 2, 16\] and scales \[4, 3\]"):
        from_hf_blocks(blocks, np.zeros((4, 3), np.uint8), "experts.down_proj")
    scales = np.zeros((4, 2), np.uint8)
    scales[2, 1] = 255
    with pytest.raises(QuantError, match=r"w: MXFP4 scale byte 255 \(E8M0 NaN\) at \[2, 1\]"):
        from_hf_blocks(blocks, scales, "w")
