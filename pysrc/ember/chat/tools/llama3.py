"""Llama 3.1+'s JSON framing: a bare ``{"name": ..., "parameters": {...}}``
object opening the reply, or one after ``<|python_tag|>``; Llama 3.2+ write
several separated by ``;``."""

from __future__ import annotations

from ember.chat.tools.framing import _WS, Framing, _op, _probe
from ember.chat.tools.grammar import _json_object_call
from ember.chat.tools.reader import _Ctx, _json_call, _Reader, _Step


def _llama3_block(r: _Reader, ctx: _Ctx) -> _Step:
    tagged = yield from r.optional("<|python_tag|>")
    yield from r.skip_ws()
    yield from _json_call(r, ctx, check_name=not tagged)
    # Llama 3.2+ separate several calls with ';'.
    yield from r.skip_ws()
    yield from r.optional(";")


LLAMA3_JSON = Framing(
    name="llama3-json",
    openers=(
        _op("<|python_tag|>"),
        _op("{", _WS, '"name"', anchored=True),
        _op("{", _WS, '"type"', anchored=True),
    ),
    block=_llama3_block,
    probe=_probe(r'\{\s*"name"\s*:\s*"NAME"\s*,\s*"(?:parameters|arguments)"\s*:'),
    call_rule=_json_object_call("", "parameters", ""),
    root_rule=lambda parallel: "call",
    parallel=False,
)
