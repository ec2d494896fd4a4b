"""What a chat reply's text becomes on the wire: thought split from answer
(`reasoning_content` vs `content`) and, when tools were offered, calls parsed
out of the answer (`tool_calls`), whether streamed or whole.

The text flows through two stages: the reasoning splitter first (a thought
comes before the answer), then the tool-call parser over the answer. Each
stage holds back only what could still be the start of its markup.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ember.reasoning import ReasoningFormat, ReasoningSplitter

__all__ = ["ChatShaper"]


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
    calls: list[dict] = field(default_factory=list)

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

    def finish(self) -> list[dict]:
        """The deltas held back until the end."""
        out: list[dict] = []
        if self._splitter is not None:
            for kind, piece in self._splitter.finish():
                out += self._reason(piece) if kind == "reasoning" else self._answer(piece)
            if self._splitter.thought_seen and self.thought is None:
                self.thought = []
        if self.tools is not None:
            out += self._tool_deltas(self.tools.finish())
        return out

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
        out: list[dict] = []
        for ev in events:
            if ev.kind == "content":
                self.content.append(ev.text)
                out.append({"content": ev.text})
            elif ev.kind == "call_start":
                self.calls.append({"id": ev.id, "type": "function", "function": {"name": ev.name, "arguments": ""}})
                out.append({"tool_calls": [{"index": ev.index, "id": ev.id, "type": "function",
                                            "function": {"name": ev.name, "arguments": ""}}]})
            elif ev.kind == "arguments":
                self.calls[ev.index]["function"]["arguments"] += ev.text
                out.append({"tool_calls": [{"index": ev.index, "function": {"arguments": ev.text}}]})
        return out

    def message(self) -> dict:
        """The whole reply as an assistant message."""
        msg: dict = {"role": "assistant", "content": "".join(self.content)}
        if self.thought is not None:
            msg["reasoning_content"] = "".join(self.thought)
        if self.calls:
            msg["tool_calls"] = self.calls
        return msg
