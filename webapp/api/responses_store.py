"""Conversations of recent Responses by id, for ``previous_response_id``.

Each reply with ``store`` (the default) keeps its conversation (input and output, as chat
messages, without the instructions, which OpenAI does not carry over) in a bounded in-memory LRU
(``--response-store``, ``MTP_CHAT_RESPONSE_STORE``); an unknown id is a 404 that says so.
``store: false`` keeps nothing: the client sends the whole conversation.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import List

from .errors import ApiError


class ResponseStore:
    """Conversations of recent responses by id, least recently used dropped first."""

    def __init__(self, size: int):
        self.size = size
        self._items: "OrderedDict[str, List[dict]]" = OrderedDict()
        self._lock = threading.Lock()

    def put(self, rid: str, messages: List[dict]) -> None:
        if self.size <= 0:
            return
        with self._lock:
            self._items[rid] = messages
            self._items.move_to_end(rid)
            while len(self._items) > self.size:
                self._items.popitem(last=False)

    def get(self, rid: str) -> List[dict]:
        with self._lock:
            if rid not in self._items:
                raise ApiError(404, f"previous_response_id '{rid[:80]}' is not known here: this server keeps the "
                                    f"last {self.size} stored responses in memory (store: true), so it was never "
                                    f"stored, has been dropped, or the server restarted. Send the whole "
                                    f"conversation in 'input' instead.", param="previous_response_id",
                               code="previous_response_not_found")
            self._items.move_to_end(rid)
            return list(self._items[rid])

    def __len__(self) -> int:
        return len(self._items)
