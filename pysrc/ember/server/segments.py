"""The chat shaper's deltas as the run of segments block-shaped APIs lay a
reply out in (Anthropic's content blocks, the Responses API's output items):
the thought, the text, and each tool call a segment of its own. A segment
opens when a delta of another kind arrives, closing the one before; a
subclass writes a segment's start, its pieces and its end as its API's
events."""

from __future__ import annotations

__all__ = ["Segments"]


class Segments:
    def __init__(self) -> None:
        #: the segment open now: ("thought",), ("text",) or ("call", index)
        self.open: tuple | None = None

    def feed(self, delta: dict) -> list:
        """The events one chat delta gives."""
        out: list = []
        if thought := delta.get("reasoning_content"):
            out += self._enter(("thought",), self.start_thought)
            out += self.thought(thought)
        if text := delta.get("content"):
            out += self._enter(("text",), self.start_text)
            out += self.text(text)
        for call in delta.get("tool_calls") or ():
            if "id" in call:  # a call's first delta: a segment of its own, even after another call
                out += self.close()
                self.open = ("call", call["index"])
                out += self.start_call(call)
            if fragment := call["function"].get("arguments"):
                out += self.arguments(fragment)
        return out

    def close(self, *how) -> list:
        """The events that end the open segment (none when none is open)."""
        if self.open is None:
            return []
        kind, self.open = self.open[0], None
        return self.end(kind, *how)

    def _enter(self, key: tuple, start) -> list:
        if self.open == key:
            return []
        out = self.close()
        self.open = key
        return out + start()

    # What a subclass writes.
    def start_thought(self) -> list:
        raise NotImplementedError

    def thought(self, piece: str) -> list:
        raise NotImplementedError

    def start_text(self) -> list:
        raise NotImplementedError

    def text(self, piece: str) -> list:
        raise NotImplementedError

    def start_call(self, call: dict) -> list:
        raise NotImplementedError

    def arguments(self, fragment: str) -> list:
        raise NotImplementedError

    def end(self, kind: str, *how) -> list:
        raise NotImplementedError
