"""Qwen3-Coder's XML framing: ``<tool_call><function=NAME><parameter=KEY>
value</parameter>...</function></tool_call>``, each value raw text on lines of
its own, typed by the tool's schema (a string parameter is taken as written)."""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping
from typing import Any

from ember.chat.tools.framing import Framing, _op, _probe, _repeat
from ember.chat.tools.grammar import SchemaRules, _is_count, _lit, _properties, _rule_part, _with_defs
from ember.chat.tools.reader import (_END, _Args, _Ctx, _is_text_schema, _JsonOut, _key_until, _loose_scalar,
                                     _name_until, _Reader, _Start, _Step)
from ember.chat.tools.request import ToolRequestError


_CODER_TERMS = ("\n</parameter>", "</parameter>", "\n<parameter=", "<parameter=", "\n</function>", "</function>")


def _coder_block(r: _Reader, ctx: _Ctx) -> _Step:
    # Qwen3-Coder sometimes leaves out <tool_call> before its first call
    # (and still writes the closing tag).
    yield from r.optional("<tool_call>")
    while True:
        yield from r.skip_ws()
        yield from r.expect("<function=")
        name = yield from _name_until(r, ">", consume=True)
        yield _Start(name)
        out = _JsonOut()
        yield _Args(out.open("{"), out.heal())
        while True:
            yield from r.skip_ws()
            if (yield from r.optional("</function>")):
                break
            yield from r.expect("<parameter=")
            key = yield from _key_until(r, ">")
            # The value sits on lines of its own: one newline after the tag
            # and one before the closing tag are the markup's.
            yield from r.optional("\n")
            term: str | None = None
            if ctx.raw_text_param(name, key):
                yield _Args(out.str_open(key), out.heal())
                while term is None:
                    text, term = yield from r.until(_CODER_TERMS)
                    if text:
                        yield _Args(out.str_chunk(text), out.heal())
                yield _Args(out.str_close(), out.heal())
            else:
                parts = []
                while term is None:
                    text, term = yield from r.until(_CODER_TERMS)
                    parts.append(text)
                raw = "".join(parts)
                value = "null" if not raw.strip() else _coder_value(raw)
                yield _Args(out.scalar(value, key), out.heal())
            tag = term.lstrip("\n")
            if tag != "</parameter>":  # a missing </parameter>: the next tag is read again
                r.pos -= len(tag)
        yield _Args(out.close(), out.heal())
        yield _END
        yield from r.skip_ws()
        if not (yield from r.optional("<function=", consume=False)):
            break
    yield from r.optional("</tool_call>")


def _coder_value(raw: str) -> str:
    """A non-string XML value as JSON. Qwen3-Coder's template writes such
    values with Jinja's ``string`` filter, i.e. as Python reprs (``True``,
    ``{'a': 1}``), which is what the model learned to write back."""
    try:
        return json.dumps(json.loads(raw), ensure_ascii=False)
    except (ValueError, RecursionError):
        pass
    try:
        value = ast.literal_eval(raw.strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return _loose_scalar(raw)
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):  # a set, bytes, a complex number: keep the text
        return _loose_scalar(raw)


def _coder_call(base: str, name: str, params: Mapping[str, Any], schema_rules: SchemaRules) -> list[str]:
    # Values written as raw text never meet the schema compiler, so the whole
    # schema meets it once: a malformed one, or a keyword outside the subset,
    # is refused here as the JSON framings refuse it, not read as "any text".
    schema_rules(params, f"{base}-checked")
    rules = []
    seq = []
    props, required = _properties(params)
    for j, (key, sub) in enumerate(props):
        p = f"{base}-p{j}-{_rule_part(key)}"
        if _is_text_schema(sub):
            value = _raw_text_rule(sub, f"{name}.{key}")
        else:
            value = f"{p}-value"
            rules.append(schema_rules(_with_defs(sub if isinstance(sub, Mapping) else {}, params), value))
        open_tag, close_tag = _lit(f"<parameter={key}>\n"), _lit("\n</parameter>\n")
        rules.append(f"{p} ::= {open_tag} {value} {close_tag}")
        seq.append(p if key in required else p + "?")
    head = _lit(f"<tool_call>\n<function={name}>\n")
    rules.insert(0, f"{base} ::= {' '.join([head, *seq, _lit('</function>' + chr(10) + '</tool_call>')])}")
    return rules


def _raw_text_rule(schema: Any, where: str) -> str:
    """A string parameter's value as Qwen3-Coder's framing writes it: raw
    text up to the closing tag (no "<", so it cannot run into it), held to
    the schema's string enum, const and lengths (in characters, as JSON
    Schema counts them). A pattern or format it cannot hold raw text to is
    refused, as any schema outside the call grammar's subset is: a watched
    call is then parsed unwatched, a forced one refused."""
    if not isinstance(schema, Mapping):
        return "[^<]*"
    for key in ("pattern", "format"):
        if key in schema and not ("enum" in schema or "const" in schema):
            raise ToolRequestError(f"{where}: a {key} cannot be held in this template's call framing, which writes "
                                   "the value as raw text")
    enum = schema.get("enum")
    if isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
        return "( " + " | ".join(_lit(v) for v in enum) + " )"
    if isinstance(schema.get("const"), str):
        return _lit(schema["const"])
    lo, hi = schema.get("minLength"), schema.get("maxLength")
    if schema.get("type") == "string" and (_is_count(lo) or _is_count(hi)):
        lo = lo if _is_count(lo) else 0
        return f"[^<]{{{lo},{hi}}}" if _is_count(hi) else f"[^<]{{{lo},}}"
    return "[^<]*"


QWEN3_CODER = Framing(
    name="qwen3-coder",
    openers=(_op("<tool_call>"), _op("<function=")),
    block=_coder_block,
    probe=_probe(r"<function=NAME>\s*<parameter="),
    call_rule=_coder_call,
    root_rule=_repeat("\n"),
)
