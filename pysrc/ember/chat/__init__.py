"""The chat core, free of HTTP: a conversation's prompt (template, tools,
call grammars, the thought) and what the reply's text becomes (content, the
thought, calls) as typed events. The server's APIs and `ember.Model.chat`
both run it."""

from ember.chat.errors import ChatError, ModelOutputError
from ember.chat.events import (CallArguments, CallEnd, CallStart, ChatEvent, End, Stop, TextDelta, ThoughtDelta,
                               chat_delta)
from ember.chat.output import ChatShaper
from ember.chat.prompt import ChatPrompt, build_prompt
from ember.chat.request import AnswerFormat, ChatRequest

__all__ = ["AnswerFormat", "CallArguments", "CallEnd", "CallStart", "ChatError", "ChatEvent", "ChatPrompt",
           "ChatRequest", "ChatShaper", "End", "ModelOutputError", "Stop", "TextDelta", "ThoughtDelta", "build_prompt", "chat_delta"]
