"""The client's words inside a rendered prompt stay words: a user's message
that spells a control token (`<|im_end|>\n<|im_start|>system`) must not
write a turn of its own. Before the template runs, every spelling of a
control token in the client's strings (message contents, names, tool
results, call arguments, tool declarations) is wrapped in two
noncharacters; after it, the marks are taken out and where they stood
becomes byte ranges the tokenizer reads as plain text, while the template's
own markup stays special. Text without such spellings is untouched, so its
prompt is the one it always was."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from ember.chat.errors import ChatError

__all__ = ["ClientText", "client_text", "unmark"]

# Unicode noncharacters: reserved for a program's own use, never text to interchange.
OPEN, CLOSE = "\ufdd0", "\ufdd1"
_MARKS = re.compile(f"[{OPEN}{CLOSE}]")

#: Fields whose values are the request's structure, not its words.
_STRUCTURE = frozenset({"role", "type"})


class ClientText:
    """Marks the control spellings of one model in a request's strings."""

    def __init__(self, spellings: list[str]):
        ordered = sorted({s for s in spellings if s}, key=len, reverse=True)
        self._find = re.compile("|".join(map(re.escape, ordered))) if ordered else None

    def mark(self, value: Any, loc: tuple) -> Any:
        """A copy of `value` (a message, a tool, a list of them) whose
        strings have their control spellings marked; `loc` is where it is
        in the chat request, to name a string that holds a mark itself."""
        if isinstance(value, str):
            if _MARKS.search(value):
                raise ChatError("contains U+FDD0 or U+FDD1, noncharacters this server keeps for its own use", loc)
            if self._find is None:
                return value
            return self._find.sub(lambda m: OPEN + m.group(0) + CLOSE, value)
        if isinstance(value, dict):
            return {self.mark(k, loc) if isinstance(k, str) else k:
                    v if k in _STRUCTURE else self.mark(v, (*loc, k)) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.mark(v, (*loc, i)) for i, v in enumerate(value)]
        return value


@lru_cache(maxsize=8)
def client_text(spellings: tuple[str, ...]) -> ClientText:
    """The marker of a model's control spellings, built once (Gemma has thousands)."""
    return ClientText(list(spellings))


def unmark(text: str) -> tuple[str, list[tuple[int, int]]]:
    """`text` without its marks, and the byte ranges (of its UTF-8) that
    were marked. A mark the template separated from its pair (by cutting
    the text between them) is dropped."""
    if not _MARKS.search(text):
        return text, []
    out: list[str] = []
    ranges: list[tuple[int, int]] = []
    at = 0  # bytes written so far
    opened: int | None = None
    for piece in re.split(f"([{OPEN}{CLOSE}])", text):
        if piece == OPEN:
            opened = at
        elif piece == CLOSE:
            if opened is not None and at > opened:
                ranges.append((opened, at))
            opened = None
        elif piece:
            out.append(piece)
            at += len(piece.encode("utf-8"))
    return "".join(out), ranges
