"""The expert-dispatch op: a token's output bits are the same alone, in any batch and in any
position (cpu, torch), and every backend agrees with the reference loop within the witness floor."""

from __future__ import annotations

import numpy as np
import pytest

from agentkv.hal.blocks import (
    Experts,
    MoEFFN,
    MoEFFNSpec,
    Projection,
    SharedExpert,
    ffn_op,
    tiled_gate,
)
from agentkv.hal.registry import lookup
from agentkv.witness.ops import COSINE_FLOOR_F32, cosine

D, F, E = 64, 48, 8


def layer(be, seed: int, shared: bool):
    r = np.random.default_rng(seed)
    w = lambda name, *shape, s=0.2: be.upload_weight(name, (s * r.standard_normal(shape)).astype(np.float32), 0, shape)  # noqa: E731
    experts = Experts(
        tuple(w(f"g{e}", F, D) for e in range(E)),
        tuple(w(f"u{e}", F, D) for e in range(E)),
        tuple(w(f"d{e}", D, F) for e in range(E)),
    )
    sh = (
        SharedExpert(Projection((w("sg", F, D), w("su", F, D))), w("sd", D, F), tiled_gate(be, w("sgate", 1, D)))
        if shared
        else None
    )
    return MoEFFN(w("norm", D), w("router", E, D, s=1.0), experts, sh)


@pytest.mark.parametrize("backend", ["cpu", "torch"])
@pytest.mark.parametrize(
    "spec", [MoEFFNSpec(E, 2, False), MoEFFNSpec(E, 3, True), MoEFFNSpec(E, 2, False, softmax_after_topk=True)]
)
def test_token_bits_do_not_depend_on_the_batch(backend, spec):
    be = lookup(backend)
    weights = layer(be, 1, shared=True)
    x = np.random.default_rng(2).standard_normal((37, D)).astype(np.float32)
    run = lambda rows: be.read(ffn_op(weights, be, be.upload(x[rows]), spec))  # noqa: E731
    whole = run(np.arange(37))
    for t in (0, 5, 36):
        assert np.array_equal(run(np.array([t])), whole[t : t + 1])
    perm = np.random.default_rng(3).permutation(37)
    assert np.array_equal(run(perm), whole[perm])
    assert np.array_equal(run(np.arange(20, 30)), whole[20:30])


@pytest.mark.parametrize("backend", ["cpu", "torch"])
@pytest.mark.parametrize("shared", [False, True])
def test_matches_the_reference_loop(backend, shared):
    ref, be = lookup("reference"), lookup(backend)
    spec = MoEFFNSpec(E, 2, True)
    x = np.random.default_rng(4).standard_normal((19, D)).astype(np.float32)
    want = ref.read(ffn_op(layer(ref, 5, shared), ref, ref.upload(x), spec))
    got = be.read(ffn_op(layer(be, 5, shared), be, be.upload(x), spec))
    assert cosine(want, got) >= COSINE_FLOOR_F32


def test_spec_and_weights_are_checked():
    with pytest.raises(ValueError, match="top_k"):
        MoEFFNSpec(4, 5, False)
    be = lookup("reference")
    with pytest.raises(ValueError, match="num_experts=4"):
        ffn_op(layer(be, 1, False), be, be.upload(np.zeros((1, D), np.float32)), MoEFFNSpec(4, 2, False))
