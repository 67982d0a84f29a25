"""Per-request sampling parameters: OpenAI/vLLM field names and ranges, validated once at the boundary."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

MAX_LOGPROBS = 20
LOGIT_BIAS_LIMIT = 100.0
PENALTY_LIMIT = 2.0
# vLLM and HF accept any repetition_penalty > 0, but a seen token's logit is divided by it:
# 1e-40 turns every seen logit into +inf. [1e-3, 1e3] scales a logit by at most 1000 either
# way, far past any useful setting (HF suggests ~1.2), and the sampler clamps what is left.
REPETITION_PENALTY_MIN, REPETITION_PENALTY_MAX = 1e-3, 1e3
# OpenAI allows temperature in [0, 2]; vLLM any >= 0. Past 100 every row is already uniform.
TEMPERATURE_LIMIT = 100.0
SEED_MIN = -(2**63)
SEED_MAX = 2**64 - 1
# Stop strings cost each step O(new characters x strings) (runtime/stop.py) and their
# automata O(total length) to build: bounded well above any client library's use (OpenAI
# allows 4 strings; LangChain, LiteLLM and the agent SDKs send a handful).
MAX_STOP_STRINGS = 64
MAX_STOP_LEN = 1024
MAX_STOP_TOKEN_IDS = 1024

_FLOAT_RANGES = {
    "temperature": f"[0, {TEMPERATURE_LIMIT:g}]",
    "top_p": "(0, 1]",
    "min_p": "[0, 1]",
    "repetition_penalty": f"[{REPETITION_PENALTY_MIN:g}, {REPETITION_PENALTY_MAX:g}]",
    "presence_penalty": f"[{-PENALTY_LIMIT}, {PENALTY_LIMIT}]",
    "frequency_penalty": f"[{-PENALTY_LIMIT}, {PENALTY_LIMIT}]",
}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _bad(name: str, value: Any, allowed: str) -> ValueError:
    return ValueError(f"{name}={value!r} is out of range: allowed {allowed}")


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How one request turns logits into tokens, and when it stops.

    Collections are normalised in `__post_init__` so callers may pass what JSON gives them:
    `logit_bias` as a dict (keys may be digit strings) becomes a tuple of (token_id, bias)
    sorted by token id; `stop` as a str or list becomes a tuple; `stop_token_ids` as a list
    becomes a tuple; None for any of the three means empty. Floats given as ints become
    floats. Every bad value raises ValueError naming the field, the value and the allowed
    range.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1 = off
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # None: none; 0: chosen token only; k: chosen + top-k
    prompt_logprobs: int | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    n: int = 1
    speculative: bool = True  # False: never draft for this request (the engine's knob decides if any)
    # Report the raw logits of these token ids at each sampled position (an LLM reranker's
    # "yes" / "no"), exact float32 values, in each TokenLogprob's `logits`: needs `logprobs`.
    logit_token_ids: tuple[int, ...] = ()

    @classmethod
    def create(cls, **kw: Any) -> SamplingParams:
        """Build from keyword arguments; same normalisation and validation as the constructor."""
        return cls(**kw)

    def __post_init__(self) -> None:
        self._normalise()
        self._validate_ints()
        self._validate_floats()
        self._validate_collections()

    @property
    def greedy(self) -> bool:
        """True when the choice is the argmax: temperature 0 or top_k 1."""
        return self.temperature == 0.0 or self.top_k == 1

    def check_vocab(self, vocab_size: int) -> None:
        """Raise ValueError if a logit_bias token id is outside a vocab of `vocab_size`
        (the server calls this at the boundary; the sampler checks again per row)."""
        for token_id, _ in self.logit_bias:
            if token_id >= vocab_size:
                raise _bad("logit_bias key", token_id, f"token ids in [0, {vocab_size - 1}] for this model")
        for token_id in self.logit_token_ids:
            if token_id >= vocab_size:
                raise _bad("logit_token_ids", token_id, f"token ids in [0, {vocab_size - 1}] for this model")

    @property
    def top_k_enabled(self) -> bool:
        return self.top_k > 0

    @property
    def max_stop_len(self) -> int:
        return max((len(s) for s in self.stop), default=0)

    def _normalise(self) -> None:
        set_ = object.__setattr__
        for name, allowed in _FLOAT_RANGES.items():
            value = getattr(self, name)
            if not _is_real(value):
                raise _bad(name, value, f"a finite number {allowed}")
            set_(self, name, float(value))
        set_(self, "logit_bias", _normalise_logit_bias(self.logit_bias or ()))
        stop = self.stop or ()
        set_(self, "stop", (stop,) if isinstance(stop, str) else tuple(stop))
        set_(self, "stop_token_ids", tuple(self.stop_token_ids or ()))
        set_(self, "logit_token_ids", tuple(self.logit_token_ids or ()))
        for name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens", "speculative"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r} must be a bool")

    def _validate_ints(self) -> None:
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise _bad("max_tokens", self.max_tokens, "an int >= 1")
        if not _is_int(self.top_k) or self.top_k < -1:
            raise _bad("top_k", self.top_k, "an int >= -1 (0 or -1 = off)")
        if not _is_int(self.n) or self.n < 1:
            raise _bad("n", self.n, "an int >= 1")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or not 0 <= value <= MAX_LOGPROBS):
                raise _bad(name, value, f"None or an int in [0, {MAX_LOGPROBS}]")
        seed = self.seed
        if seed is not None and (not _is_int(seed) or not SEED_MIN <= seed <= SEED_MAX):
            raise _bad("seed", seed, f"None or an int in [{SEED_MIN}, {SEED_MAX}]")

    def _validate_floats(self) -> None:
        in_range = {
            "temperature": 0.0 <= self.temperature <= TEMPERATURE_LIMIT,
            "top_p": 0.0 < self.top_p <= 1.0,
            "min_p": 0.0 <= self.min_p <= 1.0,
            "repetition_penalty": (REPETITION_PENALTY_MIN <= self.repetition_penalty <= REPETITION_PENALTY_MAX),
            "presence_penalty": -PENALTY_LIMIT <= self.presence_penalty <= PENALTY_LIMIT,
            "frequency_penalty": -PENALTY_LIMIT <= self.frequency_penalty <= PENALTY_LIMIT,
        }
        for name, ok in in_range.items():
            if not ok:
                raise _bad(name, getattr(self, name), _FLOAT_RANGES[name])

    def _validate_collections(self) -> None:
        if len(self.stop) > MAX_STOP_STRINGS:
            raise _bad("stop", f"<{len(self.stop)} strings>", f"at most {MAX_STOP_STRINGS} stop strings")
        if len(self.stop_token_ids) > MAX_STOP_TOKEN_IDS:
            raise _bad("stop_token_ids", f"<{len(self.stop_token_ids)} ids>", f"at most {MAX_STOP_TOKEN_IDS} ids")
        for token_id, bias in self.logit_bias:
            if not -LOGIT_BIAS_LIMIT <= bias <= LOGIT_BIAS_LIMIT:
                raise _bad(f"logit_bias[{token_id}]", bias, f"[{-LOGIT_BIAS_LIMIT}, {LOGIT_BIAS_LIMIT}]")
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise _bad("stop", s, "non-empty strings")
            if len(s) > MAX_STOP_LEN:
                raise _bad(
                    "stop", f"<a string of {len(s)} characters>", f"strings of at most {MAX_STOP_LEN} characters"
                )
        for name in ("stop_token_ids", "logit_token_ids"):
            for token_id in getattr(self, name):
                if not _is_int(token_id) or token_id < 0:
                    raise _bad(name, token_id, "ints >= 0")
        if self.logit_token_ids and self.logprobs is None:
            raise ValueError("logit_token_ids are reported with the logprobs: set logprobs (0 or more)")


def _normalise_logit_bias(
    raw: Mapping[Any, Any] | Iterable[tuple[Any, Any]],
) -> tuple[tuple[int, float], ...]:
    """Dict or pairs -> tuple of (token_id, bias) sorted by id; digit-string ids become ints."""
    items = raw.items() if isinstance(raw, Mapping) else raw
    out: dict[int, float] = {}
    for key, bias in items:
        token_id = key
        if isinstance(key, str) and key.strip().isdigit():
            token_id = int(key)
        if not _is_int(token_id) or token_id < 0:
            raise _bad("logit_bias key", key, "token ids: ints >= 0")
        if not _is_real(bias):
            raise _bad(f"logit_bias[{token_id}]", bias, f"finite numbers in [{-LOGIT_BIAS_LIMIT}, {LOGIT_BIAS_LIMIT}]")
        if token_id in out:
            raise ValueError(f"logit_bias key {token_id!r} is given twice")
        out[token_id] = float(bias)
    return tuple(sorted(out.items()))
