"""The stream that reads a model's output for calls (``ToolCallStream``) and
its whole-output form (``parse_tool_calls``): it finds where a framing's calls
begin, runs the framing's block parser there and turns what it reads into events.

Parsing rules, for every framing:

* Prose before, between and after calls is ``content``; the whitespace that
  separates prose from markup (and calls from each other) is the markup's and
  is dropped. Output without any call is passed through byte for byte.
* Text that only might become markup (``<tool_c`` at the end of what was
  generated so far) is held back until it is decided, so markup never reaches
  ``content``. Text that starts like a call but turns out not to be one
  before the call's name is whole is content after all.
* A streamed call is announced once its name is whole (index, id, name), then
  its arguments leave as fragments of the JSON text whose concatenation is the
  call's final ``arguments`` string, each fragment ending where the text so far
  can still be closed into valid JSON.
* Cut by the token limit (``finish("length")``): a call whose name is not whole
  is content; one whose name is whole is kept with the arguments read so far,
  closed into valid JSON. Ended by the model inside a call whose arguments are
  incomplete (``finish("stop")``), or markup that stops being a call after its
  name went out, is an error naming the call (``CallError`` /
  ``ToolCallParseError``): half a call is nothing a client can run.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union

from ember.chat.events import CallArguments, CallEnd, CallError, CallStart, TextDelta
from ember.chat.tools.framing import _FULL, _PARTIAL, Framing
from ember.chat.tools.reader import _END, _NEED, _Args, _Bad, _Ctx, _Incomplete, _Reader, _Start, _Step
from ember.errors import EmberError


#: What the call parser emits: the answer's text and each call's events.
ToolEvent = Union[TextDelta, CallStart, CallArguments, CallEnd, CallError]


class ToolCallParseError(EmberError):
    """The model's output broke off or went wrong inside a call whose name had
    already been read: there is no call to return and no text to fall back on."""

    def __init__(self, message: str, *, index: int, name: str | None):
        super().__init__(message)
        self.index = index
        self.name = name


@dataclass(frozen=True)
class ToolCall:
    """One parsed call. ``arguments`` is JSON text (an object)."""

    index: int
    id: str
    name: str
    arguments: str

    def to_openai(self) -> dict:
        """The call as it goes in a message's ``tool_calls``."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


# ---------------------------------------------------------------------------
# The stream
# ---------------------------------------------------------------------------


class ToolCallStream:
    """Reads a model's output for calls as it is generated.

    ``feed(text)`` takes the next piece of output and returns the events it
    completes; ``finish(reason)`` ("stop" or "length") ends the output and
    returns the rest. Events: TextDelta(text); per call CallStart(index,
    id, name), CallArguments(index, fragment)..., CallEnd(index); or a
    final CallError(index, name, message) after which nothing follows.
    ``feed`` after ``finish`` is a RuntimeError.
    ``tools`` are the request's declarations: they type Qwen3-Coder's XML
    values and tell bare JSON calls from JSON answers. ``ids`` makes call ids
    (the framing's shape by default); they are unique within the response.
    """

    def __init__(self, framing: Framing, tools: Sequence[Mapping] | None = None, *,
                 ids: Callable[[], str] | None = None):
        self.framing = framing
        self._ctx = _Ctx.of(tools)
        self._ids = ids or framing.new_id
        self._first_chars = re.compile("[" + re.escape("".join({o.first for o in framing.openers})) + "]")
        self._buf = ""  # text not yet released: from a possible opener, or a block's text
        self._reader: _Reader | None = None
        self._block: _Step | None = None
        self._block_events = False
        self._open: int | None = None  # the call whose arguments are being read
        self._heal = ""
        self._ws = ""  # trailing whitespace held back: content's or markup's, not known yet
        self._after_call = False  # whitespace right after a call is the markup's
        self._spoke = False  # non-whitespace content has gone out
        self._eof = False
        self._reason = "stop"
        self._finished = False
        self._failed = False
        self._content: list[str] = []
        self._calls: list[tuple[str, str, list[str]]] = []  # id, name, argument pieces

    # -- public --------------------------------------------------------------

    def feed(self, text: str) -> list[ToolEvent]:
        if self._finished:
            raise RuntimeError("feed() after finish()")
        if self._failed or not text:
            return []
        self._buf += text
        out: list[ToolEvent] = []
        self._pump(out)
        return _merged(out)

    def finish(self, reason: str = "stop") -> list[ToolEvent]:
        if self._finished:
            return []
        self._finished = True
        if self._failed:
            return []
        self._eof, self._reason = True, reason
        out: list[ToolEvent] = []
        self._pump(out)
        if not self._failed and self._ws and not self._calls:
            self._say(self._ws, out)
        self._ws = ""
        return _merged(out)

    @property
    def content(self) -> str:
        """The content released so far."""
        return "".join(self._content)

    @property
    def calls(self) -> list[ToolCall]:
        """The calls read so far (the last one possibly still open)."""
        return [ToolCall(i, cid, name, "".join(parts)) for i, (cid, name, parts) in enumerate(self._calls)]

    def finish_reason(self, reason: str) -> str:
        """OpenAI's finish_reason for output that ended for ``reason``:
        "tool_calls" once a call was read, except when the token limit cut
        the output ("length" says the calls may be incomplete)."""
        return "tool_calls" if self._calls and reason != "length" else reason

    # -- content -------------------------------------------------------------

    def _say(self, text: str, out: list[ToolEvent]) -> None:
        out.append(TextDelta(text))
        self._content.append(text)

    def _release(self, text: str, out: list[ToolEvent]) -> None:
        if not text:
            return
        if self._after_call:
            text = text.lstrip()
            if not text:
                return
            self._after_call = False
        text = self._ws + text
        body = text.rstrip()
        self._ws = text[len(body):]
        if body:
            self._spoke = True
            self._say(body, out)

    def _find_opener(self) -> tuple[int, bool] | None:
        """Where the earliest call markup begins in the buffer: (index, True)
        when an opener is whole there, (index, False) when the buffer ends in
        what could still become one."""
        buf = self._buf
        lead = len(buf) - len(buf.lstrip())
        for m in self._first_chars.finditer(buf):
            i = m.start()
            partial = False
            for op in self.framing.openers:
                if op.first != buf[i] or (op.anchored and ((self._spoke and not self._after_call) or i > lead)):
                    continue
                status = op.match(buf, i)
                if status == _FULL:
                    return i, True
                partial = partial or status == _PARTIAL
            if partial and not self._eof:
                return i, False
        return None

    # -- the loop --------------------------------------------------------------

    def _pump(self, out: list[ToolEvent]) -> None:
        while not self._failed:
            if self._block is not None:
                if not self._step(out):
                    return
                continue
            hit = self._find_opener()
            if hit is None:
                self._release(self._buf, out)
                self._buf = ""
                return
            i, whole = hit
            self._release(self._buf[:i], out)
            self._buf = self._buf[i:]
            if not whole:
                return
            self._reader = _Reader(self._buf, self._eof)
            self._block = self.framing.block(self._reader, self._ctx)
            self._block_events = False

    def _step(self, out: list[ToolEvent]) -> bool:
        """Runs the block on the text there is; False while it waits for more."""
        r, block = self._reader, self._block
        assert r is not None and block is not None
        r.text, r.eof = self._buf, self._eof
        try:
            while True:
                item = next(block)
                if item is _NEED:
                    return False
                self._on(item, out)
        except StopIteration:
            if self._block_events:
                self._close_block(r.pos)
            else:
                self._rewind(out)  # e.g. {"tool_calls": []}: no call came of it
        except _Bad as e:
            if self._block_events:
                self._fail(f"malformed tool call markup: {e}", out)
            else:
                self._rewind(out)
        except _Incomplete:
            self._cut(out)
        return True

    def _on(self, item: Any, out: list[ToolEvent]) -> None:
        if isinstance(item, _Start):
            if not self._block_events:
                self._ws = ""  # whitespace before a call is the markup's
                self._block_events = True
            index = len(self._calls)
            cid = self._new_id()
            self._calls.append((cid, item.name, []))
            self._open, self._heal = index, "{}"
            out.append(CallStart(index, cid, item.name))
        elif isinstance(item, _Args):
            assert self._open is not None
            if item.text:
                self._calls[self._open][2].append(item.text)
                out.append(CallArguments(self._open, item.text))
            self._heal = item.heal
        elif item is _END:
            assert self._open is not None
            out.append(CallEnd(self._open))
            self._open = None

    def _new_id(self) -> str:
        used = {c[0] for c in self._calls}
        for _ in range(100):
            cid = self._ids()
            if cid not in used:
                return cid
        raise RuntimeError("the call id source keeps repeating itself")

    def _close_block(self, pos: int) -> None:
        self._buf = self._buf[pos:]
        self._block = self._reader = None
        self._after_call = True

    def _rewind(self, out: list[ToolEvent]) -> None:
        # Not a call after all: its first character is content and the rest is
        # scanned again (it may hold the start of a real call).
        self._block = self._reader = None
        self._release(self._buf[0], out)
        self._buf = self._buf[1:]

    def _fail(self, message: str, out: list[ToolEvent]) -> None:
        # The call being read, or (between calls of one block) the next one,
        # whose name is not known.
        index = self._open if self._open is not None else len(self._calls)
        name = self._calls[index][1] if index < len(self._calls) else None
        out.append(CallError(index, name, f"tool call {index} ({name}): {message}"))
        self._failed = True
        self._block = self._reader = None
        self._buf = self._ws = ""

    def _cut(self, out: list[ToolEvent]) -> None:
        """The output ended inside a block. Before the block's first call had
        a name it was text; after, what follows the last whole call (the
        start of another list entry, a closing tag) is markup and is dropped."""
        if not self._block_events:
            self._rewind(out)  # the name never became whole: it was text
            return
        if self._open is not None:
            index = self._open
            if self._heal and self._reason != "length":
                self._fail("the output ended inside the call's arguments", out)
                return
            if self._heal:  # cut by the token limit: close what was read
                self._calls[index][2].append(self._heal)
                out.append(CallArguments(index, self._heal))
            out.append(CallEnd(index))
            self._open = None
        # What is left of the block is markup the end cut off.
        self._close_block(len(self._buf))


def _merged(events: list[ToolEvent]) -> list[ToolEvent]:
    out: list[ToolEvent] = []
    for e in events:
        if isinstance(e, TextDelta) and out and isinstance(out[-1], TextDelta):
            out[-1] = TextDelta(out[-1].text + e.text)
        else:
            out.append(e)
    return out


def parse_tool_calls(
    framing: Framing,
    text: str,
    *,
    tools: Sequence[Mapping] | None = None,
    finish_reason: str = "stop",
    ids: Callable[[], str] | None = None,
) -> tuple[str, list[ToolCall]]:
    """The content ("" when there is none) and calls of a whole output, read
    exactly as ToolCallStream reads it streamed. A call broken after its name
    is a ToolCallParseError."""
    stream = ToolCallStream(framing, tools, ids=ids)
    for e in stream.feed(text) + stream.finish(finish_reason):
        if isinstance(e, CallError):
            raise ToolCallParseError(e.message, index=e.index, name=e.name)
    return stream.content, stream.calls
