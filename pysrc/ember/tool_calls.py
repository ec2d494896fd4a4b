"""Tool calls: OpenAI's ``tools`` / ``tool_calls`` over the markup each model
family was trained to write.

A model calls a function by writing it in its own framing (Hermes'
``<tool_call>{json}</tool_call>``, Qwen3-Coder's XML, Llama 3's bare JSON,
Mistral's ``[TOOL_CALLS]``, Gemma's ``call:NAME{...}``). This module:

* reads which framing a model uses from its chat template (``detect_framing``:
  a call with sentinel values is rendered and the markup around it is
  recognised), falling back to a generic JSON framing described in the system
  prompt when the template has no tool support (``generic_tools_system_prompt``,
  ``apply_generic_tools``), as llama-server does;
* validates a request's ``tools`` / ``tool_choice`` / ``parallel_tool_calls``
  (``validate_tools``) and its tool history (``normalize_tool_messages``);
* writes the GBNF grammar that forces a call in the model's own framing when
  ``tool_choice`` requires one (``call_grammar``);
* parses output into ``tool_calls``, streamed (``ToolCallStream``) or whole
  (``parse_tool_calls``, which is the stream run over the whole text, so the
  two cannot disagree).

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

import ast
import json
import re
import secrets
import string
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal, Union

from ember.chat.events import CallArguments, CallEnd, CallError, CallStart, TextDelta
from ember.errors import EmberError, InvalidRequestError

#: What the call parser emits: the answer's text and each call's events.
ToolEvent = Union[TextDelta, CallStart, CallArguments, CallEnd, CallError]

__all__ = [
    "call_trigger",
    "FRAMINGS",
    "FUNCTIONGEMMA",
    "Framing",
    "GEMMA4",
    "GENERIC",
    "HERMES",
    "LLAMA3_JSON",
    "MISTRAL",
    "MISTRAL_ARGS",
    "QWEN3_CODER",
    "SchemaRules",
    "ToolCall",
    "ToolCallParseError",
    "ToolCallStream",
    "ToolEvent",
    "ToolPlan",
    "ToolRequestError",
    "apply_generic_tools",
    "call_grammar",
    "detect_framing",
    "generic_tools_system_prompt",
    "normalize_tool_messages",
    "parse_tool_calls",
    "validate_tools",
]


class ToolRequestError(InvalidRequestError, ValueError):  # type: ignore[misc]
    """A request whose tools, tool_choice or tool history cannot be served.
    The message starts with the field at fault (``tool_choice: ...``), which
    the server reports as OpenAI's ``param``."""


class ToolCallParseError(EmberError):
    """The model's output broke off or went wrong inside a call whose name had
    already been read: there is no call to return and no text to fall back on."""

    def __init__(self, message: str, *, index: int, name: str | None):
        super().__init__(message)
        self.index = index
        self.name = name


# ---------------------------------------------------------------------------
# Request validation
# ---------------------------------------------------------------------------

# OpenAI's own rule for function names.
_FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")

Choice = Literal["none", "auto", "required", "function"]


@dataclass(frozen=True)
class ToolPlan:
    """What a request asks of tools, validated.

    ``choice`` is "function" when ``tool_choice`` names one; ``name`` is that
    function. ``tools`` are the declarations in OpenAI's shape, each with a
    ``parameters`` object (an empty object schema where the client gave none).
    """

    tools: tuple[dict, ...]
    choice: Choice
    name: str | None
    parallel: bool

    @property
    def parse(self) -> bool:
        """Whether output is read for calls (and the template shown the tools).
        Under "none" the model is not told about the tools at all, so it has
        no reason to write a call that would then reach the client as text."""
        return bool(self.tools) and self.choice != "none"

    @property
    def forced(self) -> bool:
        """Whether a call must be written (constrained decoding)."""
        return self.choice in ("required", "function")

    @property
    def template_tools(self) -> list[dict] | None:
        """The ``tools`` to render the prompt with: None when tools are off."""
        return list(self.tools) if self.parse else None

    def grammar(self, framing: Framing, schema_rules: SchemaRules) -> str | None:
        """The grammar forcing the call, or None when no call is forced."""
        if not self.forced:
            return None
        return call_grammar(framing, self.tools, self.name, self.parallel, schema_rules)


def _check_tool(i: int, tool: Any) -> dict:
    where = f"tools[{i}]"
    if not isinstance(tool, Mapping):
        raise ToolRequestError(f"{where}: expected an object, got {type(tool).__name__}")
    if tool.get("type") != "function":
        raise ToolRequestError(f"{where}.type: only \"function\" tools are supported, got {tool.get('type')!r}")
    fn = tool.get("function")
    if not isinstance(fn, Mapping):
        raise ToolRequestError(f"{where}.function: expected an object")
    name = fn.get("name")
    if not isinstance(name, str) or not _FUNCTION_NAME.fullmatch(name):
        raise ToolRequestError(
            f"{where}.function.name: {name!r} is not a valid function name (1 to 64 of a-z, A-Z, 0-9, _ and -)"
        )
    desc = fn.get("description")
    if desc is not None and not isinstance(desc, str):
        raise ToolRequestError(f"{where}.function.description: expected a string")
    params = fn.get("parameters")
    if params is None:
        params = {"type": "object", "properties": {}}
    elif not isinstance(params, Mapping):
        raise ToolRequestError(f"{where}.function.parameters: expected a JSON schema object")
    elif params.get("type", "object") != "object":
        raise ToolRequestError(f"{where}.function.parameters: a function's parameters must be an object schema")
    elif "properties" in params and not isinstance(params["properties"], Mapping):
        raise ToolRequestError(f"{where}.function.parameters.properties: expected an object")
    out_fn = {k: v for k, v in fn.items() if v is not None}
    out_fn["parameters"] = dict(params)
    return {"type": "function", "function": out_fn}


def validate_tools(tools: Any, tool_choice: Any = None, parallel_tool_calls: Any = None) -> ToolPlan:
    """Checks a request's tool fields and answers the plan: ``auto`` with
    tools, and one call per reply unless ``parallel_tool_calls`` is true
    (llama-server's default: a small model allowed any number of calls in a
    forced reply may never stop writing them), ToolRequestError naming the
    field otherwise."""
    if tools is None:
        tools = []
    if not isinstance(tools, list):
        raise ToolRequestError(f"tools: expected an array, got {type(tools).__name__}")
    checked = tuple(_check_tool(i, t) for i, t in enumerate(tools))
    names: dict[str, int] = {}
    for i, t in enumerate(checked):
        name = t["function"]["name"]
        if name in names:
            raise ToolRequestError(f"tools[{i}].function.name: {name!r} is declared twice (also tools[{names[name]}])")
        names[name] = i

    if parallel_tool_calls is None:
        parallel = False
    elif isinstance(parallel_tool_calls, bool):
        parallel = parallel_tool_calls
    else:
        raise ToolRequestError(f"parallel_tool_calls: expected a boolean, got {type(parallel_tool_calls).__name__}")

    name: str | None = None
    if tool_choice is None:
        choice: Choice = "auto"
    elif isinstance(tool_choice, str):
        if tool_choice not in ("none", "auto", "required"):
            raise ToolRequestError(
                f"tool_choice: unknown value {tool_choice!r} (expected \"none\", \"auto\", \"required\" "
                "or {\"type\": \"function\", \"function\": {\"name\": ...}})"
            )
        choice = tool_choice  # type: ignore[assignment]
    elif isinstance(tool_choice, Mapping):
        fn = tool_choice.get("function")
        if tool_choice.get("type") != "function" or not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise ToolRequestError(
                "tool_choice: expected {\"type\": \"function\", \"function\": {\"name\": ...}}"
            )
        choice, name = "function", fn["name"]
        if name not in names:
            known = ", ".join(names) or "none"
            raise ToolRequestError(f"tool_choice: function {name!r} is not among the tools (declared: {known})")
    else:
        raise ToolRequestError(f"tool_choice: expected a string or an object, got {type(tool_choice).__name__}")

    if choice == "required" and not checked:
        raise ToolRequestError("tool_choice: \"required\" needs tools")
    return ToolPlan(checked, choice, name, parallel)


# ---------------------------------------------------------------------------
# Tool history
# ---------------------------------------------------------------------------


def _arguments_object(where: str, args: Any) -> dict:
    if args is None or (isinstance(args, str) and not args.strip()):
        return {}
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except (ValueError, RecursionError) as e:
            raise ToolRequestError(f"{where}: not valid JSON ({e})") from None
    if not isinstance(args, Mapping):
        raise ToolRequestError(f"{where}: a call's arguments must be a JSON object, got {type(args).__name__}")
    return dict(args)


def normalize_tool_messages(messages: Iterable[Any]) -> list[Any]:
    """Copies ``messages`` for a template: a call's ``function.arguments``
    sent as a JSON string (OpenAI's wire form) becomes the object it holds,
    since templates iterate over arguments or write them with ``tojson``, as
    llama-server hands them over; an empty ``tool_calls`` is dropped (some
    templates test only that the key is there); a ``tool`` message gains the
    ``name`` of the call it answers when it has none (templates that write the
    function's name beside its result read it there).

    A tool message without ``tool_call_id``, or one naming no earlier call, is
    a ToolRequestError: the template could only render it as an answer to
    nothing. An assistant message with calls and null content gets "" (Qwen3's
    template, among others, fails on null). Non-object messages pass through
    for the renderer to refuse.
    """
    out: list[Any] = []
    calls: dict[str, str] = {}  # id -> function name, of the calls seen so far
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            out.append(message)
            continue
        m = dict(message)
        role = m.get("role")
        if "tool_calls" in m:
            tcs = m["tool_calls"]
            if not tcs:
                del m["tool_calls"]
            elif role != "assistant":
                raise ToolRequestError(f"messages[{i}].tool_calls: only assistant messages carry tool calls")
            elif not isinstance(tcs, list):
                raise ToolRequestError(f"messages[{i}].tool_calls: expected an array")
            else:
                fixed = []
                for j, tc in enumerate(tcs):
                    where = f"messages[{i}].tool_calls[{j}]"
                    fn = tc.get("function") if isinstance(tc, Mapping) else None
                    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn["name"]:
                        raise ToolRequestError(f"{where}.function: expected an object with a name")
                    call = dict(tc)
                    call.setdefault("type", "function")
                    args = _arguments_object(f"{where}.function.arguments", fn.get("arguments"))
                    call["function"] = {**fn, "arguments": args}
                    cid = call.get("id")
                    if isinstance(cid, str) and cid:
                        calls[cid] = fn["name"]
                    fixed.append(call)
                m["tool_calls"] = fixed
                if m.get("content") is None:
                    # OpenAI clients send null content beside calls; templates
                    # that test or concatenate content (Qwen3's) fail on it.
                    m["content"] = ""
        if role == "tool":
            tid = m.get("tool_call_id")
            if not isinstance(tid, str) or not tid:
                raise ToolRequestError(
                    f"messages[{i}].tool_call_id: a tool message needs the id of the call it answers"
                )
            if tid not in calls:
                raise ToolRequestError(f"messages[{i}].tool_call_id: {tid!r} answers no earlier tool call")
            if not m.get("name"):
                m["name"] = calls[tid]
        out.append(m)
    return out


# ---------------------------------------------------------------------------
# The generic framing: tools described in the system prompt, calls as JSON
# ---------------------------------------------------------------------------


def _text_of(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, Mapping) and p.get("type") == "text")
    return json.dumps(content, ensure_ascii=False)


def generic_tools_system_prompt(tools: Sequence[Mapping], *, parallel: bool = True) -> str:
    """The system prompt text that teaches a model without tool markup of its
    own the tools and the JSON form ``parse_tool_calls(GENERIC, ...)`` reads."""
    decls = "\n".join(json.dumps(t.get("function", t), ensure_ascii=False) for t in tools)
    many = "Several calls may go in the list." if parallel else "Put exactly one call in the list."
    return (
        "You can call the following tools. Each is described by a JSON object with its name, "
        "what it does, and the JSON schema of its arguments:\n"
        f"{decls}\n\n"
        "To call tools, answer with only a JSON object of this form:\n"
        '{"tool_calls": [{"name": "<tool name>", "arguments": {<the arguments, as the schema describes them>}}]}\n'
        f"{many} A tool's result comes back in a message of the form "
        '{"tool_response": {"name": ..., "content": ...}}. '
        "When no tool is needed, answer in plain text."
    )


def apply_generic_tools(
    messages: Sequence[Any], tools: Sequence[Mapping] | None, *, parallel: bool = True
) -> list[Any]:
    """Rewrites a conversation for a template that knows nothing of tools:
    the tool description goes into the first system message (a new one when
    there is none); an assistant turn's calls become the JSON it would have
    written (after its prose); tool results become user turns holding
    ``{"tool_response": ...}``, consecutive ones merged into one turn so that
    templates insisting on alternating roles accept them. With no tools (a
    follow-up turn under tool_choice "none") only the history is rewritten."""
    out: list[Any] = []
    merged_result = False  # the last message out is a user turn made of tool results
    for m in messages:
        if not isinstance(m, Mapping):
            out.append(m)
            merged_result = False
            continue
        role = m.get("role")
        if role == "assistant" and m.get("tool_calls"):
            calls = []
            for tc in m["tool_calls"]:
                fn = tc.get("function", {}) if isinstance(tc, Mapping) else {}
                args = fn.get("arguments")
                if isinstance(args, str):
                    try:
                        args = json.loads(args) if args.strip() else {}
                    except (ValueError, RecursionError):
                        pass
                calls.append({"name": fn.get("name"), "arguments": args if args is not None else {}})
            prose = _text_of(m.get("content"))
            call_text = json.dumps({"tool_calls": calls}, ensure_ascii=False)
            new = {k: v for k, v in m.items() if k != "tool_calls"}
            new["content"] = f"{prose}\n{call_text}" if prose.strip() else call_text
            out.append(new)
            merged_result = False
        elif role == "tool":
            result = {
                "name": m.get("name"),
                "tool_call_id": m.get("tool_call_id"),
                "content": _text_of(m.get("content")),
            }
            text = json.dumps({"tool_response": {k: v for k, v in result.items() if v is not None}}, ensure_ascii=False)
            if merged_result:
                out[-1] = {**out[-1], "content": out[-1]["content"] + "\n" + text}
            else:
                out.append({"role": "user", "content": text})
                merged_result = True
        else:
            out.append(dict(m))
            merged_result = False
    if tools:
        prompt = generic_tools_system_prompt(tools, parallel=parallel)
        if out and isinstance(out[0], Mapping) and out[0].get("role") in ("system", "developer"):
            first = _text_of(out[0].get("content"))
            out[0] = {**out[0], "content": f"{first}\n\n{prompt}" if first.strip() else prompt}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out


# ---------------------------------------------------------------------------
# Parsed calls and stream events
# ---------------------------------------------------------------------------


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


# --- the blocks, one per family ---------------------------------------------

Block = Callable[[_Reader, _Ctx], _Step]


def _hermes_block(r: _Reader, ctx: _Ctx) -> _Step:
    yield from r.expect("<tool_call>")
    yield from r.skip_ws()
    if (yield from r.peek()) == "[":  # some fine-tunes put several calls in one tag, as a list
        yield from _json_call_list(r, ctx)
    else:
        yield from _json_call(r, ctx)
    yield from r.skip_ws()
    yield from r.optional("</tool_call>")


def _llama3_block(r: _Reader, ctx: _Ctx) -> _Step:
    tagged = yield from r.optional("<|python_tag|>")
    yield from r.skip_ws()
    yield from _json_call(r, ctx, check_name=not tagged)
    # Llama 3.2+ separate several calls with ';'.
    yield from r.skip_ws()
    yield from r.optional(";")


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


def _generic_block(r: _Reader, ctx: _Ctx) -> _Step:
    fenced = yield from r.optional("```")
    if fenced:
        yield from r.optional("json")
        yield from r.skip_ws()
    top = _CallState()

    def member(key: str) -> _Step:
        if key == "tool_calls":
            yield from _json_call_list(r, ctx)
        elif key == "tool_call":
            yield from _json_call(r, ctx)
        else:  # the object is itself the call
            yield from _call_member(r, ctx, top, key, check_name=True)

    yield from _json_members(r, member)
    if top.name is not None or top.has_args:
        yield from _close_call(top, bare=True)
    if fenced:
        yield from r.skip_ws()
        yield from r.optional("```")


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


# --- where calls begin --------------------------------------------------------


class _Ws:
    """Any run of whitespace, in an opener pattern."""


_WS = _Ws()

_FULL, _PARTIAL, _NONE = 2, 1, 0


@dataclass(frozen=True)
class _Opener:
    """How a call's markup begins: literal parts, ``_WS`` and ``("?", lit)``
    (an optional literal). ``anchored``: only at the start of the message,
    or right after another call (untagged JSON framings, where a brace later
    in prose is prose)."""

    parts: tuple[Any, ...]
    anchored: bool = False

    @property
    def first(self) -> str:
        return self.parts[0][0]

    def match(self, s: str, i: int) -> int:
        n = len(s)
        for part in self.parts:
            if part is _WS:
                while i < n and s[i].isspace():
                    i += 1
                if i == n:
                    return _PARTIAL
            elif isinstance(part, tuple):  # optional literal
                lit = part[1]
                seg = s[i:i + len(lit)]
                if seg == lit:
                    i += len(lit)
                elif lit.startswith(seg) and i + len(seg) == n:
                    return _PARTIAL
            else:
                seg = s[i:i + len(part)]
                if seg != part:
                    return _PARTIAL if part.startswith(seg) and i + len(seg) == n else _NONE
                i += len(part)
        return _FULL


def _op(*parts: Any, anchored: bool = False) -> _Opener:
    return _Opener(tuple(parts), anchored)


# ---------------------------------------------------------------------------
# Grammar (GBNF) writing
# ---------------------------------------------------------------------------

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


def _mistral_args_call(base: str, name: str, params: Mapping[str, Any], schema_rules: SchemaRules) -> list[str]:
    # Mistral Small 3.2's template writes the call's id between name and
    # arguments; Ministral's and Devstral's do not. The model picks.
    call_id = '( "[CALL_ID]" [a-zA-Z0-9]{9} )?'
    return [
        f"{base} ::= {_lit('[TOOL_CALLS]' + name)} {call_id} {_lit('[ARGS]')} {base}-args",
        schema_rules(params, f"{base}-args"),
    ]


def _properties(params: Mapping[str, Any]) -> tuple[list[tuple[str, Any]], set[str]]:
    props = params.get("properties")
    items = list(props.items()) if isinstance(props, Mapping) else []
    required = params.get("required")
    return items, set(required) if isinstance(required, list) else set()


def _coder_call(base: str, name: str, params: Mapping[str, Any], schema_rules: SchemaRules) -> list[str]:
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


def _is_count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


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


# ---------------------------------------------------------------------------
# Framings
# ---------------------------------------------------------------------------

_ALNUM = string.ascii_letters + string.digits


def _openai_id() -> str:
    return "call_" + "".join(secrets.choice(_ALNUM) for _ in range(24))


def _mistral_id() -> str:
    # Mistral's templates refuse any call id but nine alphanumerics.
    return "".join(secrets.choice(_ALNUM) for _ in range(9))


@dataclass(frozen=True, eq=False)
class Framing:
    """How one family of models writes tool calls: where a call begins
    (``openers``), how it is read (``block``), how its template's rendering
    of a call is recognised (``probe``), how a forced call is written as a
    grammar (``call_rule``, ``root_rule``), and the shape of its call ids."""

    name: str
    openers: tuple[_Opener, ...]
    block: Block
    probe: re.Pattern[str]
    call_rule: CallRule
    root_rule: Callable[[bool], str]
    new_id: Callable[[], str] = _openai_id
    # Whether a response may hold several calls (Llama 3.1's template
    # refuses to render more than one).
    parallel: bool = True
    # Rules the calls share, added once to a grammar.
    shared_rules: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return f"Framing({self.name!r})"


# The sentinel call rendered to recognise a template's framing; values no
# template would write on its own.
_PROBE_USER = "Which tool answers probe 7f3a?"
_PROBE_NAME = "probe_fn_7f3a"
_PROBE_KEY = "probe_key_7f3a"
_PROBE_VALUE = "probe value 7f3a"
_PROBE_ID = "pr0be7f3a"  # nine alphanumerics, for Mistral's check

_N = re.escape(_PROBE_NAME)


def _probe(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern.replace("NAME", _N))


def _repeat(sep: str) -> Callable[[bool], str]:
    return lambda parallel: f"call ( {_lit(sep)} call )*" if parallel else "call"


def _wrapped_list(open_text: str, sep: str, close_text: str) -> Callable[[bool], str]:
    def root(parallel: bool) -> str:
        more = f" ( {_lit(sep)} call )*" if parallel else ""
        return f"{_lit(open_text)} call{more} {_lit(close_text)}"

    return root


HERMES = Framing(
    name="hermes",
    openers=(_op("<tool_call>"),),
    block=_hermes_block,
    probe=_probe(r'<tool_call>\s*\{[^<]*"NAME"'),
    call_rule=_json_object_call("<tool_call>\n", "arguments", "\n</tool_call>"),
    root_rule=_repeat("\n"),
)

QWEN3_CODER = Framing(
    name="qwen3-coder",
    openers=(_op("<tool_call>"), _op("<function=")),
    block=_coder_block,
    probe=_probe(r"<function=NAME>\s*<parameter="),
    call_rule=_coder_call,
    root_rule=_repeat("\n"),
)

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

GENERIC = Framing(
    name="generic",
    openers=(
        _op("{", _WS, '"tool_call'),
        _op("{", _WS, '"name"'),
        _op("```", ("?", "json"), _WS, "{", _WS, '"tool_call'),
        _op("```", ("?", "json"), _WS, "{", _WS, '"name"'),
    ),
    block=_generic_block,
    probe=_probe(r'\{\s*"tool_calls?"\s*:'),
    call_rule=_json_object_call("", "arguments", ""),
    root_rule=_wrapped_list('{"tool_calls": [', ", ", "]}"),
)

FRAMINGS: dict[str, Framing] = {
    f.name: f for f in (HERMES, QWEN3_CODER, LLAMA3_JSON, MISTRAL, MISTRAL_ARGS, GEMMA4, FUNCTIONGEMMA, GENERIC)
}

# The order framings are recognised in: the most specific markup first
# (Qwen3-Coder's call is inside a <tool_call> too; Hermes' and Mistral's
# hold the same {"name": ...} object that Llama 3 writes bare).
_DETECT_ORDER = (QWEN3_CODER, HERMES, GEMMA4, FUNCTIONGEMMA, MISTRAL_ARGS, MISTRAL, GENERIC, LLAMA3_JSON)


# ---------------------------------------------------------------------------
# Detection
# ---------------------------------------------------------------------------

Render = Callable[[list[dict], list[dict] | None], str]

_PROBE_TOOLS = [{
    "type": "function",
    "function": {
        "name": _PROBE_NAME,
        "description": "Answers the probe.",
        "parameters": {"type": "object", "properties": {_PROBE_KEY: {"type": "string"}}, "required": [_PROBE_KEY]},
    },
}]


def _probe_messages(content: str | None) -> list[dict]:
    return [
        {"role": "user", "content": _PROBE_USER},
        {"role": "assistant", "content": content, "tool_calls": [{
            "id": _PROBE_ID, "type": "function",
            "function": {"name": _PROBE_NAME, "arguments": {_PROBE_KEY: _PROBE_VALUE}},
        }]},
    ]


def _classify(rendered: str) -> Framing:
    # Declarations come before the user's turn in every template; the call is
    # after it. Reading only what follows keeps a declared name from counting.
    k = rendered.rfind(_PROBE_USER)
    tail = rendered[k + len(_PROBE_USER):] if k != -1 else rendered
    if _PROBE_NAME not in tail:
        return GENERIC  # the template ignores tool_calls
    for framing in _DETECT_ORDER:
        if framing.probe.search(tail):
            return framing
    return GENERIC  # markup this module cannot read: ask for JSON instead


def call_trigger(framing: Framing) -> str | None:
    """The fixed text a call opens with in ``framing``, which its call
    grammar also starts with: what a watched call (``tool_choice`` auto)
    waits for before holding the output to the grammar. None for framings
    whose calls open with bare JSON, which prose can also start with."""
    op = framing.openers[0]
    if op.anchored or len(op.parts) != 1 or not isinstance(op.parts[0], str):
        return None
    return op.parts[0]


def detect_framing(render: Render) -> Framing:
    """The framing a chat template writes calls in. ``render(messages,
    tools)`` renders a conversation to prompt text with the model's template.
    A sentinel call is rendered and the markup around it recognised; a
    template that fails on it, ignores it or writes unknown markup gets
    GENERIC."""
    for content in (None, ""):  # some templates concatenate content and fail on None
        try:
            rendered = render(_probe_messages(content), _PROBE_TOOLS)
        except Exception:
            continue
        return _classify(rendered)
    return GENERIC


# ---------------------------------------------------------------------------
# Grammar for forced calls
# ---------------------------------------------------------------------------


def call_grammar(
    framing: Framing,
    tools: Sequence[Mapping[str, Any]],
    forced_name: str | None,
    parallel: bool,
    schema_rules: SchemaRules,
) -> str:
    """A GBNF grammar (rule ``root``) that admits only a call (or, with
    ``parallel`` where the framing allows several, calls) in ``framing``'s
    markup: of ``forced_name``, or of any of ``tools`` when it is None, its
    arguments held to the tool's ``parameters`` by ``schema_rules``.

    Rules of tool i are named ``tool-<i>-<sanitised name>...``, so names that
    sanitise alike still get distinct rules."""
    chosen = []
    for i, tool in enumerate(tools):
        fn = tool.get("function", tool)
        if forced_name is None or fn.get("name") == forced_name:
            chosen.append((i, fn))
    if not chosen:
        raise ValueError(f"no tool named {forced_name!r}" if forced_name else "no tools")
    rules: list[str] = []
    alts = []
    for i, fn in chosen:
        base = f"tool-{i}-{_rule_part(fn['name'])}"
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        rules.extend(framing.call_rule(base, fn["name"], params, schema_rules))
        alts.append(base)
    head = [f"root ::= {framing.root_rule(parallel and framing.parallel)}", f"call ::= {' | '.join(alts)}"]
    return "\n".join([*head, *(r.strip() for r in rules if r.strip()), *framing.shared_rules]) + "\n"


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
