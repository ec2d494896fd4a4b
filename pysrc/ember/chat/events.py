"""What a chat reply is made of, as typed events: the thought and the text
in pieces, each call's start and arguments, and the end with why it came.
The chat core emits them; each API renders them in its own shape (the chat
route's deltas, Anthropic's blocks, the Responses API's items, Ollama's lines),
so none of them reads another's."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Union

__all__ = [
    "CallArguments", "CallEnd", "CallError", "CallStart", "ChatEvent", "End", "Stop", "TextDelta", "ThoughtDelta",
    "chat_delta",
]


class Stop(enum.Enum):
    """Why a reply ended."""

    #: the model ended its turn
    END_TURN = "end_turn"
    #: one of the client's stop strings was written (the text is cut before it)
    STOP_SEQUENCE = "stop_sequence"
    #: the token limit was reached
    LENGTH = "length"
    #: the context filled
    CONTEXT = "context"
    #: the model ended its turn with calls for the client to run
    TOOL_CALLS = "tool_calls"

    @property
    def cut(self) -> bool:
        """The reply was cut short, not ended by the model."""
        return self in (Stop.LENGTH, Stop.CONTEXT)

    @classmethod
    def of(cls, completion, called: bool = False) -> "Stop":
        """Why `completion` ended. A cut (by the limit or a stop string) is
        said before a call: a call it cut may be incomplete, and TOOL_CALLS
        would ask the client to run it."""
        if completion.finish_reason == "context":
            return cls.CONTEXT
        if completion.finish_reason == "length":
            return cls.LENGTH
        if completion.stop_string is not None:
            return cls.STOP_SEQUENCE
        return cls.TOOL_CALLS if called else cls.END_TURN


@dataclass(frozen=True)
class ThoughtDelta:
    """The next piece of the model's thought."""

    text: str


@dataclass(frozen=True)
class TextDelta:
    """The next piece of the answer's own text."""

    text: str


@dataclass(frozen=True)
class CallStart:
    """A call's name is whole: it gets its index (0, 1, ... in the reply) and id."""

    index: int
    id: str
    name: str


@dataclass(frozen=True)
class CallArguments:
    """The next piece of a call's JSON arguments text."""

    index: int
    fragment: str


@dataclass(frozen=True)
class CallEnd:
    """The call is complete; its arguments are valid JSON."""

    index: int


@dataclass(frozen=True)
class CallError:
    """The output went wrong inside call `index` after its name had gone
    out. Nothing follows it (the chat core raises it as a ModelOutputError)."""

    index: int
    name: str | None
    message: str


@dataclass(frozen=True)
class End:
    """The reply is over."""

    stop: Stop
    #: the stop string written, when `stop` is STOP_SEQUENCE
    stop_sequence: str | None = None


ChatEvent = Union[ThoughtDelta, TextDelta, CallStart, CallArguments, CallEnd, End]


def chat_delta(event: ChatEvent) -> dict | None:
    """The chat message's fields `event` adds, as the chat route's stream
    sends them (and `ember.Model.chat` yields them); None for an event that
    adds none (a call's end, the reply's end)."""
    if isinstance(event, TextDelta):
        return {"content": event.text}
    if isinstance(event, ThoughtDelta):
        return {"reasoning_content": event.text}
    if isinstance(event, CallStart):
        return {"tool_calls": [{"index": event.index, "id": event.id, "type": "function",
                                "function": {"name": event.name, "arguments": ""}}]}
    if isinstance(event, CallArguments):
        return {"tool_calls": [{"index": event.index, "function": {"arguments": event.fragment}}]}
    return None
