"""Sampler: exact supports and seeded frequencies, penalties and warpers against HF transformers."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from transformers import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from agentkv.runtime.params import SamplingParams
from agentkv.runtime.sampler import (
    SamplingState,
    logsumexp,
    process_logits,
    raw_logprobs,
    sample,
    token_logprob,
    top_logprobs,
    warp,
)

# 6 tokens, distinct probabilities; softmax = [.0117 .0317 .0861 .2341 .6364 0] roughly
SMALL = np.array([0.0, 1.0, 2.0, 3.0, 4.0, -30.0], dtype=np.float32)


def _state(params: SamplingParams, prompt: list[int] | None = None, seed: int = 0) -> SamplingState:
    """A state whose rng is fixed even when params carry no seed."""
    state = SamplingState.create(params, prompt or [])
    state.rng = np.random.Generator(np.random.PCG64(seed))
    return state


def _draws(logits: np.ndarray, params: SamplingParams, num: int, **kw) -> np.ndarray:
    state = _state(params, seed=1234)
    return np.array([sample(logits, params, state, **kw).token_id for _ in range(num)])


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x.astype(np.float64) - x.max())
    return e / e.sum()


def _assert_frequencies(draws: np.ndarray, expected: np.ndarray) -> None:
    """Each token's frequency within 5 binomial standard deviations of its probability.

    5 sigma makes a correct sampler fail with p < 1e-6 per token; the draws are seeded, so
    the outcome is fixed anyway. Tokens of probability 0 must never appear (exact).
    """
    num = draws.size
    freq = np.bincount(draws, minlength=expected.size) / num
    assert set(np.flatnonzero(freq)) <= set(np.flatnonzero(expected))
    sigma = np.sqrt(expected * (1 - expected) / num)
    assert np.all(np.abs(freq - expected) <= 5 * sigma + 1e-12), (freq, expected)


# ---- greedy -----------------------------------------------------------------------------


def test_greedy_is_argmax_and_lowest_id_on_ties() -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        logits = rng.normal(size=100).astype(np.float32)
        assert sample(logits, SamplingParams(temperature=0), _state(SamplingParams())).token_id == int(
            np.argmax(logits)
        )
    tied = np.array([1.0, 3.0, 0.0, 3.0], dtype=np.float32)
    assert sample(tied, SamplingParams(temperature=0), _state(SamplingParams())).token_id == 1
    assert sample(tied, SamplingParams(top_k=1), _state(SamplingParams())).token_id == 1


def test_greedy_does_not_consume_the_rng() -> None:
    params = SamplingParams(temperature=0.0, seed=3)
    state = SamplingState.create(params, [])
    before = state.rng.bit_generator.state
    sample(SMALL, params, state)
    assert state.rng.bit_generator.state == before


# ---- supports and frequencies -------------------------------------------------------------


@pytest.mark.parametrize("temperature", [1.0, 0.5, 2.0])
def test_temperature_frequencies(temperature: float) -> None:
    params = SamplingParams(temperature=temperature)
    draws = _draws(SMALL, params, 10000)
    _assert_frequencies(draws, _softmax(SMALL / temperature))


def test_tiny_temperature_is_finite_and_picks_the_max() -> None:
    params = SamplingParams(temperature=1e-30)
    assert set(_draws(SMALL, params, 200)) == {4}


def test_top_k_support_and_frequencies() -> None:
    params = SamplingParams(top_k=3)
    draws = _draws(SMALL, params, 10000)
    expected = np.zeros(6)
    expected[[2, 3, 4]] = _softmax(SMALL[[2, 3, 4]])
    assert set(draws) == {2, 3, 4}
    _assert_frequencies(draws, expected)


def test_top_p_support_and_frequencies() -> None:
    # desc probs .636 .234 .086 ...: mass ahead of token 2 is .870 < .9 -> kept; of token 1 .956
    params = SamplingParams(top_p=0.9)
    draws = _draws(SMALL, params, 10000)
    expected = np.zeros(6)
    expected[[2, 3, 4]] = _softmax(SMALL[[2, 3, 4]])
    assert set(draws) == {2, 3, 4}
    _assert_frequencies(draws, expected)


def test_min_p_support_and_frequencies() -> None:
    # p_i / p_max = e^(x_i - 4): token 2 -> .135, token 1 -> .0498; min_p .1 keeps 2, 3, 4
    params = SamplingParams(min_p=0.1)
    draws = _draws(SMALL, params, 10000)
    expected = np.zeros(6)
    expected[[2, 3, 4]] = _softmax(SMALL[[2, 3, 4]])
    assert set(draws) == {2, 3, 4}
    _assert_frequencies(draws, expected)


def test_top_p_keeps_ties_by_lower_id() -> None:
    logits = np.zeros(4, dtype=np.float32)  # 4 equal tokens, .25 each: top_p .5 keeps two
    z = warp(logits, SamplingParams(top_p=0.5))
    assert np.isfinite(z).tolist() == [True, True, False, False]


def test_top_k_larger_than_vocab_keeps_all() -> None:
    z = warp(SMALL, SamplingParams(top_k=1000))
    assert np.isfinite(z).all()


# ---- warpers against HF transformers --------------------------------------------------------


def _hf_mask(processors: list, logits: np.ndarray) -> np.ndarray:
    scores = torch.from_numpy(logits.copy())[None, :]
    ids = torch.zeros((1, 1), dtype=torch.long)
    for proc in processors:
        scores = proc(ids, scores)
    return torch.isfinite(scores[0]).numpy()


@pytest.mark.parametrize("seed", range(8))
def test_warpers_match_hf(seed: int) -> None:
    rng = np.random.default_rng(seed)
    logits = (rng.normal(size=64) * 3).astype(np.float32)
    cases = [
        (SamplingParams(top_k=5), [TopKLogitsWarper(5)]),
        (SamplingParams(top_p=0.7), [TopPLogitsWarper(0.7)]),
        (SamplingParams(min_p=0.05), [MinPLogitsWarper(0.05)]),
        (
            SamplingParams(temperature=0.7, top_k=20, top_p=0.8, min_p=0.02),
            [TemperatureLogitsWarper(0.7), TopKLogitsWarper(20), TopPLogitsWarper(0.8), MinPLogitsWarper(0.02)],
        ),
    ]
    for params, processors in cases:
        ours = np.isfinite(warp(logits, params))
        theirs = _hf_mask(processors, logits)
        assert ours.tolist() == theirs.tolist(), params
        assert 0 < ours.sum() < 64, "case must actually filter for the test to mean anything"


@pytest.mark.parametrize("scale, top_p", [(0.3, 0.95), (0.3, 0.2), (4.0, 0.9), (1.0, 0.5)])
def test_top_p_on_a_large_vocab_matches_hf(scale: float, top_p: float) -> None:
    """Vocab 5000 > the first 256 candidates: flat rows make the candidate set grow (or fall
    back to a full sort), peaked rows stop at the first partition."""
    logits = (np.random.default_rng(7).normal(size=5000) * scale).astype(np.float32)
    ours = np.isfinite(warp(logits, SamplingParams(top_p=top_p)))
    assert ours.tolist() == _hf_mask([TopPLogitsWarper(top_p)], logits).tolist()
    assert 0 < ours.sum() < 5000


def test_top_k_then_top_p_on_a_large_vocab_matches_hf() -> None:
    logits = (np.random.default_rng(8).normal(size=5000) * 0.5).astype(np.float32)
    ours = np.isfinite(warp(logits, SamplingParams(top_k=300, top_p=0.8)))
    theirs = _hf_mask([TopKLogitsWarper(300), TopPLogitsWarper(0.8)], logits)
    assert ours.tolist() == theirs.tolist()
    assert 0 < ours.sum() < 300


def test_temperature_matches_hf_distribution() -> None:
    logits = np.random.default_rng(5).normal(size=64).astype(np.float32)
    ours = _softmax(warp(logits, SamplingParams(temperature=0.3)))
    scores = TemperatureLogitsWarper(0.3)(None, torch.from_numpy(logits)[None, :])
    theirs = torch.softmax(scores[0].double(), dim=-1).numpy()
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-7)  # f32 division vs f64 scaling


# ---- penalties ---------------------------------------------------------------------------------


def test_repetition_penalty_hand_computed_and_hf() -> None:
    logits = np.array([2.0, -1.0, 0.5, -3.0, 4.0, 0.0], dtype=np.float32)
    params = SamplingParams(repetition_penalty=2.0)
    state = _state(params, prompt=[0, 1, 1])
    state.append(3)
    state.append(5)
    out = process_logits(logits, params, state)
    assert out.tolist() == [1.0, -2.0, 0.5, -6.0, 4.0, 0.0]
    ids = torch.tensor([[0, 1, 1, 3, 5]])
    hf = RepetitionPenaltyLogitsProcessor(2.0)(ids, torch.from_numpy(logits.copy())[None, :])
    assert out.tolist() == hf[0].tolist()


@pytest.mark.parametrize("penalty", [1.3, 0.7])
def test_repetition_penalty_matches_hf_on_random_rows(penalty: float) -> None:
    rng = np.random.default_rng(11)
    logits = rng.normal(size=200).astype(np.float32)
    prompt = rng.integers(0, 200, size=40).tolist()
    output = rng.integers(0, 200, size=10).tolist()
    params = SamplingParams(repetition_penalty=penalty)
    state = _state(params, prompt=prompt)
    for t in output:
        state.append(t)
    ours = process_logits(logits, params, state)
    ids = torch.tensor([prompt + output])
    hf = RepetitionPenaltyLogitsProcessor(penalty)(ids, torch.from_numpy(logits.copy())[None, :])
    np.testing.assert_array_equal(ours, hf[0].numpy())
    assert not np.array_equal(ours, logits)


def test_presence_and_frequency_penalties_hand_computed() -> None:
    logits = np.array([1.0, 1.0, 1.0, 1.0], dtype=np.float32)
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)
    state = _state(params, prompt=[3, 3, 3])  # the prompt does not count for OpenAI penalties
    for t in (1, 2, 2, 2):
        state.append(t)
    out = process_logits(logits, params, state)
    assert out.tolist() == [1.0, 1.0 - 0.25 - 0.5, 1.0 - 0.75 - 0.5, 1.0]


def test_penalty_order_bias_then_repetition_then_presence() -> None:
    logits = np.array([1.0, 2.0], dtype=np.float32)
    params = SamplingParams(logit_bias={0: 3.0}, repetition_penalty=2.0, presence_penalty=1.0)
    state = _state(params)
    state.append(0)
    # bias: 4.0 ; repetition: 4/2 = 2.0 ; presence: 2 - 1 = 1.0
    assert process_logits(logits, params, state).tolist() == [1.0, 2.0]


# ---- logit bias and allowed mask -------------------------------------------------------------


def test_logit_bias_steers_and_bans() -> None:
    params = SamplingParams(logit_bias={0: 100.0})
    assert set(_draws(SMALL, params, 100)) == {0}
    banned = SamplingParams(logit_bias={4: -100.0, 3: -100.0})
    assert not {3, 4} & set(_draws(SMALL, banned, 2000))


def test_logit_bias_outside_vocab_is_value_error() -> None:
    params = SamplingParams(logit_bias={6: 1.0})
    with pytest.raises(ValueError, match=r"logit_bias token id 6 .*\[0, 5\]"):
        sample(SMALL, params, _state(params))


def test_allowed_mask_is_respected() -> None:
    allowed = np.array([True, True, False, False, False, True])
    draws = _draws(SMALL, SamplingParams(), 5000, allowed=allowed)
    assert set(draws) == {0, 1}  # token 5 is allowed but has probability ~1e-13
    greedy = sample(SMALL, SamplingParams(temperature=0), _state(SamplingParams()), allowed)
    assert greedy.token_id == 1


def test_everything_masked_raises() -> None:
    allowed = np.zeros(6, dtype=bool)
    for params in (SamplingParams(), SamplingParams(temperature=0)):
        with pytest.raises(RuntimeError, match="every token is masked"):
            sample(SMALL, params, _state(params), allowed)


def test_allowed_mask_shape_checked() -> None:
    with pytest.raises(ValueError, match="allowed mask"):
        sample(SMALL, SamplingParams(), _state(SamplingParams()), np.ones(5, dtype=bool))


def test_never_samples_a_masked_token_when_only_one_survives() -> None:
    allowed = np.array([False, False, False, False, False, True])  # the -30 logit
    assert set(_draws(SMALL, SamplingParams(top_p=0.1, min_p=0.9), 100, allowed=allowed)) == {5}


# ---- seeds -------------------------------------------------------------------------------------


def _run(params: SamplingParams, steps: int = 50, index: int = 0) -> list[int]:
    rng = np.random.default_rng(99)
    rows = (rng.normal(size=(steps, 32)) * 2).astype(np.float32)
    state = SamplingState.create(params, [1, 2, 3], index=index)
    out = []
    for row in rows:
        token_id = sample(row, params, state).token_id
        state.append(token_id)
        out.append(token_id)
    return out


def test_same_seed_same_tokens_different_seed_different() -> None:
    params = SamplingParams(seed=42, repetition_penalty=1.1, top_p=0.95)
    first = _run(params)
    assert first == _run(params)
    assert first != _run(SamplingParams(seed=43, repetition_penalty=1.1, top_p=0.95))
    assert _run(params, index=1) == _run(SamplingParams(seed=43, repetition_penalty=1.1, top_p=0.95))


def test_seeded_draw_is_pcg64_of_seed_and_position() -> None:
    """Seeded draws are keyed by (seed + index, position), not by a running stream, so a
    request's tokens do not depend on how many rows a step verified (speculative decoding)."""
    state = SamplingState.create(SamplingParams(seed=7), [5, 6])
    assert state.generator().random() == np.random.Generator(np.random.PCG64([7, 2])).random()
    state.append(9)
    assert state.generator().random() == np.random.Generator(np.random.PCG64([7, 3])).random()
    negative = SamplingState.create(SamplingParams(seed=-1), [], index=1)
    assert negative.generator().random() == np.random.Generator(np.random.PCG64([0, 0])).random()


def test_seeded_draw_does_not_depend_on_earlier_draws() -> None:
    params = SamplingParams(seed=11)
    state = SamplingState.create(params, [1])
    first = sample(SMALL, params, state).token_id
    for _ in range(5):  # drawing again at the same position gives the same token
        assert sample(SMALL, params, state).token_id == first


def test_unseeded_states_differ() -> None:
    a = SamplingState.create(SamplingParams(), [])
    b = SamplingState.create(SamplingParams(), [])
    assert a.rng.random() != b.rng.random()


# ---- logprobs ----------------------------------------------------------------------------------


def test_logprobs_are_raw_log_softmax() -> None:
    logits = (np.random.default_rng(4).normal(size=500) * 4).astype(np.float32)
    params = SamplingParams(logprobs=5, temperature=0.5, repetition_penalty=1.5, logit_bias={0: 50.0})
    state = _state(params, prompt=list(range(100)))
    result = sample(logits, params, state)
    expected = torch.log_softmax(torch.from_numpy(logits).double(), dim=-1).numpy()
    assert math.isclose(result.logprob, expected[result.token_id], abs_tol=1e-6)
    assert result.token_id == 0  # the bias won, but the reported logprob is the raw one
    best = np.argsort(-expected, kind="stable")[:5]
    assert [t for t, _ in result.top_logprobs] == best.tolist()
    np.testing.assert_allclose([lp for _, lp in result.top_logprobs], expected[best], rtol=0, atol=1e-6)
    np.testing.assert_allclose(raw_logprobs(logits), expected, rtol=0, atol=1e-12)
    lse = logsumexp(logits)
    assert token_logprob(logits[7], lse) == float(np.float32(expected[7]))
    assert top_logprobs(logits, lse, 5) == result.top_logprobs


def test_top_logprobs_ties_by_lower_id_and_counts() -> None:
    logits = np.array([0.0, 2.0, 1.0, 2.0, 1.0], dtype=np.float32)
    params = SamplingParams(temperature=0, logprobs=3)
    result = sample(logits, params, _state(params))
    assert [t for t, _ in result.top_logprobs] == [1, 3, 2]
    assert result.top_logprobs[0][1] == result.top_logprobs[1][1]
    for n, size in ((None, 0), (0, 0), (20, 5)):
        p = SamplingParams(temperature=0, logprobs=n)
        assert len(sample(logits, p, _state(p)).top_logprobs) == size


# ---- bad rows ----------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nan_or_posinf_row_is_a_bug(bad: float) -> None:
    logits = SMALL.copy()
    logits[2] = bad
    with pytest.raises(RuntimeError, match="NaN or \\+inf"):
        sample(logits, SamplingParams(), _state(SamplingParams()))


def test_input_row_is_not_modified() -> None:
    logits = SMALL.copy()
    params = SamplingParams(logit_bias={1: 5.0}, repetition_penalty=2.0, top_k=2)
    sample(logits, params, _state(params, prompt=[0, 1, 2]))
    assert logits.tobytes() == SMALL.tobytes()


def test_rejects_2d_rows() -> None:
    with pytest.raises(ValueError, match="one logits row"):
        sample(SMALL[None, :], SamplingParams(), _state(SamplingParams()))
