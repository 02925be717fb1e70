"""Responses kept for GET /v1/responses/{id} and for continuing a conversation by previous_response_id:
in memory, at most `max_items`, each for `ttl_s` after it was stored (the oldest go first). Thread-safe."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

DEFAULT_TTL_S = 3600.0
DEFAULT_MAX_ITEMS = 1000


@dataclass
class StoredResponse:
    body: dict[str, Any]  # the Response object as the client received it
    messages: list[dict[str, Any]]  # the conversation through this response's output (no instructions)
    model: str = ""  # the served model that answered (its token ids are that model's)
    # The prompt text and token ids the model saw, followed by its reply (text as generated, ids as fed
    # through the model): a next turn whose prompt extends this text reuses these ids, and so the KV
    # cache that holds them. Empty when the reply cannot be lined up with its ids (a stop string ended it).
    text: str = ""
    ids: list[int] = field(default_factory=list)
    stored_at: float = field(default_factory=time.monotonic)


class ResponseStore:
    def __init__(self, max_items: int = DEFAULT_MAX_ITEMS, ttl_s: float = DEFAULT_TTL_S) -> None:
        self.max_items = max_items
        self.ttl_s = ttl_s
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, rid: str, item: StoredResponse) -> None:
        with self._lock:
            self._expire()
            self._items[rid] = item
            while len(self._items) > self.max_items:
                self._items.popitem(last=False)

    def get(self, rid: str) -> StoredResponse | None:
        with self._lock:
            self._expire()
            return self._items.get(rid)

    def delete(self, rid: str) -> bool:
        with self._lock:
            self._expire()
            return self._items.pop(rid, None) is not None

    def __len__(self) -> int:
        with self._lock:
            self._expire()
            return len(self._items)

    def _expire(self) -> None:
        cutoff = time.monotonic() - self.ttl_s
        while self._items:
            rid, oldest = next(iter(self._items.items()))
            if oldest.stored_at >= cutoff:
                return
            del self._items[rid]
