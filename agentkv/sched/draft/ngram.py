"""Prompt lookup: draft the tokens that followed the latest earlier occurrence of the
context's longest suffix n-gram, in the request's own context."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from agentkv.sched.draft.base import Drafter


class NgramIndex:
    """The latest end of every n-gram (min_n <= n <= max_n) of a growing token list that has
    at least one token after it. Incremental: `extend` indexes only the new tokens.

        tokens:  a b c d a b c
                         ^ e = 4: "a b c d" ... ends here, continuation tokens[4:]
        key ("a","b","c") -> end 3 ; the last "a b c" has no continuation yet: not indexed
    """

    __slots__ = ("min_n", "max_n", "tokens", "ends")

    def __init__(self, min_n: int, max_n: int) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"min_n={min_n}, max_n={max_n}: need 1 <= min_n <= max_n")
        self.min_n, self.max_n = min_n, max_n
        self.tokens: list[int] = []
        self.ends: dict[tuple[int, ...], int] = {}

    def extend(self, tokens: Sequence[int]) -> None:
        """Append `tokens` and index every n-gram that now has a continuation (mutates)."""
        own = self.tokens
        for token in tokens:
            end = len(own)  # n-grams ending here are followed by `token`
            for n in range(self.min_n, min(self.max_n, end) + 1):
                self.ends[tuple(own[end - n : end])] = end
            own.append(int(token))

    def sync(self, context: Sequence[int]) -> None:
        """Make the index hold `context`, which must extend what it holds (else it rebuilds)."""
        num_seen = len(self.tokens)
        if len(context) < num_seen or list(context[:num_seen]) != self.tokens:
            self.tokens, self.ends = [], {}
            num_seen = 0
        self.extend(context[num_seen:])

    def match(self, suffix: Sequence[int]) -> tuple[int, int]:
        """(n, end) of the longest n-gram ending `suffix` found here (latest occurrence);
        (0, -1) when none of length >= min_n is."""
        for n in range(min(self.max_n, len(suffix)), self.min_n - 1, -1):
            end = self.ends.get(tuple(suffix[len(suffix) - n :]))
            if end is not None:
                return n, end
        return 0, -1


class NgramDrafter(Drafter):
    """Prompt lookup decoding against the request's own context (prompt and output)."""

    name = "ngram"

    def __init__(self, min_n: int = 2, max_n: int = 5) -> None:
        NgramIndex(min_n, max_n)  # validates
        self.min_n, self.max_n = min_n, max_n
        self._own: dict[Hashable, NgramIndex] = {}

    def own_index(self, key: Hashable, context: Sequence[int]) -> NgramIndex:
        index = self._own.get(key)
        if index is None:
            index = self._own[key] = NgramIndex(self.min_n, self.max_n)
        index.sync(context)
        return index

    def propose(self, key: Hashable, context: Sequence[int], num_tokens: int) -> list[int]:
        index = self.own_index(key, context)
        if num_tokens <= 0:
            return []
        n, end = index.match(context)
        return index.tokens[end : end + num_tokens] if n else []

    def end(self, key: Hashable, context: Sequence[int]) -> None:
        self._own.pop(key, None)
