"""What the chat core refuses, with where: a request it cannot build a
prompt from (its field as a path into the chat request, which each API maps
to the field its client sent), and model output it cannot read as a reply."""

from __future__ import annotations

import re

from ember.errors import EmberError, InvalidRequestError

__all__ = ["ChatError", "ModelOutputError", "format_location", "location"]

_STEP = re.compile(r"\.?([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]")


def location(message: str) -> tuple:
    """Where a message of the form "messages[3].content: ..." points:
    ("messages", 3, "content"); () when it names no field."""
    head = message.split(":", 1)[0] if ":" in message else ""
    if not head or " " in head:
        return ()
    loc: list = []
    at = 0
    while at < len(head):
        m = _STEP.match(head, at)
        if m is None:
            return ()
        loc.append(m.group(1) if m.group(1) is not None else int(m.group(2)))
        at = m.end()
    return tuple(loc)


def format_location(loc: tuple) -> str:
    """("messages", 3, "content") as a client writes it: messages[3].content."""
    out = ""
    for step in loc:
        out += f"[{step}]" if isinstance(step, int) else (f".{step}" if out else str(step))
    return out


class ChatError(InvalidRequestError):  # type: ignore[misc]
    """A chat request the core cannot build a prompt from: `detail` says
    what is wrong with the field at `loc`, a path into the chat request
    such as ("messages", 3, "content"); `param` is the name the chat
    route's error reports (the top field, unless told)."""

    def __init__(self, detail: str, loc: tuple = (), param: str | None = None):
        super().__init__(f"{format_location(loc)}: {detail}" if loc else detail)
        self.detail, self.loc = detail, tuple(loc)
        self.param = param if param is not None else (str(loc[0]) if loc else None)

    @classmethod
    def of(cls, message: str) -> "ChatError":
        """The error a message of the form "field: what is wrong" says."""
        loc = location(message)
        return cls(message.split(":", 1)[1].lstrip() if loc else message, loc)


class ModelOutputError(EmberError):  # type: ignore[misc]
    """The model wrote what cannot be read as the reply (a call it left or broke)."""
