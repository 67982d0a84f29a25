"""What every drafter is: a proposer of the next tokens of a sequence from text it has seen,
and the per-request draft length that adapts to how often its drafts are accepted."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

MAX_BACKOFF = 64  # longest pause, in decode steps, between probes of a failing request


class Drafter(ABC):
    """Proposes up to `num_tokens` tokens that may follow `context`. Pure Python; the engine
    verifies every proposal, so a drafter can only cost time, never change an answer.

    A drafter may keep state per request `key`: `propose` sees that request's context grow
    (only by accepted tokens), `end` forgets it (and may learn from the finished context)."""

    name: str = ""

    @abstractmethod
    def propose(self, key: Hashable, context: Sequence[int], num_tokens: int) -> list[int]:
        """Up to `num_tokens` draft tokens to follow `context` (mutates the request's index)."""

    @abstractmethod
    def end(self, key: Hashable, context: Sequence[int]) -> None:
        """The request `key` finished or was aborted with `context`; drop its state."""


@dataclass(slots=True)
class DraftLength:
    """How many tokens to draft for one request, adapted to its acceptance.

    A fully accepted draft grows the length by one (up to `limit`); a partly accepted one
    keeps it (a copy that diverged once usually goes on copying); a wholly rejected one halves it, so a request
    whose drafts keep failing reaches zero after about log2(limit) misses. At zero it waits
    `backoff` steps, then probes with one token: a hit restarts at two, a miss doubles the
    wait (up to MAX_BACKOFF). Mutable; owned by the engine's request."""

    limit: int
    length: int = -1  # -1: not started, becomes `limit`
    wait: int = 0  # steps left before the next probe, while length == 0
    backoff: int = 1

    def __post_init__(self) -> None:
        if self.limit < 0:
            raise ValueError(f"limit={self.limit} must be >= 0")
        if self.length < 0:
            self.length = self.limit

    def next(self) -> int:
        """The draft length for this step (mutates the probe countdown)."""
        if self.length > 0 or self.limit == 0:
            return self.length
        if self.wait > 0:
            self.wait -= 1
            return 0
        return 1

    def update(self, num_drafted: int, num_accepted: int) -> None:
        """Learn from one verification of `num_drafted` tokens, `num_accepted` of them kept."""
        if num_drafted <= 0:
            return
        if not 0 <= num_accepted <= num_drafted:
            raise ValueError(f"accepted {num_accepted} of {num_drafted} drafted: bug")
        if num_accepted == num_drafted:
            self.length = min(self.limit, max(self.length, num_drafted) + 1)
            self.backoff = 1
        elif num_accepted > 0:
            self.length = min(self.limit, max(self.length, num_accepted + 1))
            self.backoff = 1
        elif self.length > 1:
            self.length //= 2
        else:
            self.length = 0
            self.wait = self.backoff
            self.backoff = min(MAX_BACKOFF, self.backoff * 2)
