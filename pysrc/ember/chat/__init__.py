"""The chat core, free of HTTP: a conversation's prompt (template, tools,
call grammars, the thought) and what the reply's text becomes (content, the
thought, calls). The server's APIs and `ember.Model.chat` both run it."""

from ember.chat.errors import ChatError, ModelOutputError
from ember.chat.output import ChatShaper, end_reason
from ember.chat.prompt import ChatPrompt, ChatSettings, build_prompt

__all__ = ["ChatError", "ChatPrompt", "ChatSettings", "ChatShaper", "ModelOutputError", "build_prompt", "end_reason"]
