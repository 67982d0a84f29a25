"""Quantized safetensors checkpoints: unpacking and dequantization against the formats' own
libraries (compressed-tensors' unpack/decompress, transformers' FP8 dequantizer, torch's float8
cast), the exact resident repack, and config errors that name the field."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from agentkv.formats.quant_ckpt import QuantConfigError, parse_scheme, repack_fp8, repack_int
from agentkv.formats.quant_ckpt.unpack import unpack_awq, unpack_fp8, unpack_gptq, unpack_pack_quantized, unpack_slots
from agentkv.formats.quants import dequantize
from agentkv.formats.quants.group32 import E4M3_TABLE, AgentQuantType
from tests.formats import quant_ckpt_writer as qw

OUT, IN = 48, 128


def _oracle(name: str, label: str):
    """The oracle `name` from quant_oracles, or a skip naming why it could not be built."""
    from tests.formats import quant_oracles

    try:
        return getattr(quant_oracles, name)()
    except RuntimeError as exc:
        pytest.skip(f"{label} oracle unavailable: {exc}")


@pytest.fixture(scope="module")
def autoawq_packing():
    return _oracle("autoawq_packing", "AutoAWQ")


@pytest.fixture(scope="module")
def gptqmodel_linear():
    return _oracle("gptqmodel_dequant", "gptqmodel")


def _w(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((OUT, IN)).astype(np.float32)


def test_e4m3_table_equals_torch_float8_for_every_pattern() -> None:
    theirs = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float().numpy()
    assert np.array_equal(np.isnan(E4M3_TABLE), np.isnan(theirs))
    ok = ~np.isnan(theirs)
    assert np.array_equal(E4M3_TABLE[ok].view(np.uint32), theirs[ok].view(np.uint32))  # -0.0 included


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("sym", [True, False])
@pytest.mark.parametrize("strategy", ["group", "channel"])
def test_pack_quantized_equals_compressed_tensors(bits, sym, strategy) -> None:
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import dequantize as ct_dequantize

    group_size = 32 if strategy == "group" else None
    parts, _ = qw.compressed_int_parts(_w(), bits, group_size, sym, False, np.random.default_rng(1))
    ours = unpack_pack_quantized(
        "m",
        parts["weight_packed"],
        parts["weight_scale"],
        parts.get("weight_zero_point"),
        parts["weight_shape"],
        None,
        bits,
        group_size,
    )
    ints = unpack_from_int32(torch.from_numpy(parts["weight_packed"]), bits, torch.Size((OUT, IN)))
    assert np.array_equal(ours.q.astype(np.int16) - (1 << (bits - 1)), ints.numpy())  # bit-exact codes
    zp = None
    if not sym:
        zp = unpack_from_int32(
            torch.from_numpy(parts["weight_zero_point"]),
            bits,
            torch.Size((OUT, parts["weight_scale"].shape[1])),
            packed_dim=0,
        )
        assert np.array_equal(ours.zero - (1 << (bits - 1)), zp.numpy())
    args = QuantizationArgs(num_bits=bits, type="int", symmetric=sym, strategy=strategy, group_size=group_size)
    theirs = ct_dequantize(ints, torch.from_numpy(parts["weight_scale"]), zp, args).numpy()
    assert np.array_equal(ours.dequantize(), theirs)  # f32 scales: one rounding on both sides


def test_pack_quantized_actorder_gathers_each_columns_group() -> None:
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32

    parts, values = qw.compressed_int_parts(_w(), 4, 32, False, True, np.random.default_rng(2))
    ours = unpack_pack_quantized(
        "m",
        parts["weight_packed"],
        parts["weight_scale"],
        parts["weight_zero_point"],
        parts["weight_shape"],
        parts["weight_g_idx"],
        4,
        32,
    )
    ints = unpack_from_int32(torch.from_numpy(parts["weight_packed"]), 4, torch.Size((OUT, IN))).numpy()
    zp = unpack_from_int32(torch.from_numpy(parts["weight_zero_point"]), 4, torch.Size((OUT, 4)), packed_dim=0).numpy()
    g = parts["weight_g_idx"].astype(np.int64)
    theirs = (ints.astype(np.float32) - zp[:, g].astype(np.float32)) * parts["weight_scale"][:, g]
    assert np.array_equal(ours.dequantize(), theirs)
    assert np.array_equal(ours.dequantize(), values)
    assert repack_int(ours).fallback == "groups do not fall on whole 32-column blocks"


@pytest.mark.parametrize("strategy", ["tensor", "channel", "block"])
def test_float_quantized_equals_compressed_tensors(strategy) -> None:
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import dequantize as ct_dequantize

    parts, _ = qw.fp8_parts(_w(), strategy, block=(32, 64))
    block = (32, 64) if strategy == "block" else None
    ours = unpack_fp8("m", parts["weight"].view(torch.uint8).numpy(), parts["weight_scale"], block)
    extra = {"block_structure": [32, 64]} if strategy == "block" else {}
    args = QuantizationArgs(num_bits=8, type="float", symmetric=True, strategy=strategy, **extra)
    scale = torch.from_numpy(parts["weight_scale"])
    theirs = ct_dequantize(parts["weight"], scale if strategy != "channel" else scale.reshape(OUT, 1), None, args)
    assert np.array_equal(ours.dequantize(), theirs.numpy())
    resident = repack_fp8(ours)
    assert resident.qtype == AgentQuantType.F8G32 and resident.fallback is None
    assert np.array_equal(dequantize(resident.data, resident.qtype), ours.dequantize())


def test_hf_fp8_block_equals_transformers_dequantizer() -> None:
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize

    w = np.random.default_rng(3).standard_normal((256, 384)).astype(np.float32)
    parts, _ = qw.fp8_parts(w, "block", block=(128, 128), scale_name="weight_scale_inv")
    ours = unpack_fp8("m", parts["weight"].view(torch.uint8).numpy(), parts["weight_scale_inv"], (128, 128))
    theirs = Fp8Dequantize(None)._dequantize_one(
        parts["weight"], torch.from_numpy(parts["weight_scale_inv"]), torch.float32
    )
    assert np.array_equal(ours.dequantize(), theirs.numpy())


@pytest.mark.parametrize(
    "bits,group_size,sym,v2,desc_act",
    [
        (4, 32, True, False, False),
        (4, 64, False, False, False),
        (8, 32, False, True, False),
        (4, -1, False, True, False),
        (4, 32, False, False, True),
        (8, 64, True, False, True),
    ],
)
def test_gptq_unpacks_to_the_writers_codes(bits, group_size, sym, v2, desc_act) -> None:
    parts, values = qw.gptq_parts(_w(), bits, group_size, sym, v2, desc_act, np.random.default_rng(4))
    gs = None if group_size == -1 else group_size
    ours = unpack_gptq(
        "m", parts["qweight"], parts["qzeros"], parts["scales"], parts["g_idx"] if desc_act else None, bits, gs, not v2
    )
    assert np.array_equal(ours.dequantize(), values)
    if desc_act:
        assert len(np.unique(parts["g_idx"][:32])) > 1  # the control: groups really are permuted


def test_gptq_v1_stores_zero_minus_one() -> None:
    parts, _ = qw.gptq_parts(_w(), 4, 32, True, False, False, None)
    assert np.all(unpack_slots(parts["qzeros"], 4) == 7)  # symmetric zero 8, stored as 8 - 1


def _gptqmodel_dequant(cls, parts, bits, v2, scales=None, qweight=None) -> np.ndarray:
    """gptqmodel's dequantize_weight on a module holding `parts` (v1 zeros converted as it loads them)."""
    m = cls()
    m.bits, m.pack_factor, m.maxq, m.pack_dtype_bits = bits, 32 // bits, 2**bits - 1, 32
    m.dequant_dtype = torch.int16 if bits == 8 else torch.int8
    m.planar, m.enable_wf_unsqueeze = False, True
    m.in_features = parts["g_idx"].shape[0]
    for name, value in [("qweight", qweight), ("qzeros", None), ("scales", scales), ("g_idx", None)]:
        m.register_buffer(name, torch.from_numpy(parts[name] if value is None else value).clone())
    if not v2:
        cls.convert_v1_to_v2(m, bits)
    return m.dequantize_weight().numpy()  # [in, out]


GPTQ_ORACLE_CASES = [
    (4, 32, True, False, False),
    (4, 32, False, False, False),
    (4, 64, False, True, False),
    (8, 32, True, False, False),
    (8, 32, False, True, False),
    (4, -1, False, False, False),
    (4, 32, False, False, True),
    (4, 32, True, True, True),
    (8, 64, False, False, True),
    (8, 32, True, True, True),
]


@pytest.mark.parametrize(("bits", "group_size", "sym", "v2", "desc_act"), GPTQ_ORACLE_CASES)
def test_gptq_equals_gptqmodel(gptqmodel_linear, bits, group_size, sym, v2, desc_act) -> None:
    parts, values = qw.gptq_parts(_w(), bits, group_size, sym, v2, desc_act, np.random.default_rng(4))
    if desc_act:
        assert np.any(np.diff(parts["g_idx"]) < 0)  # act-order: g_idx really is non-monotonic
    ours = unpack_gptq(
        "m",
        parts["qweight"],
        parts["qzeros"],
        parts["scales"],
        parts["g_idx"],
        bits,
        None if group_size == -1 else group_size,
        not v2,
    )
    ones = np.ones(parts["scales"].shape, np.float32)
    # their unpacked codes (scales 1, zeros 0) and zeros (codes 0), through their own unpack path
    codes = _gptqmodel_dequant(gptqmodel_linear, {**parts, "qzeros": np.zeros_like(parts["qzeros"])}, bits, True, ones)
    zeros = _gptqmodel_dequant(gptqmodel_linear, parts, bits, v2, ones, np.zeros_like(parts["qweight"]))
    assert np.array_equal(codes.T, ours.q.astype(np.float32))
    assert np.array_equal(-zeros.T, ours.zero[:, ours.group])
    theirs = _gptqmodel_dequant(gptqmodel_linear, parts, bits, v2)
    # gptqmodel computes in the f16 of the scales: our exact f32 product rounds to its value
    assert theirs.dtype == np.float16 and np.array_equal(ours.dequantize().T.astype(np.float16), theirs)
    assert np.array_equal(ours.dequantize(), values)


def test_gptqmodel_oracle_rejects_a_zero_point_off_by_one(gptqmodel_linear) -> None:
    parts, _ = qw.gptq_parts(_w(), 4, 32, False, True, True, np.random.default_rng(4))
    ours = unpack_gptq("m", parts["qweight"], parts["qzeros"], parts["scales"], parts["g_idx"], 4, 32, False)
    theirs = _gptqmodel_dequant(gptqmodel_linear, parts, 4, True)
    assert np.array_equal(ours.dequantize().T.astype(np.float16), theirs)
    # the v2 checkpoint read as v1 (our zero one too high), and the v1 "+1" left off: both must differ
    wrong = unpack_gptq("m", parts["qweight"], parts["qzeros"], parts["scales"], parts["g_idx"], 4, 32, True)
    assert not np.array_equal(wrong.dequantize().T.astype(np.float16), theirs)
    assert not np.array_equal(
        ours.dequantize().T.astype(np.float16), _gptqmodel_dequant(gptqmodel_linear, parts, 4, False)
    )


def test_awq_equals_autoawq(autoawq_packing) -> None:
    parts, values = qw.awq_parts(_w(), 32, None)
    ours = unpack_awq("m", parts["qweight"], parts["qzeros"], parts["scales"], 32)
    iw, iz = autoawq_packing.unpack_awq(torch.from_numpy(parts["qweight"]), torch.from_numpy(parts["qzeros"]), 4)
    iw, iz = autoawq_packing.reverse_awq_order(iw, iz, 4)
    assert np.array_equal(ours.q.T, (iw & 0xF).numpy()) and np.array_equal(ours.zero.T, (iz & 0xF).numpy())
    theirs = autoawq_packing.dequantize_gemm(
        torch.from_numpy(parts["qweight"]), torch.from_numpy(parts["qzeros"]), torch.from_numpy(parts["scales"]), 4, 32
    )
    # AutoAWQ computes in f16: our exact f32 product rounds to its value
    assert np.array_equal(ours.dequantize().T.astype(np.float16), theirs.numpy())
    assert np.array_equal(ours.dequantize(), values)


def test_symmetric_int_with_f16_scales_maps_onto_q4_0_and_q8_0_exactly() -> None:
    for bits, qtype in ((4, Q.Q4_0), (8, Q.Q8_0)):
        parts, values = qw.gptq_parts(_w(), bits, 64, True, False, False, None)
        codes = unpack_gptq("m", parts["qweight"], parts["qzeros"], parts["scales"], None, bits, 64, True)
        resident = repack_int(codes)
        assert resident.qtype == qtype
        assert np.array_equal(dequantize(resident.data, resident.qtype), values)


@pytest.mark.parametrize("bits", [4, 8])
def test_asymmetric_int_keeps_codes_in_own_blocks_exactly(bits) -> None:
    parts, values = qw.compressed_int_parts(_w(), bits, 32, False, False, None)
    codes = unpack_pack_quantized(
        "m",
        parts["weight_packed"],
        parts["weight_scale"],
        parts["weight_zero_point"],
        parts["weight_shape"],
        None,
        bits,
        32,
    )
    resident = repack_int(codes)
    assert resident.qtype == (AgentQuantType.I4G32 if bits == 4 else AgentQuantType.I8G32)
    assert np.array_equal(dequantize(resident.data, resident.qtype), values)


@pytest.mark.parametrize(
    "config,field",
    [
        ({"quant_method": "gptq", "bits": 3}, "bits=3"),
        ({"quant_method": "gptq", "bits": 4, "checkpoint_format": "marlin"}, "checkpoint_format='marlin'"),
        ({"quant_method": "awq", "bits": 4, "version": "gemv"}, "version='gemv'"),
        ({"quant_method": "awq", "bits": 4, "zero_point": False}, "zero_point=False"),
        ({"quant_method": "exl2"}, "quant_method='exl2'"),
        ({"quant_method": "hqq"}, "quant_method='hqq'"),
        ({"quant_method": "fp8", "activation_scheme": "static"}, "activation_scheme='static'"),
        ({"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized"}, "format='nvfp4-pack-quantized'"),
        (
            {
                "quant_method": "compressed-tensors",
                "format": "pack-quantized",
                "config_groups": {
                    "g": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "strategy": "tensor"}}
                },
            },
            "strategy='tensor'",
        ),
    ],
)
def test_unsupported_config_names_field_and_value(config, field) -> None:
    with pytest.raises(QuantConfigError, match=field.replace("[", r"\[").replace("(", r"\(")):
        parse_scheme({"quantization_config": config}, "cfg")


def test_supported_configs_parse() -> None:
    gptq = parse_scheme(
        {"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": -1, "desc_act": True, "sym": False}},
        "cfg",
    )
    assert (gptq.group_size, gptq.act_order, gptq.zero_plus_one, gptq.symmetric) == (None, True, True, False)
    fp8 = parse_scheme({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}, "cfg")
    assert (fp8.strategy, fp8.block) == ("block", (128, 128))
    assert parse_scheme({}, "cfg") is None
