"""The grammars that force a call (`ember.chat.tools.framing`'s call_grammar,
written with `ember.chat.tools.grammar`'s helpers): each framing's grammar
admits its own markup, with the arguments held to the tool's schema."""

from __future__ import annotations

import re

import pytest

from ember.chat import tools as tc
from ember.errors import InvalidRequestError
from ember.structured import json_schema_rules
from tool_cases import TOOLS, parse


def json_rules(schema, name):
    """A stand-in for the engine's schema compiler: any JSON object (or any
    JSON value for a non-object schema), compact."""
    top = f"{name}-obj" if schema.get("type") == "object" else f"{name}-val"
    return "\n".join([
        f"{name} ::= {top}",
        f'{name}-obj ::= "{{" ( {name}-str ": " {name}-val ( ", " {name}-str ": " {name}-val )* )? "}}"',
        f'{name}-arr ::= "[" ( {name}-val ( ", " {name}-val )* )? "]"',
        f'{name}-val ::= {name}-obj | {name}-arr | {name}-str | {name}-num | "true" | "false" | "null"',
        f'{name}-str ::= "\\"" ( [^"\\\\] | "\\\\" ["\\\\/bfnrt] )* "\\""',
        f'{name}-num ::= "-"? [0-9]+ ( "." [0-9]+ )?',
    ])


class Gbnf:
    """Just enough of a GBNF reader and recogniser to check the grammars'
    shape: rule names, literals with escapes, classes, groups, alternation,
    * + ? {m} {m,n}."""

    ESC = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"', "]": "]", "[": "[", "-": "-", "^": "^", "/": "/"}

    def __init__(self, text):
        self.rules = {}
        for line in text.splitlines():
            if not line.strip():
                continue
            name, body = line.split("::=", 1)
            name = name.strip()
            assert re.fullmatch(r"[a-zA-Z0-9-]+", name), name
            assert name not in self.rules, f"rule {name} defined twice"
            self.s, self.i = body, 0
            self.rules[name] = self.alt()
            self.space()
            assert self.i == len(self.s), (name, body[self.i:])
        for name in self.refs():
            assert name in self.rules, f"rule {name} is used but not defined"

    def refs(self):
        out = set()

        def walk(node):
            if node[0] == "ref":
                out.add(node[1])
            for child in node[1:]:
                if isinstance(child, tuple):
                    walk(child)
                elif isinstance(child, list):
                    for c in child:
                        walk(c)
        for node in self.rules.values():
            walk(node)
        return out

    def space(self):
        while self.i < len(self.s) and self.s[self.i] in " \t":
            self.i += 1

    def char(self):
        c = self.s[self.i]
        self.i += 1
        if c != "\\":
            return c
        c = self.s[self.i]
        self.i += 1
        if c == "x":
            v = self.s[self.i:self.i + 2]
            self.i += 2
            return chr(int(v, 16))
        return self.ESC[c]

    def alt(self):
        alts = [self.seq()]
        while self.i < len(self.s) and self.s[self.i] == "|":
            self.i += 1
            alts.append(self.seq())
        return ("alt", alts)

    def seq(self):
        items = []
        while True:
            self.space()
            if self.i >= len(self.s) or self.s[self.i] in "|)":
                return ("seq", items)
            items.append(self.postfix(self.atom()))

    def atom(self):
        c = self.s[self.i]
        if c == '"':
            self.i += 1
            out = ""
            while self.s[self.i] != '"':
                out += self.char()
            self.i += 1
            return ("lit", out)
        if c == "[":
            self.i += 1
            neg = self.s[self.i] == "^"
            self.i += neg
            ranges = []
            while self.s[self.i] != "]":
                a = self.char()
                if self.s[self.i] == "-" and self.s[self.i + 1] != "]":
                    self.i += 1
                    ranges.append((a, self.char()))
                else:
                    ranges.append((a, a))
            self.i += 1
            return ("cls", neg, ranges)
        if c == "(":
            self.i += 1
            node = self.alt()
            assert self.s[self.i] == ")"
            self.i += 1
            return node
        m = re.compile(r"[a-zA-Z0-9-]+").match(self.s, self.i)
        assert m, self.s[self.i:]
        self.i = m.end()
        return ("ref", m.group())

    def postfix(self, node):
        while self.i < len(self.s) and self.s[self.i] in "*+?{":
            c = self.s[self.i]
            self.i += 1
            if c == "*":
                node = ("rep", node, 0, None)
            elif c == "+":
                node = ("rep", node, 1, None)
            elif c == "?":
                node = ("rep", node, 0, 1)
            else:
                j = self.s.index("}", self.i)
                lo, _, hi = self.s[self.i:j].partition(",")
                node = ("rep", node, int(lo), int(hi) if hi else (None if "," in self.s[self.i:j] else int(lo)))
                self.i = j + 1
        return node

    def ends(self, node, text, pos, memo):
        key = (id(node), pos)
        if key in memo:
            return memo[key]
        memo[key] = frozenset()
        kind = node[0]
        if kind == "lit":
            out = {pos + len(node[1])} if text.startswith(node[1], pos) else set()
        elif kind == "cls":
            out = set()
            if pos < len(text):
                hit = any(a <= text[pos] <= b for a, b in node[2])
                if hit != node[1]:
                    out = {pos + 1}
        elif kind == "ref":
            out = self.ends(self.rules[node[1]], text, pos, memo)
        elif kind == "alt":
            out = set().union(*(self.ends(a, text, pos, memo) for a in node[1]))
        elif kind == "seq":
            out = {pos}
            for item in node[1]:
                out = set().union(*(self.ends(item, text, p, memo) for p in out)) if out else set()
        else:
            _, inner, lo, hi = node
            out, frontier, n = set(), {pos}, 0
            if lo == 0:
                out |= frontier
            while frontier and (hi is None or n < hi):
                n += 1
                frontier = set().union(*(self.ends(inner, text, p, memo) for p in frontier)) - ({pos} if n > 1 else set())
                if n >= lo:
                    out |= frontier
                if n > len(text) + 1:
                    break
        memo[key] = frozenset(out)
        return memo[key]

    def accepts(self, text):
        return len(text) in self.ends(("ref", "root"), text, 0, {})


# (framing, one forced output the grammar must admit, when parallel: two calls)
GRAMMAR_CASES = [
    (tc.HERMES, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}}\n</tool_call>', True),
    (tc.QWEN3_CODER, "<tool_call>\n<function=get_weather>\n<parameter=city>\nLyon\n</parameter>\n<parameter=days>\n3\n"
                     "</parameter>\n</function>\n</tool_call>", True),
    (tc.LLAMA3_JSON, '{"name": "get_weather", "parameters": {"city": "Lyon"}}', False),
    (tc.MISTRAL, '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Lyon"}, "id": "aB3dE6gH9"}]', True),
    (tc.MISTRAL_ARGS, '[TOOL_CALLS]get_weather[ARGS]{"city": "Lyon"}', True),
    (tc.MISTRAL_ARGS, '[TOOL_CALLS]get_weather[CALL_ID]aB3dE6gH9[ARGS]{"city": "Lyon"}', True),
    (tc.GEMMA4, '<|tool_call>call:get_weather{city:<|"|>Lyon<|"|>,days:3}<tool_call|>', True),
    (tc.FUNCTIONGEMMA, "<start_function_call>call:get_weather{city:<escape>Lyon<escape>,metric:true}<end_function_call>", True),
    (tc.GENERIC, '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Lyon"}}]}', True),
]


@pytest.mark.parametrize("framing,forced,multi", GRAMMAR_CASES, ids=[c[0].name for c in GRAMMAR_CASES])
def test_call_grammar_admits_the_framing(framing, forced, multi):
    grammar = tc.call_grammar(framing, TOOLS, "get_weather", False, json_rules)
    g = Gbnf(grammar)
    assert g.accepts(forced)
    assert not g.accepts("Sure! " + forced)
    assert not g.accepts(forced.replace("get_weather", "get_time", 1))  # the named function only
    assert parse(framing, forced)[1][0][0] == "get_weather"  # and the parser reads it back
    assert not g.accepts(forced + forced)  # one call unless parallel

    g_any = Gbnf(tc.call_grammar(framing, TOOLS, None, True, json_rules))
    assert g_any.accepts(forced)
    if multi:
        if framing is tc.MISTRAL:
            two = forced[:-1] + ", " + forced[len("[TOOL_CALLS]["):]
        elif framing is tc.GENERIC:
            two = forced[:-2] + ", " + forced[len('{"tool_calls": ['):]
        elif framing in (tc.HERMES, tc.QWEN3_CODER):
            two = forced + "\n" + forced
        else:
            two = forced + forced
        assert g_any.accepts(two)
        assert len(parse(framing, two)[1]) == 2
    else:
        assert not g_any.accepts(forced + "; " + forced)


def test_call_grammar_text_shape():
    hermes = tc.call_grammar(tc.HERMES, TOOLS, "get_weather", False, json_rules)
    lines = hermes.splitlines()
    assert lines[0] == "root ::= call"
    assert lines[1] == "call ::= tool-0-get-weather"
    assert lines[2] == ('tool-0-get-weather ::= "<tool_call>\\n{\\"name\\": \\"get_weather\\", \\"arguments\\": " '
                        'tool-0-get-weather-args "}\\n</tool_call>"')
    assert "tool-0-get-weather-args ::= tool-0-get-weather-args-obj" in lines
    parallel = tc.call_grammar(tc.HERMES, TOOLS, None, True, json_rules).splitlines()
    assert parallel[0] == 'root ::= call ( "\\n" call )*'
    assert parallel[1] == "call ::= tool-0-get-weather | tool-1-write-file | tool-2-get-time"
    assert tc.call_grammar(tc.LLAMA3_JSON, TOOLS, None, True, json_rules).splitlines()[0] == "root ::= call"
    generic = tc.call_grammar(tc.GENERIC, TOOLS, None, False, json_rules).splitlines()[0]
    assert generic == 'root ::= "{\\"tool_calls\\": [" call "]}"'
    coder = tc.call_grammar(tc.QWEN3_CODER, TOOLS, "get_weather", False, json_rules)
    assert ('tool-0-get-weather-p0-city ::= "<parameter=city>\\n" [^<]* "\\n</parameter>\\n"') in coder
    assert "tool-0-get-weather-p1-days-value ::= tool-0-get-weather-p1-days-value-val" in coder
    assert ('tool-0-get-weather ::= "<tool_call>\\n<function=get_weather>\\n" tool-0-get-weather-p0-city '
            'tool-0-get-weather-p1-days? tool-0-get-weather-p2-metric? "</function>\\n</tool_call>"') in coder
    with pytest.raises(ValueError):
        tc.call_grammar(tc.HERMES, TOOLS, "nope", False, json_rules)


def test_call_grammar_rule_names_are_sanitised_and_distinct():
    tools = [
        {"type": "function", "function": {"name": "get.weather", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "__", "parameters": {"type": "object"}}},
    ]
    grammar = tc.call_grammar(tc.HERMES, tools, None, True, json_rules)
    Gbnf(grammar)  # names valid, each defined once, every reference defined
    assert "call ::= tool-0-get-weather | tool-1-get-weather | tool-2-x" in grammar


def test_call_grammar_gemma_optional_members():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "a": {"type": "string"}, "b": {"type": "integer"}, "c": {"type": "string", "enum": ["x", "y"]},
    }, "required": ["b"]}}}]
    g = Gbnf(tc.call_grammar(tc.GEMMA4, tools, "f", False, json_rules))
    q = '<|"|>'
    for body, ok in [
        ("b:1", True), (f"a:{q}s{q},b:1", True), (f"a:{q}s{q},b:-2,c:{q}y{q}", True), (f"b:1,c:{q}x{q}", True),
        ("", False), (f"a:{q}s{q}", False), (f"b:1,a:{q}s{q}", False), (f"b:1,c:{q}z{q}", False), (",b:1", False),
    ]:
        assert g.accepts(f"<|tool_call>call:f{{{body}}}<tool_call|>") == ok, body
    # all optional: the empty object is admitted too
    tools[0]["function"]["parameters"]["required"] = []
    g = Gbnf(tc.call_grammar(tc.GEMMA4, tools, "f", False, json_rules))
    assert g.accepts("<|tool_call>call:f{}<tool_call|>")
    assert g.accepts(f"<|tool_call>call:f{{c:{q}x{q}}}<tool_call|>")


def test_call_grammar_coder_values_keep_their_string_constraints():
    """Qwen3-Coder's (and Qwen3.5's) XML framing writes string values raw:
    their enum, const and lengths still hold."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "short": {"type": "string", "minLength": 2, "maxLength": 4},
        "unit": {"type": "string", "enum": ["c", "f"]},
        "kind": {"const": "fixed"},
    }, "required": ["short", "unit", "kind"]}}}]
    g = Gbnf(tc.call_grammar(tc.QWEN3_CODER, tools, "f", False, json_rules))

    def call(short, unit, kind="fixed"):
        return (f"<tool_call>\n<function=f>\n<parameter=short>\n{short}\n</parameter>\n<parameter=unit>\n{unit}"
                f"\n</parameter>\n<parameter=kind>\n{kind}\n</parameter>\n</function>\n</tool_call>")

    assert g.accepts(call("ab", "c")) and g.accepts(call("abcd", "f"))
    for bad in [call("a", "c"), call("abcde", "c"), call("ab", "k"), call("ab", "c", "other")]:
        assert not g.accepts(bad), bad


def test_call_grammar_coder_refuses_a_pattern_it_cannot_hold_raw_text_to():
    """A pattern or format on a raw-text value is not silently dropped: the
    grammar is refused (a watched call goes unwatched, a forced one is a 400)."""
    for key, value in (("pattern", "^[a-z]+$"), ("format", "date")):
        tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
            "day": {"type": "string", key: value}}}}}]
        with pytest.raises(tc.ToolRequestError, match=f"f.day: a {key} cannot be held"):
            tc.call_grammar(tc.QWEN3_CODER, tools, "f", False, json_rules)


def test_call_grammar_coder_refuses_a_schema_the_json_framings_refuse():
    """A malformed schema, or one outside the subset, on a value the framing
    writes as raw text is refused as the JSON framings refuse it, not taken
    for "any text" (the engine's schema compiler here, not the stand-in)."""
    for bad in ({"type": 5}, {"$ref": "#/nope"}, {"type": "string", "not": {"const": "x"}}):
        tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
            "day": bad}}}}]
        for framing in (tc.HERMES, tc.QWEN3_CODER):
            with pytest.raises(InvalidRequestError, match="#/properties/day"):
                tc.call_grammar(framing, tools, "f", False, json_schema_rules)


def test_plan_grammar():
    plan = tc.validate_tools(TOOLS, {"type": "function", "function": {"name": "get_time"}}, False)
    grammar = plan.grammar(tc.HERMES, json_rules)
    assert "call ::= tool-2-get-time" in grammar
    assert tc.validate_tools(TOOLS).grammar(tc.HERMES, json_rules) is None
