"""Drafters for speculative decoding (pure Python): prompt lookup and a suffix index."""

from agentkv.sched.draft.base import Drafter, DraftLength
from agentkv.sched.draft.ngram import NgramDrafter, NgramIndex
from agentkv.sched.draft.registry import DRAFTERS, make_drafter
from agentkv.sched.draft.suffix import GlobalIndex, SuffixDrafter

__all__ = [
    "DRAFTERS",
    "DraftLength",
    "Drafter",
    "GlobalIndex",
    "NgramDrafter",
    "NgramIndex",
    "SuffixDrafter",
    "make_drafter",
]
