"""When a sequence stops: eos and stop token ids, stop strings across token boundaries, max_tokens.

One `StopChecker` per sequence; the engine calls `check` once per generated token with that
token's new text only. Each stop string has a matcher (Knuth-Morris-Pratt) whose state is the
length of the longest prefix of the string that the text generated so far ends with:

    stop "</tool>",  text ... "x)</to"   -> state 4 ("</to")
    next text "ol>"                      -> 5, 6, 7 = len: the string completed at this char

So a step costs O(len(new text) x number of stop strings), whatever the length of the text
already generated, and the characters a streaming server must withhold (they could begin a
stop string) are the largest state: `holdback_len()`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from agentkv.runtime.params import SamplingParams


class StopDecision(NamedTuple):
    finished: bool
    reason: str | None  # "stop" | "length" | None while running
    trim_text_to: int | None  # cut the whole output text to its first trim_text_to chars; None = keep
    matched: str | int | None  # the stop string, or the stop / eos token id


RUNNING = StopDecision(False, None, None, None)


class _Matcher:
    """One stop string's KMP automaton: `state` = chars of `s` the text currently ends with."""

    __slots__ = ("s", "fail", "state")

    def __init__(self, s: str) -> None:
        self.s, self.state = s, 0
        fail = [0] * len(s)  # fail[i]: longest proper border of s[: i + 1]
        k = 0
        for i in range(1, len(s)):
            while k and s[i] != s[k]:
                k = fail[k - 1]
            if s[i] == s[k]:
                k += 1
            fail[i] = k
        self.fail = fail

    def step(self, c: str) -> bool:
        """Advance by one character; True when the string has just completed."""
        s, q = self.s, self.state
        while q and s[q] != c:
            q = self.fail[q - 1]
        if s[q] == c:
            q += 1
        if q == len(s):
            self.state = self.fail[q - 1]
            return True
        self.state = q
        return False


class StopChecker:
    """Decides after each token whether its sequence is finished (mutates its matchers and
    its counts of tokens and characters)."""

    __slots__ = ("params", "eos_ids", "stop_ids", "num_tokens", "num_chars", "_matchers")

    def __init__(self, params: SamplingParams, eos_ids: Iterable[int]) -> None:
        self.params = params
        self.eos_ids = frozenset(eos_ids)
        self.stop_ids = frozenset(params.stop_token_ids)
        self.num_tokens = 0
        self.num_chars = 0  # characters of output text fed so far
        self._matchers = [_Matcher(s) for s in params.stop]

    def check(self, token_id: int, new_text: str) -> StopDecision:
        """Count one generated token whose text is `new_text` (possibly "" while a multi-byte
        character is incomplete) and say whether the sequence is finished.

        Order: eos (unless ignore_eos) and stop token ids -> "stop" (text untouched);
        a stop string completing inside `new_text` -> "stop" with `trim_text_to`, an offset
        into the whole output text; max_tokens reached -> "length". Of the stop strings, the
        one that completes first wins (on a tie, the earliest start: the longest), which is
        where a char-by-char check stops however the text was cut into tokens."""
        self.num_tokens += 1
        if token_id in self.stop_ids or (token_id in self.eos_ids and not self.params.ignore_eos):
            self.num_chars += len(new_text)
            return StopDecision(True, "stop", None, token_id)
        hit = self._feed(new_text) if self._matchers else None
        if hit is not None:
            return hit
        if self.num_tokens >= self.params.max_tokens:
            return StopDecision(True, "length", None, None)
        return RUNNING

    def _feed(self, new_text: str) -> StopDecision | None:
        for c in new_text:
            self.num_chars += 1
            done = [m.s for m in self._matchers if m.step(c)]
            if done:
                s = max(done, key=len)
                end = self.num_chars
                trim = end if self.params.include_stop_str_in_output else end - len(s)
                return StopDecision(True, "stop", trim, s)
        return None

    def holdback_len(self) -> int:
        """How many trailing characters of the text fed so far could begin a stop string (the
        longest suffix that is a proper prefix of one); a streaming server withholds them."""
        return max((m.state for m in self._matchers), default=0)
