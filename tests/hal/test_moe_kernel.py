"""The compiled expert dispatch of the `cpu` backend (kernels/moe.cpp): its bits equal the
per-expert composed path (`grouped_moe` on the same backend) for quantized and f32 experts,
a token's bits never depend on its batch, and bad input is refused naming the value."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agentkv.hal.base import BackendUnavailable
from agentkv.hal.blocks import Experts, MoEFFN, MoEFFNSpec, Projection, SharedExpert, ffn_op, tiled_gate
from agentkv.hal.kernels import row_bytes
from agentkv.hal.portable.moe import grouped_moe
from agentkv.hal.registry import lookup

try:
    CPU = lookup("cpu")
except BackendUnavailable as e:
    pytest.skip(f"agentkv CPU kernels unavailable here: {e}", allow_module_level=True)

from tests.hal.test_kernels import QTYPES, random_quant  # noqa: E402

D, F, E = 256, 256, 8


def expert_weight(be, name: str, qtype: str, rows: int, cols: int, seed: int):
    if qtype == "MXFP4":
        from tests.hal.test_mxfp4_kernels import MXFP4, random_blocks

        return be.upload_weight(name, random_blocks(rows, cols, seed, scales=(112, 128)), MXFP4, (rows, cols))
    if qtype == "F32":
        data = (0.1 * np.random.default_rng(seed).standard_normal((rows, cols))).astype(np.float32)
        return be.upload_weight(name, data, 0, (rows, cols))
    return be.upload_weight(name, random_quant(qtype, rows, cols, seed), QTYPES[qtype], (rows, cols))


def layer(be, qtypes: tuple[str, str, str], shared: bool, seed: int = 0) -> MoEFFN:
    r = np.random.default_rng(seed)

    def f32(name, *shape, s=0.1):
        return be.upload_weight(name, (s * r.standard_normal(shape)).astype(np.float32), 0, shape)

    gq, uq, dq = qtypes
    experts = Experts(
        tuple(expert_weight(be, f"g{e}", gq, F, D, seed + 10 + e) for e in range(E)),
        tuple(expert_weight(be, f"u{e}", uq, F, D, seed + 30 + e) for e in range(E)),
        tuple(expert_weight(be, f"d{e}", dq, D, F, seed + 50 + e) for e in range(E)),
    )
    sh = None
    if shared:
        gate_up = Projection((f32("sg", F, D), f32("su", F, D)))
        sh = SharedExpert(gate_up, f32("sd", D, F), tiled_gate(be, f32("sgate", 1, D)))
    return MoEFFN(f32("norm", D), f32("router", E, D, s=1.0), experts, sh)


QTYPE_MIXES = [("Q8_0",) * 3, ("Q4_0",) * 3, ("Q4_K", "Q4_K", "Q6_K"), ("F32",) * 3]


@pytest.mark.parametrize("qtypes", QTYPE_MIXES, ids=lambda q: "-".join(q))
@pytest.mark.parametrize("spec", [MoEFFNSpec(E, 2, False), MoEFFNSpec(E, 3, True, act="gelu_tanh")])
def test_bits_equal_the_per_expert_path(qtypes, spec):
    weights = layer(CPU, qtypes, shared=True)
    x = np.random.default_rng(1).standard_normal((23, D)).astype(np.float32)
    # 23 rows: per-expert matmuls; 1 and 3 rows (<= 4 per expert): on AVX-512 every active
    # expert's columns in one parallel loop (decode_experts), which must keep the same bits
    for rows in (slice(0, 23), slice(4, 5), slice(0, 3)):
        xs = CPU.upload(x[rows])
        got = CPU.read(ffn_op(weights, CPU, xs, spec))
        want = CPU.read(grouped_moe(CPU, xs, weights, spec))
        assert np.array_equal(got, want), f"{qtypes} rows {rows}: max diff {np.abs(got - want).max()}"
    assert CPU._compiled_experts(weights.experts, spec) is not None  # the compiled path ran


@pytest.mark.parametrize("qtypes", [("MXFP4",) * 3, ("Q4_K", "Q4_K", "Q6_K"), ("Q5_1",) * 3], ids="-".join)
def test_int8_mode_bits_equal_the_per_expert_path(qtypes):
    """In the backend's int8 mode the compiled experts take the int8 kernels exactly as
    `backend.matmul` does on the composed path, at 23 rows and on the decode loop (1 and 3
    rows); the control: int8 outputs are not f32 mode's, save for Q5_1 (no int8 kernel), whose
    experts keep f32 activations in both."""
    int8 = lookup("cpu", activation_dtype="int8")
    weights, spec = layer(int8, qtypes, shared=True), MoEFFNSpec(E, 2, True)
    f32_weights = layer(CPU, qtypes, shared=True)  # the same values, held as the f32 backend holds them
    x = np.random.default_rng(7).standard_normal((23, D)).astype(np.float32)
    for rows in (slice(0, 23), slice(4, 5), slice(0, 3)):
        xs = int8.upload(x[rows])
        got = int8.read(ffn_op(weights, int8, xs, spec))
        assert np.array_equal(got, int8.read(grouped_moe(int8, xs, weights, spec))), rows
        f32 = CPU.read(ffn_op(f32_weights, CPU, CPU.upload(x[rows]), spec))
        assert np.array_equal(got, f32) == (qtypes[0] == "Q5_1"), rows
        assert np.abs(got - f32).max() <= 0.05 * np.abs(f32).max()  # int8 rounding, not a wrong expert
    assert int8._compiled_experts(weights.experts, spec) is not None


@pytest.mark.parametrize("qtypes", QTYPE_MIXES[:3], ids=lambda q: "-".join(q))
def test_token_bits_do_not_depend_on_the_batch(qtypes):
    weights, spec = layer(CPU, qtypes, shared=False, seed=2), MoEFFNSpec(E, 2, True)
    x = np.random.default_rng(3).standard_normal((41, D)).astype(np.float32)
    run = lambda rows: CPU.read(ffn_op(weights, CPU, CPU.upload(x[rows]), spec))  # noqa: E731
    whole = run(np.arange(41))
    perm = np.random.default_rng(4).permutation(41)
    assert np.array_equal(run(perm), whole[perm])
    for t in (0, 17, 40):
        assert np.array_equal(run(np.array([t])), whole[t : t + 1])
    assert np.array_equal(run(np.arange(8, 14)), whole[8:14])


def test_control_a_changed_rank_order_changes_the_bits():
    """The equality above can fail: summing the same expert outputs in reverse rank order
    (a different fixed order) gives different bits on some token."""
    weights, spec = layer(CPU, ("Q8_0",) * 3, shared=False, seed=5), MoEFFNSpec(E, 3, True)
    x = CPU.upload(np.random.default_rng(6).standard_normal((32, D)).astype(np.float32))
    from agentkv.hal.portable.moe import route

    chosen, probs = route(CPU.matmul(x, weights.router).raw, spec)
    compiled = CPU._compiled_experts(weights.experts, spec)
    forward = compiled.run(x.raw, chosen.contiguous(), probs.contiguous())
    backward = compiled.run(x.raw, chosen.flip(1).contiguous(), probs.flip(1).contiguous())
    assert torch.allclose(forward, backward, rtol=1e-5, atol=1e-6)
    assert not torch.equal(forward, backward)


def test_bad_input_is_refused_naming_the_value():
    weights, spec = layer(CPU, ("Q8_0",) * 3, shared=False), MoEFFNSpec(E, 2, False)
    compiled = CPU._compiled_experts(weights.experts, spec)
    x = torch.zeros((2, D))
    probs = torch.ones((2, 2))
    with pytest.raises(RuntimeError, match=r"chosen.flatten\(\)\[3\]=8 out of range \[0, 8\)"):
        compiled.run(x, torch.tensor([[0, 1], [2, 8]]), probs)
    with pytest.raises(RuntimeError, match="x has 128 columns, the experts take d=256"):
        compiled.run(torch.zeros((2, 128)), torch.zeros((2, 2), dtype=torch.int64), probs)
    gate = [w.raw for w in weights.experts.gate]
    with pytest.raises(RuntimeError, match="act 7 unknown"):
        CPU._kernels.moe_experts(gate, gate, gate, qtypes=[8, 8, 8], d=D, f=F, act=7)
    with pytest.raises(RuntimeError, match=rf"gate\[0\] must be {2 * F * row_bytes(8, D)} uint8 bytes \({2 * F} rows"):
        CPU._kernels.moe_experts(gate, gate, gate, qtypes=[8, 8, 8], d=D, f=2 * F, act=0)


def test_unsupported_activation_takes_the_composed_path():
    weights, spec = layer(CPU, ("Q8_0",) * 3, shared=False), MoEFFNSpec(E, 2, False, act="gelu")
    assert CPU._compiled_experts(weights.experts, spec) is None
    x = CPU.upload(np.random.default_rng(7).standard_normal((5, D)).astype(np.float32))
    assert np.array_equal(CPU.read(ffn_op(weights, CPU, x, spec)), CPU.read(grouped_moe(CPU, x, weights, spec)))
