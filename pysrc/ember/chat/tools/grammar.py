"""GBNF writing the framings' grammar writers share: literals, rule names, a
parameter's schema with its tool's $defs, a call written as a JSON object,
members written in order. The grammar of a whole forced call (``call_grammar``)
is in framing.py, beside the Framing it reads."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any


# schema_rules(schema, rule_name) -> GBNF rules defining rule_name as a
# compact JSON document valid against schema; its own rules are named
# rule_name + "-...".
SchemaRules = Callable[[Mapping[str, Any], str], str]


def _lit(s: str) -> str:
    """A GBNF string literal."""
    out = ['"']
    for ch in s:
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ch == "\x7f":
            out.append(f"\\x{ord(ch):02X}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _rule_part(name: str) -> str:
    """A function or argument name as a piece of a GBNF rule name."""
    return re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-") or "x"


def _with_defs(sub: Mapping[str, Any], root: Mapping[str, Any]) -> dict:
    # A parameter's schema written on its own must still resolve the
    # "#/$defs/..." references it makes into the tool's schema.
    out = dict(sub)
    for k in ("$defs", "definitions"):
        if k in root and k not in out:
            out[k] = root[k]
    return out


CallRule = Callable[[str, str, Mapping[str, Any], SchemaRules], list[str]]


def _json_object_call(open_text: str, args_key: str, close_text: str, extra: str = "") -> CallRule:
    """A call written as ``{"name": NAME, "<args_key>": ARGS<extra>}``
    between ``open_text`` and ``close_text``."""

    def rule(base: str, name: str, params: Mapping[str, Any], schema_rules: SchemaRules) -> list[str]:
        head = f'{open_text}{{"name": {json.dumps(name, ensure_ascii=False)}, "{args_key}": '
        tail = f"{extra} {_lit('}' + close_text)}" if extra else _lit("}" + close_text)
        return [f"{base} ::= {_lit(head)} {base}-args {tail}", schema_rules(params, f"{base}-args")]

    return rule


def _properties(params: Mapping[str, Any]) -> tuple[list[tuple[str, Any]], set[str]]:
    props = params.get("properties")
    items = list(props.items()) if isinstance(props, Mapping) else []
    required = params.get("required")
    return items, set(required) if isinstance(required, list) else set()


def _members_in_order(prefix: str, items: list[tuple[str, bool]], sep: str) -> tuple[list[str], str]:
    """Rules for items written in order, separated by ``sep``, each optional
    one free to be left out: the separator goes only between items written.
    Returns the rules and the expression for the whole list."""
    rules: list[str] = []
    n = len(items)
    rest = [""] * (n + 1)  # items k.. after at least one was written
    first = [""] * (n + 1)  # items k.. with none written yet ("" = may be empty)
    first_empty = [True] * (n + 1)
    for k in range(n - 1, -1, -1):
        item, req = items[k]
        more = rest[k + 1]
        body = f"{_lit(sep)} {item}" + (f" {more}" if more else "")
        if k > 0:  # with nothing before it, the first item is never preceded by sep
            r_expr = body if req else f"( {_lit(sep)} {item} )?" + (f" {more}" if more else "")
            rules.append(f"{prefix}-r{k} ::= {r_expr}")
            rest[k] = f"{prefix}-r{k}"
        start = item + (f" {more}" if more else "")
        if req:
            f_expr, empty = start, False
        elif first_empty[k + 1] and not first[k + 1]:
            f_expr, empty = start, True
        else:
            f_expr, empty = f"{start} | {first[k + 1]}", first_empty[k + 1]
        rules.append(f"{prefix}-f{k} ::= {f_expr}")
        first[k], first_empty[k] = f"{prefix}-f{k}", empty
    if n == 0:
        return rules, ""
    return rules, first[0] + ("?" if first_empty[0] else "")


def _is_count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0
