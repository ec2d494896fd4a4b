"""What the chat core refuses, with where: a request it cannot build a
prompt from, and model output it cannot read as a reply."""

from __future__ import annotations

import re

from ember.errors import EmberError, InvalidRequestError

__all__ = ["ChatError", "ModelOutputError", "location"]

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


class ChatError(InvalidRequestError):  # type: ignore[misc]
    """A chat request the core cannot build a prompt from. The message starts
    with the field it is about; `loc` is that field as a path, and `param`
    the name an API's error reports (the top field, unless told)."""

    def __init__(self, message: str, loc: tuple | None = None, param: str | None = None):
        super().__init__(message)
        self.loc = location(message) if loc is None else loc
        self.param = param if param is not None else (str(self.loc[0]) if self.loc else None)


class ModelOutputError(EmberError):  # type: ignore[misc]
    """The model wrote what cannot be read as the reply (a call it left or broke)."""
