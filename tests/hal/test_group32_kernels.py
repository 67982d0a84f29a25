"""The compiled decoders of the 16-bit float formats and of agentkv's group-32 blocks (the
quantized safetensors checkpoints' resident form): weights equal to the reference backend's
dequantization bit for bit (gguf-py for F16/BF16, formats/quants/group32 for the rest), so a
matmul against them equals the f32 matmul of those weights exactly, on both ISAs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agentkv.formats.quants.group32 import E4M3_TABLE, F8G32, I4G32, I8G32
from agentkv.hal.base import BackendUnavailable
from agentkv.hal.kernels import SUPPORTED_QTYPES, load

gguf = pytest.importorskip("gguf")
try:
    K = load()
except BackendUnavailable as e:
    pytest.skip(f"agentkv CPU kernels unavailable here: {e}", allow_module_level=True)

N, KDIM = 37, 256
NAMES = ("I4G32", "I8G32", "F8G32", "F16", "BF16")


def blocks_and_reference(name: str, seed: int) -> tuple[np.ndarray, int, np.ndarray]:
    """(uint8 [N, row_bytes], qtype, the reference backend's f32 weights [N, KDIM])."""
    rng = np.random.default_rng(seed)
    scale = (rng.standard_normal((N, KDIM // 32)) * 0.02).astype(np.float32)
    if name in ("I4G32", "I8G32"):
        codec, top = (I4G32, 16) if name == "I4G32" else (I8G32, 256)
        q = rng.integers(0, top, (N, KDIM)).astype(np.uint8)
        zero = rng.integers(0, top, (N, KDIM // 32)).astype(np.float32)
        raw = codec.encode(q, scale, zero)
        return raw, int(codec.qtype), codec.dequantize_array(raw).reshape(N, KDIM)
    if name == "F8G32":
        codes = rng.integers(0, 256, (N, KDIM)).astype(np.uint8)
        codes[(codes & 0x7F) == 0x7F] -= 1  # no NaN here (test_every_e4m3_code_... has them)
        raw = F8G32.encode(codes, scale, None)
        return raw, int(F8G32.qtype), F8G32.dequantize_array(raw).reshape(N, KDIM)
    qtype = gguf.GGMLQuantizationType[name]
    w = rng.standard_normal((N, KDIM)).astype(np.float32)
    w[0, :4] = [1e-40, -1e-42, 6e-8, 65504.0]  # f32 denormals, an f16 subnormal, f16's max
    raw = gguf.quants.quantize(w, qtype)
    return raw.view(np.uint8).reshape(N, -1), int(qtype), gguf.quants.dequantize(raw, qtype).astype(np.float32)


def test_the_formats_are_served_by_the_kernels():
    assert {1004, 1008, 1016, 1, 30} <= SUPPORTED_QTYPES


@pytest.mark.parametrize("name", NAMES)
def test_dequantize_equals_the_reference_bit_for_bit(name, isa):
    raw, qtype, ref = blocks_and_reference(name, seed=1)
    ours = K.dequantize(torch.from_numpy(raw), qtype, N, KDIM).numpy()
    assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32))


def test_every_e4m3_code_decodes_to_the_table(isa):
    """All 256 codes, signed zero, subnormals and NaN included, at scale 1."""
    raw = F8G32.encode(np.arange(256, dtype=np.uint8).reshape(1, 256), np.ones((1, 8), np.float32), None)
    ours = K.dequantize(torch.from_numpy(raw), int(F8G32.qtype), 1, 256).numpy()[0]
    finite = ~np.isnan(E4M3_TABLE)
    assert np.array_equal(np.isnan(ours), ~finite) and int(finite.sum()) == 254
    assert np.array_equal(ours.view(np.uint32)[finite], E4M3_TABLE.view(np.uint32)[finite])


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 13])
def test_qmatmul_equals_f32_matmul_of_the_reference_weights(name, m, threads, isa):
    """The same accumulation order over the same weight values: equal bits, in decode (m <= 4)
    and prefill (m > 4) alike."""
    raw, qtype, ref = blocks_and_reference(name, seed=2)
    x = torch.randn(m, KDIM, generator=torch.Generator().manual_seed(3))
    ours = K.qmatmul(x, torch.from_numpy(raw), qtype, N, KDIM)
    assert torch.equal(ours, K.matmul_f32(x, torch.from_numpy(ref)))


def test_a_changed_code_changes_the_bits(isa):
    """Control: the equality above is not vacuous, one code moved by one step is seen."""
    raw, qtype, ref = blocks_and_reference("I4G32", seed=6)
    x = torch.randn(2, KDIM, generator=torch.Generator().manual_seed(7))
    before = K.qmatmul(x, torch.from_numpy(raw), qtype, N, KDIM)
    raw[3, 8 + 5] ^= 0x01  # row 3, weight 5 of its first block
    after = K.qmatmul(x, torch.from_numpy(raw), qtype, N, KDIM)
    assert torch.equal(before[:, :3], after[:, :3]) and not torch.equal(before[:, 3], after[:, 3])
