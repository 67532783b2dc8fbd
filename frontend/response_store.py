"""The Responses API's store: responses created with ``store`` true, for ``previous_response_id``, GET,
DELETE and cancel.

Runs in the frontend process, in memory, bounded twice: at most ``max_entries`` responses and
``max_bytes`` of their JSON, the least recently stored evicted first. A request naming an id that is not
(or no longer) here is refused with a 404 naming it, never answered as if the conversation were new.
"""
from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Optional


@dataclass
class StoredResponse:
    body: dict  # the response as the API returns it
    conversation: list[dict]  # the chat messages it answered and its answer, for a follow-up to continue
    size: int = 0


@dataclass
class ResponseStore:
    max_entries: int = 1000  # the oldest evicted first (--responses-store-entries)
    max_bytes: int = 64 << 20  # bytes of JSON (--responses-store-bytes)
    _entries: "OrderedDict[str, StoredResponse]" = field(default_factory=OrderedDict)
    _bytes: int = 0

    def put(self, body: dict, conversation: list[dict]) -> None:
        entry = StoredResponse(body, conversation, len(json.dumps([body, conversation])))
        self.delete(body["id"])
        if entry.size > self.max_bytes:
            return  # larger than the whole store: not kept (a later reference to it is a 404)
        self._entries[body["id"]] = entry
        self._bytes += entry.size
        while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
            _, old = self._entries.popitem(last=False)
            self._bytes -= old.size

    def get(self, response_id: str) -> Optional[StoredResponse]:
        return self._entries.get(response_id)

    def delete(self, response_id: str) -> bool:
        entry = self._entries.pop(response_id, None)
        if entry is not None:
            self._bytes -= entry.size
        return entry is not None
