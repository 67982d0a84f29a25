"""The bounded in-memory store behind `previous_response_id`: per response, the conversation
it ended (as chat messages, without its instructions, which OpenAI does not carry over) and
its body for GET /v1/responses/{id}. Least recently used entries go first."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import NamedTuple

from agentkv.server.errors import APIError
from agentkv.server.responses_objects import ResponseObject
from agentkv.server.schemas import ChatMessage

DEFAULT_CAPACITY = 256


class StoredResponse(NamedTuple):
    history: list[ChatMessage]  # input and output of this and every earlier turn
    body: ResponseObject


class ResponseStore:
    """LRU map response id -> StoredResponse (mutates; safe across threads)."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"capacity={capacity} is out of range: allowed >= 1")
        self.capacity = capacity
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, response_id: str, entry: StoredResponse) -> None:
        """Insert as most recent; evicts the least recently used past `capacity`."""
        with self._lock:
            self._entries[response_id] = entry
            self._entries.move_to_end(response_id)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        """The entry (now most recent), or None."""
        with self._lock:
            entry = self._entries.get(response_id)
            if entry is not None:
                self._entries.move_to_end(response_id)
            return entry

    def delete(self, response_id: str) -> bool:
        with self._lock:
            return self._entries.pop(response_id, None) is not None

    def ids(self) -> list[str]:
        """Ids from least to most recently used."""
        with self._lock:
            return list(self._entries)

    def previous(self, response_id: str) -> StoredResponse:
        """The entry a `previous_response_id` names; unknown (never stored, `store: false`,
        or evicted) is a 400 as OpenAI answers it."""
        entry = self.get(response_id)
        if entry is None:
            raise APIError(
                400,
                f"Previous response with id {response_id!r} not found.",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        return entry

    def require(self, response_id: str) -> StoredResponse:
        """The entry GET/DELETE /v1/responses/{id} names; unknown is a 404."""
        entry = self.get(response_id)
        if entry is None:
            raise APIError(404, f"Response with id {response_id!r} not found.", param="response_id", code="not_found")
        return entry
