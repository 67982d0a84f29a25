"""Prefix pins: which radix nodes are held from eviction until when, for whom, and the budget
of blocks they may hold (so pins can never take the blocks a request needs to run)."""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from agentkv.cache.radix import Node


class PinBudget(NamedTuple):
    """Most KV blocks prefix pins may hold, in all and in one namespace (a tenant)."""

    max_blocks: int
    max_blocks_per_namespace: int


class Pin(NamedTuple):
    node: Node  # locked (by the cache) while the pin lives
    expires_at: float
    namespace: Hashable
    num_blocks: int  # the blocks of the pinned prefix (its whole path from the root)


class PinTable:
    """The live pins by node id. Pure bookkeeping: the cache locks and unlocks the nodes."""

    def __init__(self) -> None:
        self._pins: dict[int, Pin] = {}

    def get(self, node: Node) -> Pin | None:
        return self._pins.get(node.node_id)

    def put(self, pin: Pin) -> None:
        self._pins[pin.node.node_id] = pin

    def fits(self, namespace: Hashable, num_blocks: int, budget: PinBudget) -> bool:
        """Whether a new pin of `num_blocks` in `namespace` stays within `budget`."""
        in_all = in_namespace = 0
        for pin in self._pins.values():
            in_all += pin.num_blocks
            in_namespace += pin.num_blocks if pin.namespace == namespace else 0
        return in_all + num_blocks <= budget.max_blocks and in_namespace + num_blocks <= budget.max_blocks_per_namespace

    def take_expired(self, now: float, everything: bool = False) -> list[Node]:
        """Forget the pins whose time is up (every pin, with `everything`); returns their
        nodes, which the caller unlocks."""
        expired = [key for key, pin in self._pins.items() if everything or pin.expires_at <= now]
        return [self._pins.pop(key).node for key in expired]

    def take_namespace(self, namespace: Hashable) -> list[Node]:
        """Forget every pin of `namespace`; returns their nodes, which the caller unlocks."""
        keys = [key for key, pin in self._pins.items() if pin.namespace == namespace]
        return [self._pins.pop(key).node for key in keys]

    def next_expiry(self) -> float | None:
        return min((pin.expires_at for pin in self._pins.values()), default=None)

    def __len__(self) -> int:
        return len(self._pins)

    @property
    def num_blocks(self) -> int:
        return sum(pin.num_blocks for pin in self._pins.values())
