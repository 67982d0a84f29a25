"""The suffix drafter: the longest match of the context's suffix in the request's own
context or in a bounded global index of recently finished requests (prompts and outputs),
the idea of SuffixDecoding with match lengths capped at `max_n`."""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Hashable, Sequence

from agentkv.sched.draft.ngram import NgramDrafter

DEFAULT_MAX_INDEXED_TOKENS = 1 << 16


class GlobalIndex:
    """n-gram -> (document, end) over the latest finished contexts, at most `max_tokens`
    tokens in all: the oldest documents leave first and take their entries with them."""

    def __init__(self, min_n: int, max_n: int, max_tokens: int) -> None:
        if max_tokens < 1:
            raise ValueError(f"max_tokens={max_tokens} must be >= 1")
        self.min_n, self.max_n, self.max_tokens = min_n, max_n, max_tokens
        self.docs: OrderedDict[int, tuple[int, ...]] = OrderedDict()
        self.ends: dict[tuple[int, ...], tuple[int, int]] = {}
        self.num_tokens = 0
        self._ids = itertools.count()

    def _ngrams(self, doc: tuple[int, ...]):
        for end in range(1, len(doc)):
            for n in range(self.min_n, min(self.max_n, end) + 1):
                yield doc[end - n : end], end

    def add(self, tokens: Sequence[int]) -> None:
        """Index one finished context (mutates; may evict the oldest documents)."""
        doc = tuple(int(t) for t in tokens[-self.max_tokens :])
        if len(doc) < 2:
            return
        doc_id = next(self._ids)
        while self.docs and self.num_tokens + len(doc) > self.max_tokens:
            self._evict_oldest()
        self.docs[doc_id] = doc
        self.num_tokens += len(doc)
        for key, end in self._ngrams(doc):
            self.ends[key] = (doc_id, end)

    def _evict_oldest(self) -> None:
        doc_id, doc = self.docs.popitem(last=False)
        self.num_tokens -= len(doc)
        for key, _ in self._ngrams(doc):
            if self.ends.get(key, (None,))[0] == doc_id:
                del self.ends[key]

    def match(self, suffix: Sequence[int], num_tokens: int) -> tuple[int, list[int]]:
        """(n, continuation) of the longest indexed n-gram ending `suffix`; (0, [])."""
        for n in range(min(self.max_n, len(suffix)), self.min_n - 1, -1):
            hit = self.ends.get(tuple(suffix[len(suffix) - n :]))
            if hit is not None:
                doc = self.docs[hit[0]]
                return n, list(doc[hit[1] : hit[1] + num_tokens])
        return 0, []


class SuffixDrafter(NgramDrafter):
    """Own context first on equal match length; the global index where it matches longer."""

    name = "suffix"

    def __init__(self, min_n: int = 2, max_n: int = 8, max_indexed_tokens: int = DEFAULT_MAX_INDEXED_TOKENS) -> None:
        super().__init__(min_n, max_n)
        self.index = GlobalIndex(min_n, max_n, max_indexed_tokens)

    def propose(self, key: Hashable, context: Sequence[int], num_tokens: int) -> list[int]:
        own = self.own_index(key, context)
        if num_tokens <= 0:
            return []
        n, end = own.match(context)
        g, continuation = self.index.match(context, num_tokens)
        if g > n:
            return continuation
        return own.tokens[end : end + num_tokens] if n else []

    def end(self, key: Hashable, context: Sequence[int]) -> None:
        super().end(key, context)
        self.index.add(context)
