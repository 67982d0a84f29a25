"""Where a hit can resume when the model carries recurrent state: at a state snapshot.

A hybrid model's recurrent layers keep one fixed-size state per sequence; the backend keeps
the state at each KV block's end in a slot of that block (`hal/recurrent.py`), so the radix
node that lists a full block holds its snapshot, and locks and evicts it with the block. A
token-exact hit is usable only up to the deepest snapshot at or before its end:

    bs = 4, align = 4     | b0: 0 1 2 3 | b1: 4 5 6 7 | b2: 8 9 . . |
    matched 10 tokens     ^-- snapshots after 3 and 7; resume at 8, recompute 8 and 9

Pure Python: the cache counts the snapshots through the blocks, never touches their bytes.
"""

from __future__ import annotations

from agentkv.cache.radix import MatchResult


def resume_point(match: MatchResult, align: int, block_size: int) -> MatchResult:
    """`match` cut down to the deepest multiple of `align` tokens (a multiple of
    `block_size`; 1 keeps a token-exact hit as it is). The cut hit ends on a block boundary,
    so sharing it copies no block; `last_node` stays the deepest node touched (the lock)."""
    if align <= 1:
        return match
    if align % block_size:
        raise ValueError(f"resume_align={align} must be a multiple of block_size={block_size}")
    cached_len = match.cached_len - match.cached_len % align
    return match._replace(cached_len=cached_len, block_table=match.block_table[: cached_len // block_size])
