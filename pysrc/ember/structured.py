"""Structured output: the grammar a request asks for, compiled once.

A request names at most one of: a GBNF grammar, a JSON Schema, or "any JSON
object". Compiled grammars are kept by their text, so the parse states and
token masks a schema has explored serve every later request that sends it.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from threading import Lock
from typing import Any

from ember import _native
from ember.errors import InvalidRequestError

__all__ = ["Grammar", "GrammarError", "InvalidSchemaError", "compile_grammar", "json_schema_rules"]

Grammar = _native.Grammar
GrammarError = _native.GrammarError
InvalidSchemaError = _native.InvalidSchemaError

#: compiled grammars kept (each with the states it has explored and up to
#: 16 MiB of token masks)
CACHE_SIZE = 32

_cache: OrderedDict[tuple[str, str], Any] = OrderedDict()
_lock = Lock()


def _compiled(kind: str, text: str) -> Any:
    key = (kind, text)
    with _lock:
        g = _cache.get(key)
        if g is not None:
            _cache.move_to_end(key)
            return g
    if kind == "gbnf":
        g = Grammar.from_gbnf(text)
    elif kind == "schema":
        g = Grammar.from_json_schema(text)
    else:
        g = Grammar.json_object()
    with _lock:
        _cache[key] = g
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return g


def compile_grammar(*, grammar: str | None = None, json_schema: Any = None, json_object: bool = False) -> Any:
    """The compiled `Grammar` for what a request asked (at most one of the
    three), or None when it asked for none. Raises `GrammarError` (an
    `InvalidRequestError`) for a grammar or schema that cannot be used."""
    asked = [name for name, v in (("grammar", grammar), ("json_schema", json_schema), ("json_object", json_object))
             if v not in (None, False, "")]
    if len(asked) > 1:
        raise InvalidRequestError(f"{asked[0]}: cannot be combined with {asked[1]}; give one grammar or schema")
    if grammar:
        if not isinstance(grammar, str):
            raise InvalidRequestError("grammar: expected GBNF text")
        return _compiled("gbnf", grammar)
    if json_schema is not None:
        if isinstance(json_schema, bool):
            # `true` is any JSON value; `false` matches nothing.
            if not json_schema:
                raise GrammarError("json_schema: the schema false matches no document")
            json_schema = {}
        if not isinstance(json_schema, dict):
            raise InvalidRequestError("json_schema: expected a JSON Schema object")
        # Key order is kept: it is the order properties are written in.
        return _compiled("schema", json.dumps(json_schema, ensure_ascii=False))
    if json_object:
        return _compiled("object", "")
    return None


def json_schema_rules(schema: dict, root: str) -> str:
    """GBNF rules defining ``root`` as a document of ``schema``, to splice into a larger grammar."""
    return _native.json_schema_rules(json.dumps(schema, ensure_ascii=False), root)
