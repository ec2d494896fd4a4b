"""What defines a framing: the ``Framing`` record, the helpers its definition
is written with (openers, probes, root rules, call ids), and ``call_grammar``,
which writes a forced call's grammar from a Framing's rules. call_grammar sits
here, not in grammar.py, because it reads a Framing and this module builds on
grammar.py's helpers: the other way round would be an import cycle."""

from __future__ import annotations

import re
import secrets
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ember.chat.tools.grammar import CallRule, SchemaRules, _lit, _rule_part
from ember.chat.tools.reader import Block


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


_ALNUM = string.ascii_letters + string.digits


def _openai_id() -> str:
    return "call_" + "".join(secrets.choice(_ALNUM) for _ in range(24))


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
