"""Hermes' framing, which Qwen2.5, Qwen3, Hermes and many fine-tunes write:
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, a call per tag
(some fine-tunes put a list of calls in one)."""

from __future__ import annotations

from ember.chat.tools.framing import Framing, _op, _probe, _repeat
from ember.chat.tools.grammar import _json_object_call
from ember.chat.tools.reader import _Ctx, _json_call, _json_call_list, _Reader, _Step


def _hermes_block(r: _Reader, ctx: _Ctx) -> _Step:
    yield from r.expect("<tool_call>")
    yield from r.skip_ws()
    if (yield from r.peek()) == "[":  # some fine-tunes put several calls in one tag, as a list
        yield from _json_call_list(r, ctx)
    else:
        yield from _json_call(r, ctx)
    yield from r.skip_ws()
    yield from r.optional("</tool_call>")


HERMES = Framing(
    name="hermes",
    openers=(_op("<tool_call>"),),
    block=_hermes_block,
    probe=_probe(r'<tool_call>\s*\{[^<]*"NAME"'),
    call_rule=_json_object_call("<tool_call>\n", "arguments", "\n</tool_call>"),
    root_rule=_repeat("\n"),
)
