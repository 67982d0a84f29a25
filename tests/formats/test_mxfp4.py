"""MXFP4 against its oracles: gguf-py's codec (GGUF blocks) and transformers' dequantization
(the `*_blocks` + `*_scales` form gpt-oss checkpoints are saved in)."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from agentkv.formats.errors import FormatError, QuantError
from agentkv.formats.quants import dequantize, quantize
from agentkv.formats.quants.mxfp4 import from_hf_blocks
from agentkv.formats.safetensors import SafetensorsSource

MXFP4_CONFIG = {"model_type": "gpt_oss", "num_hidden_layers": 1, "quantization_config": {"quant_method": "mxfp4"}}


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


def write_mxfp4_folder(folder, tensors: dict[str, np.ndarray]) -> SafetensorsSource:
    import json

    from safetensors.numpy import save_file

    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(MXFP4_CONFIG))
    save_file(tensors, str(folder / "model.safetensors"))
    return SafetensorsSource(folder)


def expert_tensor(source: SafetensorsSource, projection: str):
    """The layer-0 expert tensor by its GGUF name once gpt_oss names map, else its HF name."""
    names = {f"blk.0.ffn_{projection}_exps.weight", f"model.layers.0.mlp.experts.{projection}_proj.weight"}
    (name,) = names & set(source.tensor_names())
    return source.tensor(name)


def test_safetensors_reader_keeps_experts_mxfp4(tmp_path):
    """gate_up splits into gate (even rows) and up (odd rows), as llama.cpp's converter does;
    every expert stays MXFP4 blocks and decodes as transformers' dequantization does."""
    torch = pytest.importorskip("torch")
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    rng = np.random.default_rng(8)
    prefix = "model.layers.0.mlp.experts."
    parts = {
        "gate_up_proj": (rng.integers(0, 256, (2, 6, 2, 16), np.uint8), rng.integers(100, 140, (2, 6, 2), np.uint8)),
        "down_proj": (rng.integers(0, 256, (2, 64, 1, 16), np.uint8), rng.integers(100, 140, (2, 64, 1), np.uint8)),
    }
    tensors = {f"{prefix}{p}{s}": a for p, (b, sc) in parts.items() for s, a in (("_blocks", b), ("_scales", sc))}
    tensors[f"{prefix}down_proj_bias"] = np.zeros((2, 64), np.float32)
    tensors["stray"] = np.zeros(3, np.uint8)  # U8 outside a pair: refused, never read as int8
    source = write_mxfp4_folder(tmp_path / "m", tensors)
    want = {
        p: convert_moe_packed_tensors(torch.from_numpy(b), torch.from_numpy(sc), dtype=torch.float32).transpose(1, 2)
        for p, (b, sc) in parts.items()
    }
    for projection, expect in [("gate", want["gate_up_proj"][:, ::2]), ("up", want["gate_up_proj"][:, 1::2])]:
        info = expert_tensor(source, projection)
        assert (info.qtype, info.shape, info.data.shape) == (T.MXFP4, (2, 3, 64), (2, 3, 2 * 17))
        assert np.array_equal(dequantize(info.data, T.MXFP4), expect.numpy())
    down = expert_tensor(source, "down")
    assert (down.shape, np.array_equal(dequantize(down.data, T.MXFP4), want["down_proj"].numpy())) == (
        (2, 64, 32),
        True,
    )
    assert source.checkpoint_format(down.name) == "mxfp4 blocks+scales"
    assert not any(n.endswith(("_blocks", "_scales")) for n in source.tensor_names())
    with pytest.raises(FormatError, match=r"tensor 'stray' is U8, read only as the blocks or scales"):
        source.tensor("stray")


def test_safetensors_reader_names_a_lone_blocks_tensor(tmp_path):
    tensors = {"model.layers.0.mlp.experts.down_proj_blocks": np.zeros((1, 4, 1, 16), np.uint8)}
    with pytest.raises(
        FormatError, match=r"m: tensor 'model.layers.0.mlp.experts.down_proj_blocks' has no '.*down_proj_scales'"
    ):
        write_mxfp4_folder(tmp_path / "m", tensors)
