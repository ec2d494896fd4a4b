"""The machinery every framing's block parser is written with: the _Reader a
block reads its text through and the steps it yields, JSON read as it arrives
(call objects, raw values) or written piece by piece, and _Ctx, the declared tools."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any


# ---------------------------------------------------------------------------
# Parsing machinery
#
# A framing's calls are read by a "block" parser: a generator written as a
# plain recursive-descent parser over a _Reader. When it needs text that has
# not been generated yet it yields _NEED and is resumed after the next feed,
# so one parser serves streamed and whole output alike. It yields _Start,
# _Args and _END as it reads; it raises _Bad where the text is not (or stops
# being) a call and _Incomplete where the output ended.
# ---------------------------------------------------------------------------


class _Need:
    __slots__ = ()


_NEED = _Need()


class _Bad(Exception):
    """The text is not a call (or stopped being one)."""


class _Incomplete(Exception):
    """The output ended in the middle of markup."""


@dataclass(frozen=True)
class _Start:
    name: str


@dataclass(frozen=True)
class _Args:
    text: str
    # What would close the arguments written so far into valid JSON; "" once
    # they are complete.
    heal: str


class _EndMark:
    __slots__ = ()


_END = _EndMark()

_Step = Generator[Any, None, Any]


class _Reader:
    """The text of one block, read at ``pos``; ``text`` grows as output
    arrives and ``eof`` is set once the output is over."""

    __slots__ = ("text", "pos", "eof")

    def __init__(self, text: str, eof: bool):
        self.text = text
        self.pos = 0
        self.eof = eof

    def wait(self, n: int = 1) -> _Step:
        while len(self.text) - self.pos < n:
            if self.eof:
                raise _Incomplete
            yield _NEED

    def peek(self) -> _Step:
        yield from self.wait()
        return self.text[self.pos]

    def expect(self, lit: str) -> _Step:
        i = 0
        while i < len(lit):
            yield from self.wait()
            seg = self.text[self.pos:self.pos + len(lit) - i]
            if not lit.startswith(seg, i):
                raise _Bad(f"expected {lit!r}")
            self.pos += len(seg)
            i += len(seg)

    def optional(self, lit: str, *, consume: bool = True) -> _Step:
        """Whether the text goes on with ``lit`` (consumed then). At the end
        of the output a cut-off start of ``lit`` counts as ``lit``: it is
        markup the token limit cut, not text."""
        while True:
            seg = self.text[self.pos:self.pos + len(lit)]
            if not lit.startswith(seg):
                return False
            if len(seg) == len(lit) or (self.eof and seg):
                if consume:
                    self.pos += len(seg)
                return True
            if self.eof:
                return False
            yield _NEED

    def skip_ws(self) -> _Step:
        while True:
            t = self.text
            while self.pos < len(t) and t[self.pos].isspace():
                self.pos += 1
            if self.pos < len(t) or self.eof:
                return
            yield _NEED

    def until(self, terms: tuple[str, ...]) -> _Step:
        """Reads toward the earliest of ``terms``. Returns ``(text, term)``
        with the term consumed once one is found, or ``(text, None)`` with
        what can be released now: everything but a tail that could still
        begin a term. Never returns ``("", None)``."""
        while True:
            t, p = self.text, self.pos
            best, which = -1, ""
            for term in terms:
                k = t.find(term, p)
                if k != -1 and (best == -1 or k < best or (k == best and len(term) > len(which))):
                    best, which = k, term
            if best != -1:
                self.pos = best + len(which)
                return t[p:best], which
            end = len(t) - _held(t, p, terms)
            if end > p:
                self.pos = end
                return t[p:end], None
            if self.eof:
                raise _Incomplete
            yield _NEED


@lru_cache(maxsize=64)
def _terms_shape(terms: tuple[str, ...]) -> tuple[int, frozenset[str]]:
    return max(len(term) for term in terms), frozenset(term[0] for term in terms)


def _held(t: str, p: int, terms: tuple[str, ...]) -> int:
    """How many characters at the end of ``t[p:]`` could still begin a term."""
    avail, best = len(t) - p, 0
    longest, firsts = _terms_shape(terms)
    if firsts.isdisjoint(t[max(p, len(t) - longest + 1):]):
        return 0  # the usual case, decided without trying each prefix
    for term in terms:
        for k in range(min(len(term) - 1, avail), best, -1):
            if t.endswith(term[:k]):
                best = k
                break
    return best


# Characters a function name may be written with in markup. Wider than
# OpenAI's rule (dots, slashes) so that a model's namespaced name still parses.
_NAME_RUN = re.compile(r"[\w.\-/]*")
_NAME_LIMIT = 256


def _name_until(r: _Reader, stop: str, *, consume: bool) -> _Step:
    start = r.pos
    while True:
        yield from r.wait()
        j = _NAME_RUN.match(r.text, r.pos).end()
        r.pos = j
        if j - start > _NAME_LIMIT:
            raise _Bad("name too long")
        if j < len(r.text):
            if r.text[j] != stop or j == start:
                raise _Bad("not a function name")
            if consume:
                r.pos = j + 1
            return r.text[start:j]


_KEY_BAD = re.compile(r"[\n<>]")


def _key_until(r: _Reader, stop: str) -> _Step:
    """An argument name up to ``stop`` (consumed): anything on one line."""
    start = r.pos
    while True:
        yield from r.wait()
        t = r.text
        k = t.find(stop, r.pos)
        bad = _KEY_BAD.search(t, r.pos, k if k != -1 else len(t))
        if bad or (k if k != -1 else len(t)) - start > _NAME_LIMIT:
            raise _Bad("not an argument name")
        if k != -1:
            r.pos = k + len(stop)
            key = t[start:k].strip()
            if not key:
                raise _Bad("empty argument name")
            return key
        r.pos = len(t)


def _json_string(r: _Reader) -> _Step:
    """A JSON string, decoded."""
    yield from r.expect('"')
    start = r.pos - 1
    need = 1
    while True:
        yield from r.wait(need)
        t, i = r.text, r.pos
        need = 1
        while i < len(t):
            c = t[i]
            if c == "\\":
                if i + 1 >= len(t):
                    need = 2  # the escaped character is still to come
                    break
                i += 2
                continue
            if c == '"':
                r.pos = i + 1
                try:
                    return json.loads(t[start:i + 1])
                except ValueError:
                    raise _Bad("bad JSON string") from None
            if c < " ":
                raise _Bad("control character in a JSON string")
            i += 1
        r.pos = i
        if i - start > 1 << 20:
            raise _Bad("string too long")


# --- raw JSON values, read as written ---------------------------------------

_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_LITERAL_RUN = re.compile(r"[-+.0-9A-Za-z]*")
_STRING_RUN = re.compile(r'[^"\\\x00-\x1f]*')
_HEX = frozenset("0123456789abcdefABCDEF")

(_S_VALUE, _S_OBJ_FIRST, _S_KEY, _S_COLON, _S_ARR_FIRST, _S_AFTER, _S_STR, _S_LIT, _S_DONE) = range(9)


class _JsonScan:
    """An incremental, validating JSON lexer for one value. Besides where
    the value ends, it tracks the last point where the text so far can be
    closed into valid JSON by appending only (``safe``) and what closes it
    (``safe_heal``): inside a string value, or right after an opening
    bracket or a complete member; not inside a key or after ``:`` or ``,``."""

    __slots__ = ("state", "closers", "key", "esc", "hex", "lit_start", "safe", "safe_heal")

    def __init__(self, start: int):
        self.state = _S_VALUE
        self.closers = ""  # the brackets to close, innermost last
        self.key = False  # the string being read is an object key
        self.esc = False
        self.hex = 0
        self.lit_start = 0
        self.safe = start
        self.safe_heal: str | None = None

    def _mark(self, i: int, quote: str) -> None:
        self.safe = i
        self.safe_heal = quote + self.closers[::-1]

    def _value_done(self, i: int) -> None:
        if self.closers:
            self.state = _S_AFTER
            self._mark(i, "")
        else:
            self.state = _S_DONE
            self.safe, self.safe_heal = i, ""

    def run(self, t: str, i: int) -> int:
        """Consumes ``t`` from ``i``; returns where it stopped: ``len(t)``, or
        just past the value once it is complete."""
        n = len(t)
        while i < n:
            st = self.state
            if st == _S_DONE:
                return i
            if st == _S_STR:
                if self.hex:
                    if t[i] not in _HEX:
                        raise _Bad("bad \\u escape")
                    self.hex -= 1
                    i += 1
                    if not self.hex and not self.key:
                        self._mark(i, '"')
                    continue
                if self.esc:
                    c = t[i]
                    if c == "u":
                        self.hex = 4
                    elif c not in '"\\/bfnrt':
                        raise _Bad("bad escape")
                    self.esc = False
                    i += 1
                    if not self.hex and not self.key:
                        self._mark(i, '"')
                    continue
                j = _STRING_RUN.match(t, i).end()
                if j > i:
                    i = j
                    if not self.key:
                        self._mark(i, '"')
                    continue
                c = t[i]
                i += 1
                if c == '"':
                    if self.key:
                        self.key = False
                        self.state = _S_COLON
                    else:
                        self._value_done(i)
                elif c == "\\":
                    self.esc = True
                else:
                    raise _Bad("control character in a JSON string")
                continue
            if st == _S_LIT:
                j = _LITERAL_RUN.match(t, i).end()
                if j == n:
                    return n  # the literal may go on
                lit = t[self.lit_start:j]
                if lit not in ("true", "false", "null") and not _NUMBER.fullmatch(lit):
                    raise _Bad(f"bad JSON literal {lit!r}")
                i = j
                self._value_done(i)
                continue
            c = t[i]
            if c in " \t\n\r":
                i += 1
                continue
            if st == _S_VALUE or st == _S_ARR_FIRST:
                i += 1
                if st == _S_ARR_FIRST and c == "]":
                    self.closers = self.closers[:-1]
                    self._value_done(i)
                elif c == "{":
                    self.closers += "}"
                    self.state = _S_OBJ_FIRST
                    self._mark(i, "")
                elif c == "[":
                    self.closers += "]"
                    self.state = _S_ARR_FIRST
                    self._mark(i, "")
                elif c == '"':
                    self.state, self.key = _S_STR, False
                    self._mark(i, '"')
                elif c in "-0123456789tfn":
                    self.state, self.lit_start = _S_LIT, i - 1
                else:
                    raise _Bad(f"unexpected {c!r} in JSON")
            elif st == _S_OBJ_FIRST or st == _S_KEY:
                i += 1
                if st == _S_OBJ_FIRST and c == "}":
                    self.closers = self.closers[:-1]
                    self._value_done(i)
                elif c == '"':
                    self.state, self.key = _S_STR, True
                else:
                    raise _Bad(f"unexpected {c!r} in JSON")
            elif st == _S_COLON:
                if c != ":":
                    raise _Bad("expected ':' in JSON")
                i += 1
                self.state = _S_VALUE
            else:  # _S_AFTER
                i += 1
                if c == ",":
                    self.state = _S_KEY if self.closers[-1] == "}" else _S_VALUE
                elif c == self.closers[-1]:
                    self.closers = self.closers[:-1]
                    self._value_done(i)
                else:
                    raise _Bad(f"unexpected {c!r} in JSON")
        return i


def _raw_json(r: _Reader, *, emit: bool) -> _Step:
    """One JSON value as the model wrote it; returns its text. With ``emit``
    it also leaves as _Args fragments, each ending at a safe point."""
    yield from r.wait()
    start = sent = r.pos
    sc = _JsonScan(start)
    while True:
        r.pos = sc.run(r.text, r.pos)
        done = sc.state == _S_DONE
        if emit and sc.safe_heal is not None and sc.safe > sent:
            yield _Args(r.text[sent:sc.safe], sc.safe_heal)
            sent = sc.safe
        if done:
            return r.text[start:r.pos]
        yield from r.wait()


# --- JSON call objects: {"name": ..., "arguments": {...}} --------------------


class _CallState:
    __slots__ = ("name", "announced", "has_args", "held_args")

    def __init__(self) -> None:
        self.name: str | None = None
        self.announced = False
        self.has_args = False
        self.held_args: str | None = None  # arguments written before the name


def _arguments_text(s: str) -> str:
    """Arguments a model wrote as a JSON string holding the object."""
    try:
        value = json.loads(s) if s.strip() else {}
    except (ValueError, RecursionError):
        raise _Bad("arguments string is not JSON") from None
    if not isinstance(value, dict):
        raise _Bad("arguments are not an object")
    return s if s.strip() else "{}"


def _call_member(r: _Reader, ctx: _Ctx, st: _CallState, key: str, *, check_name: bool) -> _Step:
    if key == "name" and st.name is None:
        name = yield from _json_string(r)
        if not _NAME_RUN.fullmatch(name) or not name or len(name) > _NAME_LIMIT:
            raise _Bad("not a function name")
        if check_name and ctx.known is not None and name not in ctx.known:
            raise _Bad(f"{name!r} is not a declared tool")
        st.name = name
        # Bare JSON (no tag around it) is a call only once it also has
        # arguments: {"name": "Bob", "age": 3} is an answer, not a call.
        if not check_name or st.held_args is not None:
            yield from _announce(st)
    elif key == "function" and st.name is None and (yield from r.peek()) == "{":
        # An OpenAI-shaped call, {"type": "function", "function": {"name": ..., ...}}
        yield from _json_members(r, lambda k: _call_member(r, ctx, st, k, check_name=check_name))
    elif key in ("arguments", "parameters") and not st.has_args:
        st.has_args = True
        c = yield from r.peek()
        if c == '"':
            text = _arguments_text((yield from _json_string(r)))
        elif c == "{":
            if st.name is not None:
                yield from _announce(st)
                yield from _raw_json(r, emit=True)
                return
            text = yield from _raw_json(r, emit=False)
        else:
            raise _Bad("arguments are not an object")
        if st.name is None:
            st.held_args = text
        else:
            yield from _announce(st)
            yield _Args(text, "")
    else:
        yield from _raw_json(r, emit=False)  # "id", "type", ...


def _announce(st: _CallState) -> _Step:
    if not st.announced:
        st.announced = True
        assert st.name is not None
        yield _Start(st.name)
        if st.held_args is not None:
            yield _Args(st.held_args, "")


def _json_members(r: _Reader, on_member: Callable[[str], _Step]) -> _Step:
    yield from r.expect("{")
    yield from r.skip_ws()
    if (yield from r.optional("}")):
        return
    while True:
        yield from r.skip_ws()
        key = yield from _json_string(r)
        yield from r.skip_ws()
        yield from r.expect(":")
        yield from r.skip_ws()
        yield from on_member(key)
        yield from r.skip_ws()
        c = yield from r.peek()
        r.pos += 1
        if c == "}":
            return
        if c != ",":
            raise _Bad("expected ',' or '}'")


def _close_call(st: _CallState, *, bare: bool = False) -> _Step:
    if st.name is None:
        raise _Bad("a call without a name")
    if not st.announced:
        if bare:
            raise _Bad("a name without arguments")
        yield from _announce(st)
    if not st.has_args:
        yield _Args("{}", "")
    yield _END


def _json_call(r: _Reader, ctx: _Ctx, *, check_name: bool = False) -> _Step:
    st = _CallState()
    yield from _json_members(r, lambda key: _call_member(r, ctx, st, key, check_name=check_name))
    yield from _close_call(st, bare=check_name)


def _json_call_list(r: _Reader, ctx: _Ctx) -> _Step:
    yield from r.expect("[")
    yield from r.skip_ws()
    if (yield from r.optional("]")):
        return
    while True:
        yield from r.skip_ws()
        yield from _json_call(r, ctx)
        yield from r.skip_ws()
        c = yield from r.peek()
        r.pos += 1
        if c == "]":
            return
        if c != ",":
            raise _Bad("expected ',' or ']'")


# --- JSON written piece by piece (for framings whose arguments are not JSON)


class _JsonOut:
    """Writes a JSON document piece by piece, knowing after each piece what
    would close it. A member's key is only ever written together with the
    start of its value, so every piece ends at a point that can be closed."""

    __slots__ = ("closers", "first", "in_str")

    def __init__(self) -> None:
        self.closers = ""
        self.first: list[bool] = []
        self.in_str = False

    def heal(self) -> str:
        return ('"' if self.in_str else "") + self.closers[::-1]

    def _lead(self, key: str | None) -> str:
        sep = ""
        if self.first:
            sep = "" if self.first[-1] else ", "
            self.first[-1] = False
        return sep + (json.dumps(key, ensure_ascii=False) + ": " if key is not None else "")

    def open(self, bracket: str, key: str | None = None) -> str:
        text = self._lead(key) + bracket
        self.closers += "}" if bracket == "{" else "]"
        self.first.append(True)
        return text

    def close(self) -> str:
        c = self.closers[-1]
        self.closers = self.closers[:-1]
        self.first.pop()
        return c

    def str_open(self, key: str | None = None) -> str:
        self.in_str = True
        return self._lead(key) + '"'

    @staticmethod
    def str_chunk(text: str) -> str:
        return json.dumps(text, ensure_ascii=False)[1:-1]

    def str_close(self) -> str:
        self.in_str = False
        return '"'

    def scalar(self, json_text: str, key: str | None = None) -> str:
        return self._lead(key) + json_text


def _loose_scalar(raw: str) -> str:
    """A bare value as JSON: JSON's own literals, Python's spellings of them
    (Jinja writes ``True``/``None`` for values put through ``string``), else
    the text itself as a string."""
    s = raw.strip()
    if s in ("true", "false", "null") or _NUMBER.fullmatch(s):
        return s
    py = {"True": "true", "False": "false", "None": "null"}.get(s)
    return py if py is not None else json.dumps(s, ensure_ascii=False)


# --- context: the declared tools ---------------------------------------------


@dataclass(frozen=True)
class _Ctx:
    known: frozenset[str] | None
    params: Mapping[str, Mapping[str, Any]]

    @classmethod
    def of(cls, tools: Sequence[Mapping] | None) -> _Ctx:
        if not tools:
            return cls(None, {})
        params: dict[str, Mapping[str, Any]] = {}
        for t in tools:
            fn = t.get("function", t) if isinstance(t, Mapping) else None
            if isinstance(fn, Mapping) and isinstance(fn.get("name"), str):
                p = fn.get("parameters")
                params[fn["name"]] = p if isinstance(p, Mapping) else {}
        return cls(frozenset(params), params)

    def raw_text_param(self, function: str, key: str) -> bool:
        """Whether an XML parameter's value is taken as written rather than
        parsed as JSON: its schema type is string, or nothing says otherwise."""
        props = self.params.get(function, {}).get("properties")
        schema = props.get(key) if isinstance(props, Mapping) else None
        return _is_text_schema(schema)


def _is_text_schema(schema: Any) -> bool:
    if not isinstance(schema, Mapping):
        return True
    t = schema.get("type")
    if isinstance(t, str):
        return t == "string"
    if isinstance(t, list):
        return "string" in t
    if "enum" in schema:
        return all(isinstance(v, str) for v in schema["enum"])
    if "const" in schema:
        return isinstance(schema["const"], str)
    for k in ("anyOf", "oneOf"):
        if isinstance(schema.get(k), list):
            return any(_is_text_schema(s) for s in schema[k])
    return not any(k in schema for k in ("properties", "items"))


# What reads one framing's calls, from where its opener begins.
Block = Callable[[_Reader, _Ctx], _Step]
