"""gpt-oss's biased experts on the `cpu` backend's compiled dispatch (kernels/moe.cpp with
biases and fused.cpp's clamped SwiGLU): close to the composed per-expert path (which uses
torch's exp), a token's bits never depend on its batch, on the decode path (<= 4 rows per
expert) and the prefill path alike, and bad biases are refused naming the value."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from agentkv.hal.base import BackendUnavailable
from agentkv.hal.biased_moe import BiasedMoEFFN, BiasedMoEFFNSpec, clamped_swiglu_np, grouped_biased_moe
from agentkv.hal.blocks import Experts, ffn_op
from agentkv.hal.registry import lookup

try:
    CPU = lookup("cpu")
except BackendUnavailable as e:
    pytest.skip(f"agentkv CPU kernels unavailable here: {e}", allow_module_level=True)

from tests.hal.test_mxfp4_kernels import random_blocks  # noqa: E402

MXFP4 = int(gguf.GGMLQuantizationType.MXFP4)
D, F, E = 128, 96, 8
SPEC = BiasedMoEFFNSpec(E, 4, limit=7.0)


def layer(seed: int = 0) -> BiasedMoEFFN:
    r = np.random.default_rng(seed)

    def f32(name, *shape, s=0.5):
        return CPU.upload_weight(name, (s * r.standard_normal(shape)).astype(np.float32), 0, shape)

    def mxfp4(name, rows, cols, s):
        # scale bytes near 2^0: gate and up outputs reach past the clamp at 7
        return CPU.upload_weight(name, random_blocks(rows, cols, s, (124, 128)), MXFP4, (rows, cols))

    experts = Experts(
        tuple(mxfp4(f"g{e}", F, D, seed + 10 + e) for e in range(E)),
        tuple(mxfp4(f"u{e}", F, D, seed + 30 + e) for e in range(E)),
        tuple(mxfp4(f"d{e}", D, F, seed + 50 + e) for e in range(E)),
    )
    return BiasedMoEFFN(
        f32("norm", D),
        f32("router", E, D, s=1.0),
        f32("router_bias", E),
        experts,
        tuple(f32(f"bg{e}", F) for e in range(E)),
        tuple(f32(f"bu{e}", F) for e in range(E)),
        tuple(f32(f"bd{e}", D) for e in range(E)),
    )


def inputs(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, D)).astype(np.float32)


def test_the_compiled_path_runs_and_is_close_to_the_composed_one():
    weights = layer()
    x = CPU.upload(inputs(23, 1))
    got = CPU.read(ffn_op(weights, CPU, x, SPEC))
    assert CPU._compiled_experts(weights.experts, SPEC, weights) is not None
    logits = CPU.matmul(x, weights.router, weights.router_bias).raw
    want = CPU.read(grouped_biased_moe(CPU, x, weights, SPEC, logits))
    assert np.isfinite(got).all() and np.abs(want).max() > 1.0
    # the two differ only in exp (fused.cpp's vs torch's), a few ulps of the hidden rows
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_clamped_swiglu_kernel_is_close_to_numpy():
    g = np.linspace(-12, 12, 1001, dtype=np.float32)
    u = np.linspace(9, -9, 1001, dtype=np.float32)
    want = clamped_swiglu_np(g, u, SPEC.alpha, SPEC.limit)
    got = CPU._kernels.clamped_swiglu(torch.from_numpy(g), torch.from_numpy(u), SPEC.alpha, SPEC.limit).numpy()
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)
    assert got.min() == pytest.approx(-6.0 * 7.0, rel=1e-4)  # both clamps bind at the ends


@pytest.mark.parametrize("n", [3, 41], ids=["decode", "prefill"])
def test_token_bits_do_not_depend_on_the_batch(n):
    weights = layer(seed=2)
    x = inputs(n, 3)
    run = lambda rows: CPU.read(ffn_op(weights, CPU, CPU.upload(x[rows]), SPEC))  # noqa: E731
    whole = run(np.arange(n))
    perm = np.random.default_rng(4).permutation(n)
    assert np.array_equal(run(perm), whole[perm])
    for t in (0, n - 1):
        assert np.array_equal(run(np.array([t])), whole[t : t + 1])


def test_control_the_exp_of_the_composed_path_changes_some_bits():
    """The equalities above can fail: the same experts with torch's exp differ in some bit."""
    weights = layer(seed=5)
    x = CPU.upload(inputs(32, 6))
    logits = CPU.matmul(x, weights.router, weights.router_bias).raw
    compiled = CPU.read(ffn_op(weights, CPU, x, SPEC))
    composed = CPU.read(grouped_biased_moe(CPU, x, weights, SPEC, logits))
    assert not np.array_equal(compiled, composed)


def test_bad_biases_are_refused_naming_the_value():
    weights = layer()
    lists = [[w.raw for w in bank] for bank in (weights.experts.gate, weights.experts.up, weights.experts.down)]
    bias = [b.raw.reshape(-1) for b in weights.gate_bias]
    kw = {"qtypes": [MXFP4] * 3, "d": D, "f": F, "act": 2, "alpha": 1.702, "limit": 7.0}
    with pytest.raises(RuntimeError, match=r"up bias\[0\] must be a contiguous float32 \[96\] tensor"):
        CPU._kernels.moe_experts(*lists, biases=[bias, [torch.zeros(D)] * E, bias], **kw)
    with pytest.raises(RuntimeError, match="gate: 3 biases for 8 experts"):
        CPU._kernels.moe_experts(*lists, biases=[bias[:3], bias, bias], **kw)
    with pytest.raises(RuntimeError, match="limit must be > 0, got 0"):
        CPU._kernels.moe_experts(*lists, biases=[bias, bias, bias], **{**kw, "limit": 0.0})
