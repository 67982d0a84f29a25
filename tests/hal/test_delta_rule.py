"""The compiled gated delta rule (recurrent.cpp) against a float64 oracle of the recurrence,
and its exactness: the state after row t and o_t have the same bits whether the rows came in
one call or in chunks cut anywhere (each chunk resuming from the state the last one gave),
with one thread or two; a numpy reference of the rule is the default of other backends."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agentkv.hal.recurrent import delta_rule_reference

pytest.importorskip("agentkv.hal.cpu.backend")


@pytest.fixture(scope="module")
def cpu():
    from agentkv.hal.base import BackendUnavailable
    from agentkv.hal.cpu.backend import CpuBackend

    try:
        return CpuBackend()
    except BackendUnavailable as exc:
        pytest.skip(f"CPU kernels unavailable: {exc}")


def inputs(n: int, heads: int = 4, dk: int = 32, dv: int = 40, seed: int = 0):
    """Rows as a gated DeltaNet layer makes them: L2-normed q (scaled) and k, decay in (0, 1),
    beta in (0, 1), and a state the rows continue."""
    rng = np.random.default_rng(seed)

    def normed(scale):
        x = rng.standard_normal((n, heads, dk)).astype(np.float32)
        return (x / np.linalg.norm(x, axis=-1, keepdims=True) * scale).astype(np.float32)

    q, k = normed(dk**-0.5), normed(1.0)
    v = rng.standard_normal((n, heads, dv)).astype(np.float32)
    decay = np.exp(-rng.uniform(0.01, 2.0, (n, heads))).astype(np.float32)
    beta = rng.uniform(0.05, 0.95, (n, heads)).astype(np.float32)
    state = (rng.standard_normal((heads, dk, dv)) * 0.1).astype(np.float32)
    return q, k, v, decay, beta, state


def oracle(q, k, v, decay, beta, state):
    """float64, one row at a time."""
    s = state.astype(np.float64)
    out = np.empty(v.shape, np.float64)
    for t in range(v.shape[0]):
        s = s * decay[t][:, None, None]
        delta = (v[t] - np.einsum("hij,hi->hj", s, k[t])) * beta[t][:, None]
        s = s + k[t][:, :, None] * delta[:, None, :]
        out[t] = np.einsum("hij,hi->hj", s, q[t])
    return out, s


@pytest.mark.parametrize("dv", [8, 40, 128])
def test_kernel_matches_the_float64_oracle(cpu, dv):
    args = inputs(37, dv=dv, seed=dv)
    want_out, want_state = oracle(*args)
    out, states = cpu.delta_rule(*args, [5, 36])
    assert np.abs(out - want_out).max() < 2e-5 * np.abs(want_out).max()
    assert np.abs(states[-1] - want_state).max() < 2e-5 * np.abs(want_state).max()
    ref_out, ref_states = delta_rule_reference(*args, [5, 36])
    assert np.allclose(out, ref_out, rtol=1e-4, atol=1e-5) and np.allclose(states[0], ref_states[0], 1e-4, 1e-5)


@pytest.mark.parametrize("threads", [1, 2])
def test_chunks_and_threads_give_the_same_bits(cpu, threads):
    """Cut anywhere, each chunk from the state the one before ended with: o and every state
    equal the one call's bit for bit. Control: a state perturbed by 1e-4 of one element is seen."""
    q, k, v, decay, beta, state = inputs(29, seed=3)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        whole, whole_states = cpu.delta_rule(q, k, v, decay, beta, state, list(range(29)))
        for cuts in ((1,), (7, 8, 20), tuple(range(1, 29))):
            s, outs = state, []
            for a, b in zip((0, *cuts), (*cuts, 29)):
                o, kept = cpu.delta_rule(q[a:b], k[a:b], v[a:b], decay[a:b], beta[a:b], s, [b - a - 1])
                assert np.array_equal(kept[0], whole_states[b - 1]), (cuts, b)
                s, outs = kept[0], [*outs, o]
            assert np.array_equal(np.concatenate(outs), whole), cuts
        nudged = state.copy()
        nudged.view(np.uint32)[0, 0, 0] ^= 1 << 10  # a relative 1e-4: what a different order could do
        assert not np.array_equal(cpu.delta_rule(q, k, v, decay, beta, nudged, [])[0], whole)
    finally:
        torch.set_num_threads(before)


def test_the_state_argument_is_only_read(cpu):
    args = inputs(5)
    state = args[-1].copy()
    cpu.delta_rule(*args, [4])
    assert np.array_equal(args[-1], state)


def test_bad_shapes_are_refused(cpu):
    q, k, v, decay, beta, state = inputs(3)
    kernels = cpu._kernels  # noqa: SLF001 - the binding's own checks
    t = torch.from_numpy
    with pytest.raises(RuntimeError, match="state has shape"):
        kernels.gated_delta_rule(t(q), t(k), t(v), t(decay), t(beta), t(state[:2]), torch.tensor([], dtype=torch.int64))
    with pytest.raises(RuntimeError, match=r"save\[0\]=3 must ascend"):
        kernels.gated_delta_rule(t(q), t(k), t(v), t(decay), t(beta), t(state), torch.tensor([3]))


@pytest.mark.parametrize("tiled", [False, True])
def test_layer_inputs_and_gated_norm_match_numpy(cpu, tiled):
    """The conv + silu + L2 norms before the rule and the gated RMSNorm after it, compiled,
    against the numpy defaults (other sums and exp: close, not equal), rows invariant to
    how many come in one call."""
    from agentkv.hal.recurrent import DeltaNetSpec, delta_net_inputs_reference, gated_rms_norm_reference

    spec = DeltaNetSpec(2, 4, 16, 24, 4, 1e-6, tiled=tiled)
    rng = np.random.default_rng(7)
    window = rng.standard_normal((3 + 9, spec.conv_dim)).astype(np.float32)
    conv_w = (rng.standard_normal((spec.conv_dim, 4)) * 0.5).astype(np.float32)
    got, want = cpu.delta_net_inputs(window, conv_w, spec), delta_net_inputs_reference(window, conv_w, spec)
    for g, w in zip(got, want):
        assert g.shape == w.shape and np.allclose(g, w, rtol=2e-6, atol=2e-7)
    tail = cpu.delta_net_inputs(window[5:], conv_w, spec)  # rows 5.. alone: the same bits
    assert all(np.array_equal(a[5:], b) for a, b in zip(got, tail))
    out = rng.standard_normal((9, 4, 24)).astype(np.float32)
    z = rng.standard_normal((9, 96)).astype(np.float32)
    norm = rng.uniform(0.5, 1.5, 24).astype(np.float32)
    y = cpu.gated_rms_norm(out, z, norm, 1e-6)
    assert np.allclose(y, gated_rms_norm_reference(out, z, norm, 1e-6), rtol=2e-6, atol=2e-7)
    assert np.array_equal(cpu.gated_rms_norm(out[3:], z[3:], norm, 1e-6), y[3:])
    with pytest.raises(RuntimeError, match="channels"):
        cpu._kernels.delta_net_inputs(
            torch.from_numpy(window[:, 8:].copy()), torch.from_numpy(conv_w.T.copy()), 2, 16, 4, 24, tiled
        )  # noqa: SLF001


def decode_problem(spec, n: int, seed: int):
    """n one-row sequences of a gated DeltaNet layer: rows (qkv, z, decay, beta), the layer's
    small weights, and each sequence's (conv, recurrent) state before its row."""
    from agentkv.hal.recurrent import DeltaNetWeights

    rng = np.random.default_rng(seed)
    f32 = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    rows = (f32(n, spec.conv_dim), f32(n, spec.value_dim), np.exp(-rng.uniform(0.01, 2, (n, 4))).astype(np.float32))
    rows = (*rows, rng.uniform(0.05, 0.95, (n, 4)).astype(np.float32))
    norm = rng.uniform(0.5, 1.5, spec.head_v_dim).astype(np.float32)
    weights = DeltaNetWeights(f32(spec.conv_dim, 4) * 0.5, f32(4), f32(4), norm)
    states = [(f32(3, spec.conv_dim), f32(*spec.recurrent_shape) * 0.1) for _ in range(n)]
    return rows, weights, states


@pytest.mark.parametrize("tiled", [False, True])
def test_fused_decode_has_the_bits_of_the_three_kernels(cpu, isa, threads, tiled):
    """`delta_net_decode` (one call for a decode step's rows) against the default, which runs
    the inputs, the rule and the gated norm kernels one sequence at a time: y, the conv state
    after and the recurrent state (updated in place) equal bit for bit, and a row alone equals
    itself in the batch. Control: one sequence's conv state nudged moves that row only."""
    from agentkv.hal.recurrent import DeltaNetSpec
    from agentkv.hal.recurrent_ops import RecurrentOps

    spec = DeltaNetSpec(2, 4, 16, 24, 4, 1e-6, tiled=tiled)
    rows, weights, states = decode_problem(spec, 3, seed=11)
    copies = lambda: [(c.copy(), r.copy()) for c, r in states]  # noqa: E731
    fused_states, split_states = copies(), copies()
    y, convs = cpu.delta_net_decode(rows, weights, spec, fused_states)
    want_y, want_convs = RecurrentOps.delta_net_decode(cpu, rows, weights, spec, split_states)
    assert np.array_equal(y, want_y) and all(np.array_equal(a, b) for a, b in zip(convs, want_convs))
    assert all(np.array_equal(a[1], b[1]) for a, b in zip(fused_states, split_states))
    assert not np.array_equal(fused_states[0][1], states[0][1])  # the state moved, in place
    alone = copies()[1:2]
    y1, _ = cpu.delta_net_decode(tuple(a[1:2] for a in rows), weights, spec, alone)
    assert np.array_equal(y1[0], y[1]) and np.array_equal(alone[0][1], fused_states[1][1])
    nudged = copies()
    nudged[2][0].view(np.uint32)[0, 5] ^= 1 << 10
    y2, _ = cpu.delta_net_decode(rows, weights, spec, nudged)
    assert np.array_equal(y2[:2], y[:2]) and not np.array_equal(y2[2], y[2])


def test_fused_decode_refuses_bad_states(cpu):
    from agentkv.hal.recurrent import DeltaNetSpec

    spec = DeltaNetSpec(2, 4, 16, 24, 4, 1e-6)
    rows, weights, states = decode_problem(spec, 2, seed=12)
    with pytest.raises(RuntimeError, match=r"recs\[1\] has shape"):
        cpu.delta_net_decode(rows, weights, spec, [states[0], (states[1][0], states[1][1][:2].copy())])
    with pytest.raises(RuntimeError, match="2 conv and 2 recurrent states for 3 rows"):
        cpu.delta_net_decode(tuple(np.concatenate([a, a[:1]]) for a in rows), weights, spec, states)
