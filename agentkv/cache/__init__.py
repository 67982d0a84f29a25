"""Block pool and radix prefix tree over token ids (pure Python, no torch)."""

from agentkv.cache.block_pool import BlockId, BlockPool
from agentkv.cache.radix import MatchResult, Node, RadixCache, SharedPrefix
from agentkv.cache.tokens import common_prefix_len

__all__ = ["BlockId", "BlockPool", "MatchResult", "Node", "RadixCache", "SharedPrefix", "common_prefix_len"]
