"""The chat core's events as the run of segments block-shaped APIs lay a
reply out in (Anthropic's content blocks, the Responses API's output items):
the thought, the text, and each tool call a segment of its own. A segment
opens when an event of another kind arrives, closing the one before; a
subclass writes a segment's start, its pieces and its end as its API's
events."""

from __future__ import annotations

from ember.chat.events import CallArguments, CallStart, ChatEvent, TextDelta, ThoughtDelta

__all__ = ["Segments"]


class Segments:
    def __init__(self) -> None:
        #: the segment open now: ("thought",), ("text",) or ("call", index)
        self.open: tuple | None = None

    def feed(self, events: list[ChatEvent]) -> list:
        """The API's events the chat core's `events` give (their `End` is
        the caller's: how a segment ends depends on why the reply did)."""
        out: list = []
        for ev in events:
            if isinstance(ev, ThoughtDelta) and ev.text:
                out += self._enter(("thought",), self.start_thought)
                out += self.thought(ev.text)
            elif isinstance(ev, TextDelta) and ev.text:
                out += self._enter(("text",), self.start_text)
                out += self.text(ev.text)
            elif isinstance(ev, CallStart):  # a segment of its own, even after another call
                out += self.close()
                self.open = ("call", ev.index)
                out += self.start_call(ev)
            elif isinstance(ev, CallArguments) and ev.fragment:
                out += self.arguments(ev.fragment)
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

    def start_call(self, call: CallStart) -> list:
        raise NotImplementedError

    def arguments(self, fragment: str) -> list:
        raise NotImplementedError

    def end(self, kind: str, *how) -> list:
        raise NotImplementedError
