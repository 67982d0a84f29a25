"""The compiled MXFP4 kernels (kernels/mxfp4.h, mxfp4_512.h): weight values equal gguf-py's
dequantization bit for bit, so the one-row (decode) and many-row (prefill) matmuls equal the
f32 matmul of the reference weights exactly, on both ISAs and at 1 and 2 threads, and the MoE
op runs MXFP4 experts with the bits of the same experts held in f32."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from agentkv.formats.quants import dequantize
from agentkv.hal.base import BackendUnavailable
from agentkv.hal.blocks import Experts, MoEFFN, MoEFFNSpec, ffn_op
from agentkv.hal.kernels import SUPPORTED_QTYPES, load
from agentkv.hal.registry import lookup

try:
    K = load()
except BackendUnavailable as e:
    pytest.skip(f"agentkv CPU kernels unavailable here: {e}", allow_module_level=True)

MXFP4 = int(gguf.GGMLQuantizationType.MXFP4)
N, KDIM = 37, 256


def random_blocks(rows: int, cols: int, seed: int, scales=(118, 131)) -> np.ndarray:
    """uint8 [rows, cols / 32 * 17]: random codes, E8M0 scale bytes drawn from `scales`."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows, cols // 32, 17), dtype=np.uint8)
    raw[..., 0] = rng.integers(*scales, (rows, cols // 32))
    return raw.reshape(rows, -1)


def every_code_at_every_scale() -> np.ndarray:
    """uint8 [253, 2 * 17]: row e has scale byte e (0 and 1 subnormal) on two blocks whose 64
    weights run through all 16 codes in both nibbles. From scale byte 253 on the largest codes
    overflow to infinities, which an identity matmul turns into NaN (0 * inf), so the
    dequantize test covers those bytes."""
    codes = np.concatenate([np.tile(np.arange(16, dtype=np.uint8), 2), np.arange(16, dtype=np.uint8).repeat(2)])
    qs = codes.reshape(2, 32)
    raw = np.empty((253, 2, 17), np.uint8)
    raw[:, :, 0] = np.arange(253, dtype=np.uint8)[:, None]
    raw[:, :, 1:] = qs[:, :16] | (qs[:, 16:] << np.uint8(4))
    return raw.reshape(253, 34)


def test_mxfp4_is_served_by_the_kernels():
    # an int8-activation kernel too (qmatmul_vnni.cpp; tests/hal/test_int8_matmul.py)
    assert MXFP4 in SUPPORTED_QTYPES and K.int8_qtype_supported(MXFP4)


def test_dequantize_every_code_and_scale_equals_gguf_py():
    edge = every_code_at_every_scale()[:3].copy()
    edge[:, [0, 17]] = np.array([[253], [254], [255]], np.uint8)  # the top scale bytes: some weights infinite
    raw = np.concatenate([every_code_at_every_scale(), edge])
    ours = K.dequantize(torch.from_numpy(raw), MXFP4, raw.shape[0], 64).numpy()
    with np.errstate(over="ignore"):
        want = gguf.quants.dequantize(raw, MXFP4)
    assert np.array_equal(ours.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("m", [8, 64])
def test_identity_matmul_reads_every_weight_exactly(m, isa):
    """x = rows of the identity: out[r, c] = weight c's element r alone, so every code at every
    scale goes through each build's decoder, in decode (m = 8) and prefill (m = 64) alike."""
    raw = every_code_at_every_scale()
    want = dequantize(raw, MXFP4)  # [253, 64]
    x = torch.eye(64)[:m].contiguous()
    ours = K.qmatmul(x, torch.from_numpy(raw), MXFP4, raw.shape[0], 64).numpy()
    assert np.array_equal(ours.view(np.uint32), np.ascontiguousarray(want[:, :m].T).view(np.uint32))


@pytest.mark.parametrize("m", [1, 2, 5, 13, 33, 49])
def test_qmatmul_equals_f32_matmul_of_the_reference_weights(m, threads, isa):
    """m <= 32 (AVX2) / 48 (AVX-512) is the register-decoded path, above it the panel path."""
    raw = random_blocks(N, KDIM, seed=2)
    ref = torch.from_numpy(dequantize(raw, MXFP4))
    x = torch.randn(m, KDIM, generator=torch.Generator().manual_seed(3))
    ours = K.qmatmul(x, torch.from_numpy(raw), MXFP4, N, KDIM)
    assert torch.equal(ours, K.matmul_f32(x, ref))


@pytest.mark.parametrize("m", [1, 49])
def test_qmatmul_at_gpt_oss_width(m, isa):
    """k = 2880 (90 blocks): past the AVX-512 decode path's 64-block scale span, and the
    prefill path's k blocking (rows of 1024 or more)."""
    raw = random_blocks(7, 2880, seed=8)
    x = torch.randn(m, 2880, generator=torch.Generator().manual_seed(9))
    ours = K.qmatmul(x, torch.from_numpy(raw), MXFP4, 7, 2880)
    assert torch.equal(ours, K.matmul_f32(x, torch.from_numpy(dequantize(raw, MXFP4))))


def test_a_changed_code_changes_the_bits(isa):
    """Control: one code of one block moved by one step is seen in that column only."""
    raw = random_blocks(N, KDIM, seed=6)
    x = torch.randn(2, KDIM, generator=torch.Generator().manual_seed(7))
    before = K.qmatmul(x, torch.from_numpy(raw), MXFP4, N, KDIM)
    raw[3, 1 + 5] ^= 0x01  # row 3, weight 5 of its first block
    after = K.qmatmul(x, torch.from_numpy(raw), MXFP4, N, KDIM)
    assert torch.equal(before[:, :3], after[:, :3]) and not torch.equal(before[:, 3], after[:, 3])


def test_moe_op_runs_mxfp4_experts_as_their_f32_values():
    """The compiled expert dispatch (moe.cpp) over MXFP4 experts gives the bits of the same
    experts uploaded as f32 (their gguf-py values): the kernels' weights are those values and
    the f32 banks run the same accumulation order."""
    cpu = lookup("cpu")
    d, f, e = 64, 96, 4
    banks = [
        [random_blocks(rows, cols, 10 * p + i) for i in range(e)]
        for p, (rows, cols) in enumerate([(f, d)] * 2 + [(d, f)])
    ]

    def layer(quantized: bool) -> MoEFFN:
        def up(name, raw, rows, cols):
            if quantized:
                return cpu.upload_weight(name, raw, MXFP4, (rows, cols))
            return cpu.upload_weight(name, dequantize(raw, MXFP4), 0, (rows, cols))

        shapes = [(f, d), (f, d), (d, f)]
        experts = Experts(
            *(tuple(up(f"w{p}{i}", b, *shapes[p]) for i, b in enumerate(bank)) for p, bank in enumerate(banks))
        )
        router = np.random.default_rng(1).standard_normal((e, d)).astype(np.float32)
        return MoEFFN(
            cpu.upload_weight("n", np.ones(d, np.float32), 0, (d,)),
            cpu.upload_weight("r", router, 0, (e, d)),
            experts,
            None,
        )

    quantized, plain, spec = layer(True), layer(False), MoEFFNSpec(e, 2, True)
    assert quantized.experts.gate[0].qtype == MXFP4  # resident, not widened at upload
    x = np.random.default_rng(2).standard_normal((9, d)).astype(np.float32) * 0.1
    for rows in (slice(0, 9), slice(3, 4)):  # many rows per expert, and one token (decode)
        got = cpu.read(ffn_op(quantized, cpu, cpu.upload(x[rows]), spec))
        want = cpu.read(ffn_op(plain, cpu, cpu.upload(x[rows]), spec))
        assert np.array_equal(got, want)
    assert cpu._compiled_experts(quantized.experts, spec) is not None  # the compiled path ran


def test_inspect_says_mxfp4_expert_banks_stay_resident():
    from agentkv.commands.inspect import _cpu_residency

    assert _cpu_residency(MXFP4, (32, 5760, 2880)) == "resident"  # gpt-oss-20b's gate_up bank
    assert _cpu_residency(MXFP4, (32, 8, 48)) == "f32 (fallback)"  # control: not whole blocks
