"""Drafters by name: the values of the `speculative` knob."""

from __future__ import annotations

from agentkv.sched.draft.base import Drafter
from agentkv.sched.draft.ngram import NgramDrafter
from agentkv.sched.draft.suffix import SuffixDrafter

DRAFTERS: dict[str, type[Drafter]] = {"ngram": NgramDrafter, "suffix": SuffixDrafter}


def make_drafter(name: str) -> Drafter:
    """A fresh drafter; a name outside DRAFTERS is a ValueError listing them."""
    cls = DRAFTERS.get(name)
    if cls is None:
        raise ValueError(f"speculative={name!r} is not a drafter: use one of {sorted(DRAFTERS)}")
    return cls()
