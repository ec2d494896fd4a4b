"""A chat request in no API's terms: the conversation, the tools, the tool
choice, the answer's format and the reasoning settings. Each API's adapter
builds one from its own request (and `ember.Model.chat` from its keywords);
the chat core builds the prompt from it, and what it refuses is a `ChatError`
whose location is a path into this request, such as ("messages", 3,
"content"), which the adapter maps back to the field its client sent.

Messages and tools are in the form chat templates read them (Hugging Face's
convention: `role`/`content`/`tool_calls`/`tool_call_id`/`reasoning_content`,
and `{"type": "function", "function": {...}}` tools), because that is the
language the template speaks, whatever the API."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["AnswerFormat", "ChatRequest"]


@dataclass(frozen=True)
class AnswerFormat:
    """The grammar the answer is held to (a schema's, any JSON object's, or
    the client's own GBNF), compiled by the adapter that read its field."""

    grammar: Any
    #: the client's own GBNF, which may write the thought; a JSON answer
    #: cannot hold one, so a thought the prompt opened is closed first
    gbnf: bool = False


@dataclass
class ChatRequest:
    messages: list[dict] = field(default_factory=list)
    tools: Any = None
    #: "auto", "none", "required" or {"type": "function", "function": {"name": ...}}
    tool_choice: Any = None
    #: None: one call per reply (llama-server's default)
    parallel_tool_calls: Any = None
    answer: AnswerFormat | None = None
    #: the template's own switches (enable_thinking, ...)
    chat_template_kwargs: Any = None
    #: "low", "medium", "high" (or "none"), as the templates that take it read it
    reasoning_effort: Any = None
    #: tokens of thought before the close is written for the model (-1: no limit, 0: none)
    reasoning_budget: Any = None
    #: written before that close, as the thought's last words (llama-server's reasoning_budget_message)
    reasoning_budget_message: Any = None
    #: how the thought is returned (llama-server's reasoning_format)
    reasoning_format: Any = None
    #: the thought may be ended while it runs (llama-server's reasoning_control)
    reasoning_control: bool = False
