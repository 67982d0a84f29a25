"""When a sequence stops: eos and stop token ids, stop strings across token boundaries, max_tokens.

One `StopChecker` per sequence; the engine calls `check` once per generated token with the
detokenized output so far. Index regions for a stop-string search:

    text_so_far = ............old output............|.....new_text.....
                                        |<- len(s)-1 ->|
                                        ^ search starts here: any match must END inside
                                          new_text, earlier ones were seen last step

A streaming server withholds `holdback_len(text)` trailing characters, because they could be
the start of a stop string, so a delta never shows a stop string it later has to take back.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from agentkv.runtime.params import SamplingParams


class StopDecision(NamedTuple):
    finished: bool
    reason: str | None  # "stop" | "length" | None while running
    trim_text_to: int | None  # cut the output text to text_so_far[:trim_text_to]; None = keep
    matched: str | int | None  # the stop string, or the stop / eos token id


RUNNING = StopDecision(False, None, None, None)


class StopChecker:
    """Decides after each token whether its sequence is finished (mutates a token count)."""

    __slots__ = ("params", "eos_ids", "stop_ids", "num_tokens")

    def __init__(self, params: SamplingParams, eos_ids: Iterable[int]) -> None:
        self.params = params
        self.eos_ids = frozenset(eos_ids)
        self.stop_ids = frozenset(params.stop_token_ids)
        self.num_tokens = 0

    def check(self, token_id: int, text_so_far: str, new_text: str) -> StopDecision:
        """Count one generated token and say whether the sequence is finished.

        `text_so_far` is the whole output text INCLUDING `new_text` (this token's
        characters, possibly "" while a multi-byte character is incomplete) at its end.
        Order: eos (unless ignore_eos) and stop token ids -> "stop" (text untouched);
        a stop string ending inside `new_text` -> "stop" with `trim_text_to`;
        max_tokens reached -> "length".
        """
        if not text_so_far.endswith(new_text):
            raise RuntimeError("StopChecker.check: text_so_far must end with new_text (caller bug)")
        self.num_tokens += 1
        if token_id in self.stop_ids or (token_id in self.eos_ids and not self.params.ignore_eos):
            return StopDecision(True, "stop", None, token_id)
        if new_text and self.params.stop:
            hit = self._find_stop_string(text_so_far, len(new_text))
            if hit is not None:
                return hit
        if self.num_tokens >= self.params.max_tokens:
            return StopDecision(True, "length", None, None)
        return RUNNING

    def holdback_len(self, text: str) -> int:
        """How many trailing characters of `text` could begin a stop string (the longest
        suffix that is a proper prefix of one); a streaming server must withhold them."""
        longest = min(len(text), self.params.max_stop_len - 1)
        for k in range(longest, 0, -1):
            suffix = text[-k:]
            if any(len(s) > k and s.startswith(suffix) for s in self.params.stop):
                return k
        return 0

    def _find_stop_string(self, text: str, new_len: int) -> StopDecision | None:
        """The stop string that completes first (smallest end; on a tie the earliest start),
        among those ending inside the new text. Choosing by end makes the result the same
        however the text was split into tokens: it is where a char-by-char check would stop."""
        old_end = len(text) - new_len
        best: tuple[int, int, str] | None = None
        for s in self.params.stop:
            start = text.find(s, max(0, old_end - len(s) + 1))
            if start < 0:
                continue
            key = (start + len(s), start, s)
            if best is None or key[:2] < best[:2]:
                best = key
        if best is None:
            return None
        end, start, s = best
        trim = end if self.params.include_stop_str_in_output else start
        return StopDecision(True, "stop", trim, s)
