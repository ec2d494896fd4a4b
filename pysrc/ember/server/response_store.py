"""The Responses API's store: what `POST /v1/responses` answered (unless
`store` is false), so a client can chain replies with `previous_response_id`,
read one back, list its input items, delete it, and run one in the
background and poll or cancel it.

Kept in this process's memory, bounded in count and bytes: past either bound
the oldest finished response goes first (one still running is never
dropped). A restart loses them all. With API keys, a response is its key's:
another key is told it does not exist."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ember.server.errors import ApiError

__all__ = ["ResponseStore", "Stored"]

#: The statuses a response ends in.
FINISHED = frozenset({"completed", "incomplete", "failed", "cancelled"})


@dataclass
class Stored:
    id: str
    #: the response object as GET returns it (its status follows a background run)
    response: dict
    #: the request's input, as items with ids (GET .../input_items)
    input_items: list[dict]
    #: the conversation a reply chained to this one continues: the earlier
    #: turns, this request's input and its reply, as chat messages
    #: (instructions are not carried on, as OpenAI's API has it)
    conversation: list[dict] = field(default_factory=list)
    #: the API key's owner number (0: no keys)
    owner: int = 0
    #: the background run, while it runs
    task: asyncio.Task | None = None
    bytes: int = 0

    @property
    def finished(self) -> bool:
        return self.response.get("status") in FINISHED

    def measure(self) -> None:
        self.bytes = sum(len(msgspec.json.encode(x)) for x in (self.response, self.input_items, self.conversation))


class ResponseStore:
    def __init__(self, max_count: int, max_bytes: int):
        self.max_count = max_count
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, Stored] = OrderedDict()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._items)

    @property
    def enabled(self) -> bool:
        return self.max_count > 0

    def put(self, entry: Stored) -> None:
        """Keeps `entry` (replacing an earlier state of the same response),
        dropping the oldest finished ones past the bounds. Refuses (503) when
        only running ones could make the room."""
        old = self._items.pop(entry.id, None)
        if old is not None:
            self.bytes -= old.bytes
        entry.measure()
        if entry.bytes > self.max_bytes:
            raise ApiError(400, f"store: this response ({entry.bytes} bytes) is larger than the whole store "
                           f"({self.max_bytes} bytes); send store: false", param="store")
        while self._items and (len(self._items) >= self.max_count or self.bytes + entry.bytes > self.max_bytes):
            oldest = next((k for k, v in self._items.items() if v.finished), None)
            if oldest is None:
                raise ApiError(503, "the response store is full of responses still running; wait for one to "
                               "finish, or send store: false")
            self.bytes -= self._items.pop(oldest).bytes
        self._items[entry.id] = entry
        self.bytes += entry.bytes

    def get(self, response_id: str, owner: int, *, param: str = "response_id") -> Stored:
        entry = self._items.get(response_id)
        if entry is None or entry.owner != owner:
            raise ApiError(404, f"{param}: no stored response {response_id!r} (responses are kept in memory, "
                           f"the oldest dropped past {self.max_count}, and lost when the server restarts)",
                           param=param, type="not_found_error")
        return entry

    def delete(self, response_id: str, owner: int) -> Stored:
        entry = self.get(response_id, owner)
        if entry.task is not None and not entry.task.done():
            entry.task.cancel()
        del self._items[response_id]
        self.bytes -= entry.bytes
        return entry

    def item(self, item_id: str, owner: int) -> dict | None:
        """An item of a stored response (an input or an output item) by its
        id, for an `item_reference`; the newest response holding it wins."""
        for entry in reversed(self._items.values()):
            if entry.owner != owner:
                continue
            for it in (*entry.response.get("output", []), *entry.input_items):
                if it.get("id") == item_id:
                    return it
        return None


def as_message(items: list[dict]) -> dict[str, Any]:
    """The assistant turn the reply's output items make, as a chat message."""
    turn: dict[str, Any] = {"role": "assistant", "content": ""}
    for it in items:
        if it["type"] == "message":
            turn["content"] += "".join(p.get("text", "") for p in it["content"])
        elif it["type"] == "reasoning":
            turn["reasoning_content"] = "".join(p.get("text", "") for p in it["content"])
        elif it["type"] == "function_call":
            turn.setdefault("tool_calls", []).append(
                {"id": it["call_id"], "type": "function", "function": {"name": it["name"],
                                                                       "arguments": it["arguments"]}})
    return turn
