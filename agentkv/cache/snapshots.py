"""Where a hit can resume when the model carries recurrent state: at a state snapshot.

A hybrid model's recurrent layers keep one fixed-size state per sequence; the backend keeps
the state at some KV blocks' ends in a slot of that block (`hal/state_store.py`: every k-th
block and where a prefill chunk stopped), so the radix node that lists a full block holds its
snapshot, and locks and evicts it with the block. A token-exact hit is usable only up to the
deepest snapshot at or before its end:

    bs = 4                | b0: 0 1 2 3 | b1: 4 5 6 7 | b2: 8 9 . . |
    snapshots in b0, b1   ^-- states after 3 and 7
    matched 10 tokens     resume at 8, recompute 8 and 9
    (b1 without one:      resume at 4, recompute 4 .. 9)

Pure Python: the cache counts the snapshots through the blocks, never touches their bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from agentkv.cache.radix import MatchResult


@dataclass(frozen=True)
class Snapshots:
    """A hybrid model's snapshots as the scheduler sees them (runtime/hybrid.py builds them
    from the runner's state store): whether a hit may resume at a block's end, the same for
    a block the disk tier returns, and what a leaving sequence (its block table and computed
    tokens) leaves behind: its running state goes, its latest block end stays a snapshot."""

    has: Callable[[int], bool]
    payload_has: Callable[[bytes], bool]
    release_running: Callable[[list, int], None]


def resume_point(match: MatchResult, snapshots: Snapshots | None, block_size: int) -> MatchResult:
    """`match` cut down to the end of its deepest full block holding a snapshot (None keeps a
    token-exact hit as it is). The cut hit ends on a block boundary, so sharing it copies no
    block; `last_node` stays the deepest node touched (the lock)."""
    if snapshots is None:
        return match
    full = match.cached_len // block_size
    while full > 0 and not snapshots.has(match.block_table[full - 1]):
        full -= 1
    return match._replace(cached_len=full * block_size, block_table=match.block_table[:full])
