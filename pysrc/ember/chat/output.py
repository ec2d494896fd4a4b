"""What a chat reply's text becomes: thought split from answer and, when
tools were offered, calls parsed out of the answer, as typed events
(`ember.chat.events`) whether streamed or whole; the same for every API's
route and `ember.Model.chat`.

The text flows through two stages: the reasoning splitter first (a thought
comes before the answer), then the tool-call parser over the answer. Each
stage holds back only what could still be the start of its markup.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ember.chat.errors import ModelOutputError
from ember.chat.events import CallError, ChatEvent, End, Stop, TextDelta, ThoughtDelta
from ember.reasoning import ReasoningFormat, ReasoningSplitter

__all__ = ["ChatShaper"]


def _parser_end(c) -> str:
    """How the call parser reads the end of `c`: a stop string cuts the text
    where the client asked, as the token limit does, so a call it cut short
    is closed with what was read, not called malformed."""
    return "length" if c.stop_string is not None or c.cut else "stop"


@dataclass
class ChatShaper:
    #: the thought markers, when the template uses some and the request splits
    reasoning: ReasoningFormat | None = None
    #: the prompt left a thought open
    in_thought: bool = False
    #: a tool-call stream parser (`ember.chat.tools.ToolCallStream`), when tools were offered
    tools: Any = None
    #: llama-server's "deepseek-legacy": content keeps the raw text as well
    raw_content: bool = False

    content: list[str] = field(default_factory=list)
    thought: list[str] | None = None
    #: why the reply ended, once it has
    stop: Stop | None = None

    def __post_init__(self) -> None:
        self._splitter = ReasoningSplitter(self.reasoning, self.in_thought) if self.reasoning else None

    def feed(self, text: str) -> list[ChatEvent]:
        """The events `text` releases."""
        if not text:
            return []
        if self._splitter is None:
            return self._answer(text)
        out: list[ChatEvent] = []
        for kind, piece in self._splitter.feed(text):
            out += self._reason(piece) if kind == "reasoning" else self._answer(piece)
        if self.raw_content:
            self.content.append(text)
            out.append(TextDelta(text))
        return out

    def finish(self, completion) -> list[ChatEvent]:
        """The events held back until the end of `completion`, then its `End`."""
        out: list[ChatEvent] = []
        if self._splitter is not None:
            for kind, piece in self._splitter.finish():
                out += self._reason(piece) if kind == "reasoning" else self._answer(piece)
            if self._splitter.thought_seen and self.thought is None:
                self.thought = []
        if self.tools is not None:
            out += self._tool_events(self.tools.finish(_parser_end(completion)))
        self.stop = Stop.of(completion, self.called)
        out.append(End(self.stop, completion.stop_string if self.stop is Stop.STOP_SEQUENCE else None))
        return out

    def read_whole(self, completion) -> list[ChatEvent]:
        """The events of a whole completion, read at once: its text, then its end."""
        return self.feed(completion.text) + self.finish(completion)

    def _reason(self, piece: str) -> list[ChatEvent]:
        if self.thought is None:
            self.thought = []
        self.thought.append(piece)
        return [ThoughtDelta(piece)]

    def _answer(self, piece: str) -> list[ChatEvent]:
        if self.raw_content and self._splitter is not None:
            return []  # the raw text has been passed on whole
        if self.tools is None:
            self.content.append(piece)
            return [TextDelta(piece)]
        return self._tool_events(self.tools.feed(piece))

    def _tool_events(self, events: list) -> list[ChatEvent]:
        for ev in events:
            if isinstance(ev, CallError):
                # The model left a call it had begun, or broke its markup:
                # what it meant cannot be told, and guessing would be worse.
                raise ModelOutputError(f"the model's tool call {ev.name or ev.index} is malformed: {ev.message}")
            if isinstance(ev, TextDelta):
                self.content.append(ev.text)
        return events

    @property
    def called(self) -> bool:
        """Whether the reply holds a tool call."""
        return self.tools is not None and bool(self.tools.calls)

    def message(self) -> dict:
        """The whole reply as an assistant message."""
        msg: dict = {"role": "assistant", "content": "".join(self.content)}
        if self.thought is not None:
            msg["reasoning_content"] = "".join(self.thought)
        if self.called:
            msg["tool_calls"] = [c.to_openai() for c in self.tools.calls]
            if not msg["content"]:
                msg["content"] = None  # as OpenAI answers a reply that is only calls
        return msg
