"""Drafters for speculative decoding (pure Python): prompt lookup and a suffix index."""
from agentkv.sched.draft.base import DraftLength, Drafter
from agentkv.sched.draft.ngram import NgramDrafter, NgramIndex
from agentkv.sched.draft.suffix import GlobalIndex, SuffixDrafter
from agentkv.sched.draft.registry import DRAFTERS, make_drafter

__all__ = ["DRAFTERS", "DraftLength", "Drafter", "GlobalIndex", "NgramDrafter", "NgramIndex",
           "SuffixDrafter", "make_drafter"]
