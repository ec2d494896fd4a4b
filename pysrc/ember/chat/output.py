"""What a chat reply's text becomes: thought split from answer
(`reasoning_content` vs `content`) and, when tools were offered, calls parsed
out of the answer (`tool_calls`), whether streamed or whole; the same for
the server's routes and `ember.Model.chat`.

The text flows through two stages: the reasoning splitter first (a thought
comes before the answer), then the tool-call parser over the answer. Each
stage holds back only what could still be the start of its markup.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ember.chat.errors import ModelOutputError
from ember.reasoning import ReasoningFormat, ReasoningSplitter

__all__ = ["ChatShaper", "end_reason"]


def end_reason(c) -> str:
    """What ended a completion's text, as `ChatShaper.finish` reads it: a stop
    string cuts the text where the client asked, as the token limit does, so
    a call it cut short is closed with what was read, not called malformed."""
    return "length" if c.stop_string is not None or c.cut else "stop"


@dataclass
class ChatShaper:
    #: the thought markers, when the template uses some and the request splits
    reasoning: ReasoningFormat | None = None
    #: the prompt left a thought open
    in_thought: bool = False
    #: a tool-call stream parser (`ember.tool_calls.ToolCallStream`), when tools were offered
    tools: Any = None
    #: llama-server's "deepseek-legacy": content keeps the raw text as well
    raw_content: bool = False

    content: list[str] = field(default_factory=list)
    thought: list[str] | None = None

    def __post_init__(self) -> None:
        self._splitter = ReasoningSplitter(self.reasoning, self.in_thought) if self.reasoning else None

    def feed(self, text: str) -> list[dict]:
        """The deltas `text` releases (each a chat delta's fields)."""
        if not text:
            return []
        if self._splitter is None:
            return self._answer(text)
        out: list[dict] = []
        for kind, piece in self._splitter.feed(text):
            out += self._reason(piece) if kind == "reasoning" else self._answer(piece)
        if self.raw_content:
            self.content.append(text)
            out.append({"content": text})
        return out

    def finish(self, reason: str = "stop") -> list[dict]:
        """The deltas held back until the end; `reason` is the generation's
        ("length" when the token limit cut it, which a cut call reads)."""
        out: list[dict] = []
        if self._splitter is not None:
            for kind, piece in self._splitter.finish():
                out += self._reason(piece) if kind == "reasoning" else self._answer(piece)
            if self._splitter.thought_seen and self.thought is None:
                self.thought = []
        if self.tools is not None:
            out += self._tool_deltas(self.tools.finish(reason))
        return out

    def read_whole(self, c) -> list[dict]:
        """The deltas of a whole completion `c`, read at once: its text, then its end."""
        return self.feed(c.text) + self.finish(end_reason(c))

    def _reason(self, piece: str) -> list[dict]:
        if self.thought is None:
            self.thought = []
        self.thought.append(piece)
        return [{"reasoning_content": piece}]

    def _answer(self, piece: str) -> list[dict]:
        if self.raw_content and self._splitter is not None:
            return []  # the raw text has been passed on whole
        if self.tools is None:
            self.content.append(piece)
            return [{"content": piece}]
        return self._tool_deltas(self.tools.feed(piece))

    def _tool_deltas(self, events: list) -> list[dict]:
        from ember.tool_calls import ContentDelta, ToolCallError, openai_delta

        out: list[dict] = []
        for ev in events:
            if isinstance(ev, ToolCallError):
                # The model left a call it had begun, or broke its markup:
                # what it meant cannot be told, and guessing would be worse.
                raise ModelOutputError(f"the model's tool call {ev.name or ev.index} is malformed: {ev.message}")
            if isinstance(ev, ContentDelta):
                self.content.append(ev.text)
            delta = openai_delta(ev)
            if delta:
                out.append(delta)
        return out

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
