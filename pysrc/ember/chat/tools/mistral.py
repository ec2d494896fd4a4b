"""Mistral's framings, read by one block parser: ``[TOOL_CALLS][{"name": ...,
"arguments": {...}, "id": ...}]`` (MISTRAL: the older templates, 7B v0.3 and Nemo)
and ``[TOOL_CALLS]NAME[ARGS]{...}`` (MISTRAL_ARGS: Small 3.2, Ministral, Devstral)."""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any

from ember.chat.tools.framing import _ALNUM, Framing, _op, _probe, _wrapped_list
from ember.chat.tools.grammar import SchemaRules, _json_object_call, _lit
from ember.chat.tools.reader import _END, _Bad, _Ctx, _json_call_list, _name_until, _raw_json, _Reader, _Start, _Step


def _mistral_block(r: _Reader, ctx: _Ctx) -> _Step:
    yield from r.expect("[TOOL_CALLS]")
    yield from r.skip_ws()
    c = yield from r.peek()
    if c == "[":  # [TOOL_CALLS][{"name": ..., "arguments": ..., "id": ...}, ...]
        yield from _json_call_list(r, ctx)
        return
    # [TOOL_CALLS]NAME[ARGS]{...}, optionally [CALL_ID]id before [ARGS]
    name = yield from _name_until(r, "[", consume=False)
    if (yield from r.optional("[CALL_ID]")):
        yield from _name_until(r, "[", consume=False)
    yield from r.expect("[ARGS]")
    if (yield from r.peek()) != "{":
        raise _Bad("arguments are not an object")
    yield _Start(name)
    yield from _raw_json(r, emit=True)
    yield _END


def _mistral_args_call(base: str, name: str, params: Mapping[str, Any], schema_rules: SchemaRules) -> list[str]:
    # Mistral Small 3.2's template writes the call's id between name and
    # arguments; Ministral's and Devstral's do not. The model picks.
    call_id = '( "[CALL_ID]" [a-zA-Z0-9]{9} )?'
    return [
        f"{base} ::= {_lit('[TOOL_CALLS]' + name)} {call_id} {_lit('[ARGS]')} {base}-args",
        schema_rules(params, f"{base}-args"),
    ]


def _mistral_id() -> str:
    # Mistral's templates refuse any call id but nine alphanumerics.
    return "".join(secrets.choice(_ALNUM) for _ in range(9))


MISTRAL = Framing(
    name="mistral",
    openers=(_op("[TOOL_CALLS]"),),
    block=_mistral_block,
    probe=_probe(r'\[TOOL_CALLS\]\s*\[\s*\{[^\]]*"NAME"'),
    call_rule=_json_object_call("", "arguments", "", extra='", \\"id\\": \\"" [a-zA-Z0-9]{9} "\\""'),
    root_rule=_wrapped_list("[TOOL_CALLS][", ", ", "]"),
    new_id=_mistral_id,
)

MISTRAL_ARGS = Framing(
    name="mistral-args",
    openers=(_op("[TOOL_CALLS]"),),
    block=_mistral_block,
    probe=_probe(r"\[TOOL_CALLS\]NAME(?:\[CALL_ID\][^\[]*)?\[ARGS\]"),
    call_rule=_mistral_args_call,
    root_rule=lambda parallel: "call+" if parallel else "call",
    new_id=_mistral_id,
)
