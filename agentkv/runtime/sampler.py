"""Host-side sampling of one logits row: bias, mask, penalties, warpers, seeded draw, raw logprobs.

The engine calls `sample` once per sequence per step, after the logits read-back fence, with
a float32 row `[vocab]`. Processing order is vLLM's:

    raw logits ──► logprobs (log_softmax of the RAW row, float64)
        │
        ▼ copy (float32)
    logit_bias ─► allowed mask ─► repetition penalty ─► presence/frequency penalties
        │
        ├── greedy: argmax (lowest id on ties)
        ▼
    temperature ─► top-k ─► top-p ─► min-p ─► inverse-CDF draw (float64 cumsum, one uniform)

Everything after the copy is deterministic given the draw's generator. A seeded request's
draw for the token at position p comes from PCG64((seed + index, p)), keyed by position
rather than by how many draws came before, so it replays token for token however its
tokens were produced (one per step, or several per speculative verification step).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from agentkv.runtime.params import SamplingParams

_U64 = 2**64
_TOP_P_FIRST_CANDIDATES = 256
_F32_MAX = np.float32(np.finfo(np.float32).max)


class SampleResult(NamedTuple):
    token_id: int
    logprob: float | None  # raw-model logprob of token_id; None unless params.logprobs is set
    top_logprobs: list[tuple[int, float]]  # params.logprobs best (id, logprob), desc, ties by id
    token_logits: tuple[float, ...] = ()  # the raw logits of params.logit_token_ids, in that order


@dataclass(slots=True)
class SamplingState:
    """Per-sequence sampling state; the caller appends each token. Unseeded, `sample`
    consumes `rng`; seeded, each draw gets its own generator keyed by (seed, position)."""

    prompt_ids: np.ndarray  # [prompt_len] int64
    output_ids: list[int] = field(default_factory=list)
    rng: np.random.Generator = field(default_factory=lambda: np.random.Generator(np.random.PCG64()))
    seed: int | None = None  # (params.seed + index) mod 2**64; None = draw from `rng`

    @classmethod
    def create(cls, params: SamplingParams, prompt_ids: Sequence[int] | np.ndarray, index: int = 0) -> SamplingState:
        """New state for sequence `index` of a request (0..n-1).

        With a seed, sequence `index` draws with seed + index (vLLM gives the n children
        seed + i), keyed by position (see `generator`); without one `rng` is seeded from OS
        entropy.
        """
        ids = np.asarray(prompt_ids, dtype=np.int64).reshape(-1)
        seed = None if params.seed is None else (params.seed + index) % _U64
        return cls(prompt_ids=ids, output_ids=[], seed=seed)

    def generator(self) -> np.random.Generator:
        """The generator of the next draw: for a seeded sequence a fresh PCG64 keyed by
        (seed, position of the token being drawn), so the draw does not depend on how many
        came before; unseeded, the state's one `rng`."""
        if self.seed is None:
            return self.rng
        position = len(self.prompt_ids) + len(self.output_ids)
        return np.random.Generator(np.random.PCG64([self.seed, position]))

    def append(self, token_id: int) -> None:
        """Record a generated token (mutates); penalties see it from the next step on."""
        self.output_ids.append(int(token_id))


def sample(
    logits: np.ndarray, params: SamplingParams, state: SamplingState, allowed: np.ndarray | None = None
) -> SampleResult:
    """Choose the next token from one logits row `[vocab]`.

    Does not modify `logits`; draws once (unless greedy) from `state.generator()`; does not append
    the token to `state` (the engine does, after its stop checks). `allowed` is a bool mask
    `[vocab]` from structured output (False = forbidden). Raises RuntimeError when every
    token is masked, and when the row holds NaN or +inf (a model bug).
    """
    raw = _check_row(logits)
    processed = process_logits(raw, params, state, allowed)
    if params.greedy:  # the max is -inf exactly when every token is
        token_id = int(np.argmax(processed))
        finite = bool(np.isfinite(processed[token_id]))
    else:
        finite = bool(np.isfinite(processed).any())
    if not finite:
        raise RuntimeError(
            "every token is masked (-inf) after logit_bias, allowed mask and penalties: nothing can be sampled"
        )
    if not params.greedy:
        token_id = _draw(warp(processed, params), state.generator())
    if not np.isfinite(processed[token_id]):
        raise RuntimeError(f"sampled token {token_id} has a -inf logit: sampler bug")
    picked = tuple(float(raw[i]) for i in params.logit_token_ids)
    if params.logprobs is None:  # a float64 pass over the vocab (262k for Gemma) saved per token
        return SampleResult(token_id, None, [], picked)
    lse = logsumexp(raw)
    return SampleResult(token_id, token_logprob(raw[token_id], lse), top_logprobs(raw, lse, params.logprobs), picked)


def process_logits(
    logits: np.ndarray, params: SamplingParams, state: SamplingState, allowed: np.ndarray | None = None
) -> np.ndarray:
    """Bias, mask and penalties on a float32 copy of `logits` `[vocab]`; returns the copy."""
    out = np.array(logits, dtype=np.float32, copy=True)
    if params.logit_bias:
        apply_logit_bias(out, params.logit_bias)
    if allowed is not None:
        apply_allowed(out, allowed)
    if params.repetition_penalty != 1.0:
        seen = np.concatenate([state.prompt_ids, np.asarray(state.output_ids, dtype=np.int64)])
        apply_repetition_penalty(out, seen, params.repetition_penalty)
    if params.presence_penalty != 0.0 or params.frequency_penalty != 0.0:
        apply_presence_frequency(out, state.output_ids, params.presence_penalty, params.frequency_penalty)
    return out


def apply_logit_bias(logits: np.ndarray, bias: Sequence[tuple[int, float]]) -> None:
    """Add each (token_id, bias) in place (float32). A token id outside the vocab is a ValueError."""
    vocab = logits.shape[0]
    for token_id, value in bias:
        if token_id >= vocab:
            raise ValueError(
                f"logit_bias token id {token_id} is out of range: allowed "
                f"[0, {vocab - 1}] for this model's vocab of {vocab}"
            )
        logits[token_id] += np.float32(value)


def apply_allowed(logits: np.ndarray, allowed: np.ndarray) -> None:
    """Set logits of tokens whose `allowed` entry is False to -inf, in place."""
    if allowed.dtype != np.bool_ or allowed.shape != logits.shape:
        raise ValueError(f"allowed mask must be bool {logits.shape}, got {allowed.dtype} {allowed.shape}")
    logits[~allowed] = -np.inf


def apply_repetition_penalty(logits: np.ndarray, seen_ids: np.ndarray, penalty: float) -> None:
    """HF/vLLM repetition penalty in place: each seen token's logit is divided by `penalty`
    when positive and multiplied by it otherwise (once per token, however often seen).
    Never makes a finite logit infinite: results past the float32 range saturate."""
    ids = np.unique(seen_ids)
    if ids.size == 0:
        return
    p = np.float32(penalty)
    score = logits[ids]
    with np.errstate(over="ignore"):  # an overflow is clamped just below
        scaled = np.where(score < 0, score * p, score / p)
    # A finite logit stays finite (a huge one saturates at the float32 limit, keeping its
    # order among the seen tokens); a masked -inf stays -inf.
    logits[ids] = np.where(np.isfinite(score), np.clip(scaled, -_F32_MAX, _F32_MAX), score)


def apply_presence_frequency(logits: np.ndarray, output_ids: Sequence[int], presence: float, frequency: float) -> None:
    """OpenAI penalties in place over generated tokens only:
    logit -= frequency * count(token) ; logit -= presence * (count(token) > 0)."""
    if len(output_ids) == 0:
        return
    counts = np.bincount(np.asarray(output_ids, dtype=np.int64), minlength=logits.shape[0])
    counts = counts[: logits.shape[0]].astype(np.float32)
    logits -= np.float32(frequency) * counts
    logits -= np.float32(presence) * (counts > 0).astype(np.float32)


def warp(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Temperature, top-k, top-p, min-p; returns float64 scores with the row max at 0 and
    removed tokens at -inf. Subtracting the max first keeps tiny temperatures finite."""
    z = logits.astype(np.float64)
    z -= z.max()
    z /= params.temperature
    if params.top_k_enabled and params.top_k < z.shape[0]:
        apply_top_k(z, params.top_k)
    if params.top_p < 1.0:
        apply_top_p(z, params.top_p)
    if params.min_p > 0.0:
        apply_min_p(z, params.min_p)
    return z


def apply_top_k(z: np.ndarray, k: int) -> None:
    """Keep tokens whose score is >= the k-th largest (ties at the boundary all stay), in place."""
    kth = np.partition(z, z.shape[0] - k)[z.shape[0] - k]
    z[z < kth] = -np.inf


def apply_top_p(z: np.ndarray, top_p: float) -> None:
    """Nucleus: keep the most probable tokens (ties by lower id) until their mass reaches
    `top_p`; a token stays iff the mass strictly ahead of it is < top_p. In place.

    Only the best `num` tokens are sorted, `num` growing 4x until they hold `top_p` of the
    mass: every token outside them then has at least that much mass ahead of it, so is cut.
    """
    alive = np.flatnonzero(z > -np.inf)  # after top-k most of the row is already cut
    scores = z[alive]
    probs = _softmax(scores)
    size = alive.shape[0]
    num = _TOP_P_FIRST_CANDIDATES
    while num < size:
        kth = np.partition(scores, size - num)[size - num]
        candidates = np.flatnonzero(scores >= kth)  # ties with the k-th all come along
        if probs[candidates].sum() >= top_p:
            break
        num *= 4
    else:
        candidates = np.arange(size)
    order = candidates[np.lexsort((alive[candidates], -scores[candidates]))]
    ahead = np.concatenate(([0.0], np.cumsum(probs[order])[:-1]))
    removed = np.ones(z.shape[0], dtype=bool)
    removed[alive[order[ahead < top_p]]] = False
    z[removed] = -np.inf


def apply_min_p(z: np.ndarray, min_p: float) -> None:
    """Remove tokens whose probability is < min_p * (the top probability), in place."""
    probs = _softmax(z)
    z[probs < min_p * probs.max()] = -np.inf


def raw_logprobs(logits: np.ndarray) -> np.ndarray:
    """log_softmax of the raw row in float64 `[vocab]`."""
    return logits.astype(np.float64) - logsumexp(logits)


def top_logprobs(logits: np.ndarray, lse: float, n: int) -> list[tuple[int, float]]:
    """The `n` best (token_id, logprob) of the raw row whose logsumexp is `lse`; sorted desc,
    ties by lower id. log_softmax is monotone, so the best logits are the best logprobs."""
    vocab = logits.shape[0]
    n = min(n, vocab)
    if n <= 0:
        return []
    kth = np.partition(logits, vocab - n)[vocab - n]
    candidates = np.flatnonzero(logits >= kth)
    best = candidates[np.lexsort((candidates, -logits[candidates]))][:n]
    return [(int(i), token_logprob(logits[i], lse)) for i in best]


def logsumexp(logits: np.ndarray) -> float:
    """float64 logsumexp of a row (max-shifted, so no overflow)."""
    m = float(logits.max())
    return m + float(np.log(np.exp(logits.astype(np.float64) - m).sum()))


def token_logprob(logit: np.floating, lse: float) -> float:
    """float64 logit - lse, cast to float32 and back (the precision a client sees)."""
    return float(np.float32(np.float64(logit) - lse))


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


def _draw(z: np.ndarray, rng: np.random.Generator) -> int:
    """Inverse-CDF draw with one uniform on a float64 cumsum; never lands on a zero weight."""
    weights = np.exp(z)
    cdf = np.cumsum(weights)
    idx = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    if idx >= weights.shape[0]:  # u * total rounded up to total
        idx = int(np.flatnonzero(weights)[-1])
    return idx


def check_logits(logits: np.ndarray) -> np.ndarray:
    """Raise RuntimeError when logits rows (`[vocab]` or `[n, vocab]`) hold NaN or +inf (a
    model or backend bug: nothing can be sampled or scored from them); -inf is allowed."""
    if logits.size == 0:
        return logits
    top = logits.max()  # NaN if any entry is NaN: one pass instead of two
    if np.isnan(top) or np.isposinf(top):
        raise RuntimeError("logits row contains NaN or +inf: model or backend bug")
    return logits


def _check_row(logits: np.ndarray) -> np.ndarray:
    if logits.ndim != 1 or logits.shape[0] == 0:
        raise ValueError(f"sample expects one logits row [vocab], got shape {logits.shape}")
    return check_logits(logits)
