"""Gemma's framings, one markup between different tags: Gemma 4's
``<|tool_call>call:NAME{key:<|"|>text<|"|>,...}<tool_call|>`` and FunctionGemma's
``<start_function_call>call:NAME{key:<escape>text<escape>}<end_function_call>``."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ember.chat.tools.framing import Framing, _op, _probe
from ember.chat.tools.grammar import CallRule, SchemaRules, _is_count, _lit, _members_in_order, _properties, _rule_part
from ember.chat.tools.reader import (_END, _Args, _Bad, Block, _Ctx, _JsonOut, _loose_scalar, _name_until, _Reader,
                                     _Start, _Step)


_BARE_END = re.compile(r"[,}\]]")


def _gemma_block(open_tag: str, close_tag: str, quote: str, response_tag: str) -> Block:
    """Gemma's ``call:NAME{key:value,...}`` markup, strings between
    ``quote`` marks taken as written (no escapes), keys bare. After its calls
    the model opens the response block (``response_tag``) for the results it
    expects; that is markup too."""

    def key(r: _Reader) -> _Step:
        if (yield from r.optional(quote)):
            parts = []
            while True:
                text, term = yield from r.until((quote,))
                parts.append(text)
                if term:
                    break
            yield from r.skip_ws()
            yield from r.expect(":")
            return "".join(parts)
        k = yield from _name_until(r, ":", consume=True)
        return k

    def value(r: _Reader, out: _JsonOut, k: str | None) -> _Step:
        c = yield from r.peek()
        if c == "{":
            yield from obj(r, out, k)
        elif c == "[":
            r.pos += 1
            yield _Args(out.open("[", k), out.heal())
            yield from r.skip_ws()
            if not (yield from r.optional("]")):
                while True:
                    yield from r.skip_ws()
                    yield from value(r, out, None)
                    yield from r.skip_ws()
                    c = yield from r.peek()
                    r.pos += 1
                    if c == "]":
                        break
                    if c != ",":
                        raise _Bad("expected ',' or ']'")
            yield _Args(out.close(), out.heal())
        elif c == quote[0] and (yield from r.optional(quote)):
            yield _Args(out.str_open(k), out.heal())
            while True:
                text, term = yield from r.until((quote,))
                if text:
                    yield _Args(out.str_chunk(text), out.heal())
                if term:
                    break
            yield _Args(out.str_close(), out.heal())
        else:
            start = r.pos
            while True:
                m = _BARE_END.search(r.text, r.pos)
                if m:
                    r.pos = m.start()
                    break
                r.pos = len(r.text)
                yield from r.wait()
            raw = r.text[start:r.pos]
            if not raw.strip():
                raise _Bad("missing value")
            yield _Args(out.scalar(_loose_scalar(raw), k), out.heal())

    def obj(r: _Reader, out: _JsonOut, k: str | None) -> _Step:
        yield from r.expect("{")
        yield _Args(out.open("{", k), out.heal())
        yield from r.skip_ws()
        if not (yield from r.optional("}")):
            while True:
                yield from r.skip_ws()
                name = yield from key(r)
                yield from r.skip_ws()
                yield from value(r, out, name)
                yield from r.skip_ws()
                c = yield from r.peek()
                r.pos += 1
                if c == "}":
                    break
                if c != ",":
                    raise _Bad("expected ',' or '}'")
        yield _Args(out.close(), out.heal())

    def block(r: _Reader, ctx: _Ctx) -> _Step:
        yield from r.expect(open_tag)
        yield from r.skip_ws()
        yield from r.expect("call:")
        name = yield from _name_until(r, "{", consume=False)
        yield _Start(name)
        yield from obj(r, _JsonOut(), None)
        yield _END
        yield from r.skip_ws()
        yield from r.optional(close_tag)
        yield from r.optional(response_tag)

    return block


def _gemma_values(quote: str) -> list[str]:
    q = _lit(quote)
    return [
        f"val-str ::= {q} [^<]* {q}",
        'val-int ::= "-"? [0-9]+',
        'val-num ::= "-"? [0-9]+ ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?',
        'val-bool ::= "true" | "false"',
        "val-key ::= [A-Za-z_] [A-Za-z0-9_]*",
        'val-obj ::= "{" ( val-key ":" val-any ( "," val-key ":" val-any )* )? "}"',
        'val-arr ::= "[" ( val-any ( "," val-any )* )? "]"',
        'val-any ::= val-str | val-num | val-bool | "null" | val-obj | val-arr',
    ]


def _gemma_value_rule(quote: str, schema: Any) -> str:
    if not isinstance(schema, Mapping):
        return "val-any"
    t = schema.get("type")
    if isinstance(schema.get("enum"), list) and schema["enum"] and all(isinstance(v, str) for v in schema["enum"]):
        return "( " + " | ".join(_lit(quote + v + quote) for v in schema["enum"]) + " )"
    lo, hi = schema.get("minLength"), schema.get("maxLength")
    if t == "string" and (_is_count(lo) or _is_count(hi)):
        # Lengths count characters, as JSON Schema's do.
        lo = lo if _is_count(lo) else 0
        rep = f"{{{lo},{hi}}}" if _is_count(hi) else f"{{{lo},}}"
        return f"{_lit(quote)} [^<]{rep} {_lit(quote)}"
    return {"string": "val-str", "integer": "val-int", "number": "val-num", "boolean": "val-bool"}.get(
        t if isinstance(t, str) else "", "val-any"
    )


def _gemma_call(open_tag: str, close_tag: str, quote: str) -> CallRule:
    # Gemma's template writes arguments with their keys sorted; nested values
    # are held to Gemma's value syntax, not to their schemas.
    def rule(base: str, name: str, params: Mapping[str, Any], schema_rules: SchemaRules) -> list[str]:
        props, required = _properties(params)
        rules, items = [], []
        for j, (key, sub) in enumerate(sorted(props, key=lambda kv: kv[0])):
            m = f"{base}-m{j}-{_rule_part(key)}"
            rules.append(f"{m} ::= {_lit(key + ':')} {_gemma_value_rule(quote, sub)}")
            items.append((m, key in required))
        seq_rules, seq = _members_in_order(f"{base}-seq", items, ",")
        head = _lit(f"{open_tag}call:{name}{{")
        parts = [head] + ([seq] if seq else []) + [_lit("}" + close_tag)]
        return [f"{base} ::= {' '.join(parts)}", *rules, *seq_rules]

    return rule


_GEMMA4_QUOTE = '<|"|>'
GEMMA4 = Framing(
    name="gemma4",
    openers=(_op("<|tool_call>"),),
    block=_gemma_block("<|tool_call>", "<tool_call|>", _GEMMA4_QUOTE, "<|tool_response>"),
    probe=_probe(r"<\|tool_call>call:NAME\{"),
    call_rule=_gemma_call("<|tool_call>", "<tool_call|>", _GEMMA4_QUOTE),
    root_rule=lambda parallel: "call+" if parallel else "call",
    shared_rules=tuple(_gemma_values(_GEMMA4_QUOTE)),
)

FUNCTIONGEMMA = Framing(
    name="functiongemma",
    openers=(_op("<start_function_call>"),),
    block=_gemma_block("<start_function_call>", "<end_function_call>", "<escape>", "<start_function_response>"),
    probe=_probe(r"<start_function_call>call:NAME\{"),
    call_rule=_gemma_call("<start_function_call>", "<end_function_call>", "<escape>"),
    root_rule=lambda parallel: "call+" if parallel else "call",
    shared_rules=tuple(_gemma_values("<escape>")),
)
