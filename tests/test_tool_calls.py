"""Tool calls per model family: parsing (whole and streamed), framing
detection from chat templates, request validation, tool history, the generic
framing's prompt, and the grammars that force a call.

The model outputs below are recorded-style samples written out by hand in
each family's markup: the small test models cannot call tools by themselves,
so no real generation would exercise these paths."""

from __future__ import annotations

import itertools
import json
import random
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"

from ember import chat_template as ct
from ember.chat import events as ev
from ember.chat import tools as tc
from ember.errors import InvalidRequestError

SMOLLM2_TEMPLATE = (FIXTURES / "smollm2-135m-instruct.chat_template.jinja").read_text(encoding="utf-8")

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
        }, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "write_file", "description": "Writes a file.",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string"}, "content": {"type": "string"}, "meta": {"type": "object"},
        }, "required": ["path", "content"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
]


def counter_ids():
    n = itertools.count()
    return lambda: f"id{next(n)}"


def parse(framing, text, reason="stop", tools=TOOLS):
    content, calls = tc.parse_tool_calls(framing, text, tools=tools, finish_reason=reason, ids=counter_ids())
    return content, [(c.name, json.loads(c.arguments)) for c in calls]


def run_stream(framing, chunks, reason="stop", tools=TOOLS):
    s = tc.ToolCallStream(framing, tools, ids=counter_ids())
    events = []
    for chunk in chunks:
        events += s.feed(chunk)
    events += s.finish(reason)
    return events


def assemble(events):
    """Content and calls as a client rebuilds them from the events."""
    content = "".join(e.text for e in events if isinstance(e, ev.TextDelta))
    calls: dict[int, list] = {}
    for e in events:
        if isinstance(e, ev.CallStart):
            assert e.index == len(calls), "indices count up from 0"
            calls[e.index] = [e.id, e.name, "", False]
        elif isinstance(e, ev.CallArguments):
            assert not calls[e.index][3], "no fragment after the end"
            calls[e.index][2] += e.fragment
        elif isinstance(e, ev.CallEnd):
            calls[e.index][3] = True
    assert all(c[3] for c in calls.values()), "every started call ends"
    return content, [tc.ToolCall(i, *c[:3]) for i, c in sorted(calls.items())]


def random_chunks(text, rng):
    out, i = [], 0
    while i < len(text):
        n = rng.choice((1, 1, 2, 3, 5, 8, 13))
        out.append(text[i:i + n])
        i += n
    return out


W = ("get_weather", {"city": "Lyon"})
W2 = ("get_weather", {"city": "Zürich", "days": 3})
TRICKY_ARGS = {
    "path": "src/a {b}.txt",
    "content": 'if (x) { return "</tool_call>"; }\n[TOOL_CALLS] <|tool_call> {"name": "x"} \\ end',
    "meta": {"tags": ["a", {"b": [1, 2.5, None, True]}], "empty": {}},
}
UNICODE_ARGS = {"city": "São Paulo", "note": "雨が降る 🌧 — ok"}

# (id, framing, output, content, calls): whole outputs, ended by the model.
SAMPLES = [
    # Hermes (Qwen2.5, Qwen3, SmolLM3-style templates)
    ("hermes-plain", tc.HERMES,
     '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}}\n</tool_call>', "", [W]),
    ("hermes-prose", tc.HERMES,
     "I'll look that up for you.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Lyon\"}}\n</tool_call>",
     "I'll look that up for you.", [W]),
    ("hermes-two", tc.HERMES,
     '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}}\n</tool_call>\n'
     '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich", "days": 3}}\n</tool_call>', "", [W, W2]),
    ("hermes-tricky", tc.HERMES,
     "<tool_call>\n" + json.dumps({"name": "write_file", "arguments": TRICKY_ARGS}) + "\n</tool_call>",
     "", [("write_file", TRICKY_ARGS)]),
    ("hermes-unicode", tc.HERMES,
     "Voilà :\n<tool_call>\n" + json.dumps({"name": "get_weather", "arguments": UNICODE_ARGS}, ensure_ascii=False)
     + "\n</tool_call>", "Voilà :", [("get_weather", UNICODE_ARGS)]),
    ("hermes-args-first", tc.HERMES,
     '<tool_call>\n{"arguments": {"city": "Lyon"}, "name": "get_weather"}\n</tool_call>', "", [W]),
    ("hermes-args-string", tc.HERMES,
     '<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Lyon\\"}"}\n</tool_call>', "", [W]),
    ("hermes-list", tc.HERMES,
     '<tool_call>\n[{"name": "get_weather", "arguments": {"city": "Lyon"}}, '
     '{"name": "get_weather", "arguments": {"city": "Zürich", "days": 3}}]\n</tool_call>', "", [W, W2]),
    ("hermes-no-args", tc.HERMES, '<tool_call>\n{"name": "get_time"}\n</tool_call>', "", [("get_time", {})]),
    ("hermes-not-a-call", tc.HERMES, "The <tool_call> tag wraps a call: <tool_call>oops</tool_call>.",
     "The <tool_call> tag wraps a call: <tool_call>oops</tool_call>.", []),
    ("hermes-prose-only", tc.HERMES, "  Just text,\n with spaces.  \n", "  Just text,\n with spaces.  \n", []),
    # Qwen3-Coder's XML
    ("coder-plain", tc.QWEN3_CODER,
     "<tool_call>\n<function=get_weather>\n<parameter=city>\nLyon\n</parameter>\n</function>\n</tool_call>", "", [W]),
    ("coder-prose", tc.QWEN3_CODER,
     "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nLyon\n</parameter>\n</function>\n</tool_call>",
     "Checking.", [W]),
    ("coder-two", tc.QWEN3_CODER,
     "<tool_call>\n<function=get_weather>\n<parameter=city>\nLyon\n</parameter>\n</function>\n</tool_call>\n"
     "<tool_call>\n<function=get_weather>\n<parameter=city>\nZürich\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
     "</function>\n</tool_call>", "", [W, W2]),
    ("coder-tricky", tc.QWEN3_CODER,
     "<tool_call>\n<function=write_file>\n<parameter=path>\nsrc/a {b}.txt\n</parameter>\n<parameter=content>\n"
     + TRICKY_ARGS["content"] + "\n</parameter>\n<parameter=meta>\n" + json.dumps(TRICKY_ARGS["meta"])
     + "\n</parameter>\n</function>\n</tool_call>", "", [("write_file", TRICKY_ARGS)]),
    ("coder-multiline", tc.QWEN3_CODER,
     "<tool_call>\n<function=write_file>\n<parameter=path>\na.py\n</parameter>\n<parameter=content>\n"
     "def f():\n    return 1\n\n</parameter>\n</function>\n</tool_call>",
     "", [("write_file", {"path": "a.py", "content": "def f():\n    return 1\n"})]),
    ("coder-unicode", tc.QWEN3_CODER,
     "<tool_call>\n<function=get_weather>\n<parameter=city>\nSão Paulo\n</parameter>\n<parameter=note>\n"
     "雨が降る 🌧 — ok\n</parameter>\n</function>\n</tool_call>", "", [("get_weather", UNICODE_ARGS)]),
    ("coder-python-bool", tc.QWEN3_CODER,  # what the template writes for a bool put through |string
     "<tool_call>\n<function=get_weather>\n<parameter=city>\nLyon\n</parameter>\n<parameter=metric>\nTrue\n"
     "</parameter>\n</function>\n</tool_call>", "", [("get_weather", {"city": "Lyon", "metric": True})]),
    ("coder-python-repr", tc.QWEN3_CODER,  # what the template writes for a dict put through |string
     "<tool_call>\n<function=write_file>\n<parameter=path>\na\n</parameter>\n<parameter=content>\nb\n</parameter>\n"
     "<parameter=meta>\n{'tags': ['x', None], 'ok': False}\n</parameter>\n</function>\n</tool_call>",
     "", [("write_file", {"path": "a", "content": "b", "meta": {"tags": ["x", None], "ok": False}})]),
    ("coder-bare-function", tc.QWEN3_CODER,
     "<function=get_weather>\n<parameter=city>\nLyon\n</parameter>\n</function>\n</tool_call>", "", [W]),
    ("coder-no-closing-parameter", tc.QWEN3_CODER,
     "<tool_call>\n<function=get_weather>\n<parameter=city>\nLyon\n<parameter=days>\n3\n</function>\n</tool_call>",
     "", [("get_weather", {"city": "Lyon", "days": 3})]),
    # Llama 3.x JSON
    ("llama-plain", tc.LLAMA3_JSON, '{"name": "get_weather", "parameters": {"city": "Lyon"}}', "", [W]),
    ("llama-python-tag", tc.LLAMA3_JSON,
     'Let me check.<|python_tag|>{"name": "get_weather", "parameters": {"city": "Lyon"}}', "Let me check.", [W]),
    ("llama-two", tc.LLAMA3_JSON,
     '{"name": "get_weather", "parameters": {"city": "Lyon"}}; '
     '{"name": "get_weather", "parameters": {"city": "Zürich", "days": 3}}', "", [W, W2]),
    ("llama-type-function", tc.LLAMA3_JSON,
     '{"type": "function", "name": "get_weather", "parameters": {"city": "Lyon"}}', "", [W]),
    ("llama-tricky", tc.LLAMA3_JSON,
     json.dumps({"name": "write_file", "parameters": TRICKY_ARGS}), "", [("write_file", TRICKY_ARGS)]),
    ("llama-unicode", tc.LLAMA3_JSON,
     "\n" + json.dumps({"name": "get_weather", "parameters": UNICODE_ARGS}, ensure_ascii=False),
     "", [("get_weather", UNICODE_ARGS)]),
    ("llama-json-answer", tc.LLAMA3_JSON, '{"name": "Bob", "age": 3}', '{"name": "Bob", "age": 3}', []),
    ("llama-json-later", tc.LLAMA3_JSON,
     'Example: {"name": "get_weather", "parameters": {"city": "Lyon"}}',
     'Example: {"name": "get_weather", "parameters": {"city": "Lyon"}}', []),
    # Mistral: [TOOL_CALLS] with a JSON list (Nemo, Small 3.1)
    ("mistral-plain", tc.MISTRAL,
     '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Lyon"}, "id": "a1b2c3d4e"}]', "", [W]),
    ("mistral-prose", tc.MISTRAL,
     'Sure. [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Lyon"}}]', "Sure.", [W]),
    ("mistral-two", tc.MISTRAL,
     '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Lyon"}}, '
     '{"name": "get_weather", "arguments": {"city": "Zürich", "days": 3}}]', "", [W, W2]),
    ("mistral-tricky", tc.MISTRAL,
     "[TOOL_CALLS][" + json.dumps({"name": "write_file", "arguments": TRICKY_ARGS}) + "]",
     "", [("write_file", TRICKY_ARGS)]),
    ("mistral-unicode", tc.MISTRAL,
     "[TOOL_CALLS][" + json.dumps({"name": "get_weather", "arguments": UNICODE_ARGS}, ensure_ascii=False) + "]",
     "", [("get_weather", UNICODE_ARGS)]),
    # Mistral: [TOOL_CALLS]NAME[ARGS]{...} (Ministral 3, Magistral, Devstral)
    ("mistral-args-plain", tc.MISTRAL_ARGS, '[TOOL_CALLS]get_weather[ARGS]{"city": "Lyon"}', "", [W]),
    ("mistral-args-prose", tc.MISTRAL_ARGS, 'One moment.[TOOL_CALLS]get_weather[ARGS]{"city": "Lyon"}',
     "One moment.", [W]),
    ("mistral-args-two", tc.MISTRAL_ARGS,
     '[TOOL_CALLS]get_weather[ARGS]{"city": "Lyon"}[TOOL_CALLS]get_weather[CALL_ID]Xy7Qa01bC[ARGS]'
     '{"city": "Zürich", "days": 3}', "", [W, W2]),
    ("mistral-args-tricky", tc.MISTRAL_ARGS, "[TOOL_CALLS]write_file[ARGS]" + json.dumps(TRICKY_ARGS),
     "", [("write_file", TRICKY_ARGS)]),
    ("mistral-args-unicode", tc.MISTRAL_ARGS,
     "[TOOL_CALLS]get_weather[ARGS]" + json.dumps(UNICODE_ARGS, ensure_ascii=False), "", [("get_weather", UNICODE_ARGS)]),
    # Gemma 4
    ("gemma4-plain", tc.GEMMA4, '<|tool_call>call:get_weather{city:<|"|>Lyon<|"|>}<tool_call|>', "", [W]),
    ("gemma4-prose", tc.GEMMA4,
     'Let me check the weather.<|tool_call>call:get_weather{city:<|"|>Lyon<|"|>}<tool_call|>',
     "Let me check the weather.", [W]),
    ("gemma4-two", tc.GEMMA4,
     '<|tool_call>call:get_weather{city:<|"|>Lyon<|"|>}<tool_call|>'
     '<|tool_call>call:get_weather{city:<|"|>Zürich<|"|>,days:3}<tool_call|>', "", [W, W2]),
    ("gemma4-tricky", tc.GEMMA4,
     '<|tool_call>call:write_file{content:<|"|>' + TRICKY_ARGS["content"] + '<|"|>,'
     'meta:{empty:{},tags:[<|"|>a<|"|>,{b:[1,2.5,null,true]}]},path:<|"|>src/a {b}.txt<|"|>}<tool_call|>',
     "", [("write_file", TRICKY_ARGS)]),
    ("gemma4-unicode", tc.GEMMA4,
     '<|tool_call>call:get_weather{city:<|"|>São Paulo<|"|>,note:<|"|>雨が降る 🌧 — ok<|"|>}<tool_call|>',
     "", [("get_weather", UNICODE_ARGS)]),
    ("gemma4-no-args", tc.GEMMA4, "<|tool_call>call:get_time{}<tool_call|>", "", [("get_time", {})]),
    ("gemma4-asks-for-results", tc.GEMMA4,  # the model opens the response block after its calls
     '<|tool_call>call:get_weather{city:<|"|>Lyon<|"|>}<tool_call|><|tool_response>', "", [W]),
    # FunctionGemma
    ("functiongemma-plain", tc.FUNCTIONGEMMA,
     "<start_function_call>call:get_weather{city:<escape>Lyon<escape>}<end_function_call>", "", [W]),
    ("functiongemma-asks-for-results", tc.FUNCTIONGEMMA,
     "<start_function_call>call:get_weather{city:<escape>Lyon<escape>}<end_function_call><start_function_response>",
     "", [W]),
    ("functiongemma-two", tc.FUNCTIONGEMMA,
     "<start_function_call>call:get_weather{city:<escape>Lyon<escape>}<end_function_call>"
     "<start_function_call>call:get_weather{city:<escape>Zürich<escape>,days:3}<end_function_call>", "", [W, W2]),
    # Generic (llama-server's generic style, for templates without tool markup)
    ("generic-plain", tc.GENERIC,
     '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Lyon"}}]}', "", [W]),
    ("generic-prose", tc.GENERIC,
     'Let me look.\n{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Lyon"}}]}', "Let me look.", [W]),
    ("generic-two", tc.GENERIC,
     '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Lyon"}}, '
     '{"name": "get_weather", "arguments": {"city": "Zürich", "days": 3}}]}', "", [W, W2]),
    ("generic-single", tc.GENERIC, '{"tool_call": {"name": "get_weather", "arguments": {"city": "Lyon"}}}', "", [W]),
    ("generic-bare", tc.GENERIC, '{"name": "get_weather", "arguments": {"city": "Lyon"}}', "", [W]),
    ("generic-openai-shape", tc.GENERIC,
     '{"tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": "{\\"city\\": \\"Lyon\\"}"}}]}',
     "", [W]),
    ("generic-fenced", tc.GENERIC,
     'Calling:\n```json\n{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Lyon"}}]}\n```', "Calling:", [W]),
    ("generic-tricky", tc.GENERIC,
     json.dumps({"tool_calls": [{"name": "write_file", "arguments": TRICKY_ARGS}]}), "", [("write_file", TRICKY_ARGS)]),
    ("generic-unicode", tc.GENERIC,
     json.dumps({"tool_calls": [{"name": "get_weather", "arguments": UNICODE_ARGS}]}, ensure_ascii=False),
     "", [("get_weather", UNICODE_ARGS)]),
    ("generic-json-answer", tc.GENERIC, 'Here: {"name": "Bob", "age": 3} and {"tool_calls": []}',
     'Here: {"name": "Bob", "age": 3} and {"tool_calls": []}', []),
    ("generic-undeclared", tc.GENERIC, '{"name": "launch", "arguments": {}}', '{"name": "launch", "arguments": {}}', []),
]

# (id, framing, output cut by the token limit, content, calls)
CUT_SAMPLES = [
    ("hermes-cut-opener", tc.HERMES, "Sure.\n<tool_ca", "Sure.\n<tool_ca", []),
    ("hermes-cut-name", tc.HERMES, '<tool_call>\n{"name": "get_wea', '<tool_call>\n{"name": "get_wea', []),
    ("hermes-cut-string", tc.HERMES, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Ly',
     "", [("get_weather", {"city": "Ly"})]),
    ("hermes-cut-key", tc.HERMES, '<tool_call>\n{"name": "write_file", "arguments": {"path": "a", "cont',
     "", [("write_file", {"path": "a"})]),
    ("hermes-cut-nested", tc.HERMES,
     '<tool_call>\n{"name": "write_file", "arguments": {"meta": {"tags": ["a", {"b": [1, 2.',
     "", [("write_file", {"meta": {"tags": ["a", {"b": [1]}]}})]),
    # The first call is whole; the second one's name is not, so its text is content.
    ("hermes-cut-second", tc.HERMES,
     '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}}\n</tool_call>\n<tool_call>\n{"name": "get_',
     '<tool_call>\n{"name": "get_', [W]),
    ("hermes-cut-escape", tc.HERMES, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "L\\u00',
     "", [("get_weather", {"city": "L"})]),
    ("coder-cut-name", tc.QWEN3_CODER, "<tool_call>\n<function=get_wea", "<tool_call>\n<function=get_wea", []),
    ("coder-cut-string", tc.QWEN3_CODER, "<tool_call>\n<function=get_weather>\n<parameter=city>\nLyo",
     "", [("get_weather", {"city": "Lyo"})]),
    ("coder-cut-number", tc.QWEN3_CODER,
     "<tool_call>\n<function=get_weather>\n<parameter=city>\nLyon\n</parameter>\n<parameter=days>\n3",
     "", [("get_weather", {"city": "Lyon"})]),
    ("llama-cut", tc.LLAMA3_JSON, '{"name": "get_weather", "parameters": {"city": "Ly',
     "", [("get_weather", {"city": "Ly"})]),
    ("llama-cut-name", tc.LLAMA3_JSON, '{"name": "get_weat', '{"name": "get_weat', []),
    ("mistral-cut", tc.MISTRAL, '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Ly',
     "", [("get_weather", {"city": "Ly"})]),
    ("mistral-args-cut", tc.MISTRAL_ARGS, '[TOOL_CALLS]get_weather[ARGS]{"city": "Ly',
     "", [("get_weather", {"city": "Ly"})]),
    ("mistral-args-cut-name", tc.MISTRAL_ARGS, "[TOOL_CALLS]get_wea", "[TOOL_CALLS]get_wea", []),
    ("gemma4-cut", tc.GEMMA4, '<|tool_call>call:get_weather{city:<|"|>Ly', "", [("get_weather", {"city": "Ly"})]),
    ("gemma4-cut-quote", tc.GEMMA4, '<|tool_call>call:get_weather{city:<|"|>Lyon<|"', "",
     [("get_weather", {"city": "Lyon"})]),
    ("gemma4-cut-name", tc.GEMMA4, "Ok<|tool_call>call:get_w", "Ok<|tool_call>call:get_w", []),
    ("generic-cut", tc.GENERIC, '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Ly',
     "", [("get_weather", {"city": "Ly"})]),
    ("generic-cut-name", tc.GENERIC, 'Hm {"tool_calls": [{"name": "get_', 'Hm {"tool_calls": [{"name": "get_', []),
]

MARKUP = ("<tool_call>", "<function=", "[TOOL_CALLS]", "<|tool_call>", "<start_function_call>", "<|python_tag|>")


# ---------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("sid,framing,text,content,calls", SAMPLES, ids=[s[0] for s in SAMPLES])
def test_parse_samples(sid, framing, text, content, calls):
    assert parse(framing, text) == (content, calls)


@pytest.mark.parametrize("sid,framing,text,content,calls", CUT_SAMPLES, ids=[s[0] for s in CUT_SAMPLES])
def test_cut_by_token_limit(sid, framing, text, content, calls):
    # The peers' rule: the call's text is content while its name is not whole,
    # the call with what was read (closed into valid JSON) once it is.
    assert parse(framing, text, "length") == (content, calls)
    got_content, got_calls = assemble(run_stream(framing, random_chunks(text, random.Random(7)), "length"))
    assert (got_content, [(c.name, json.loads(c.arguments)) for c in got_calls]) == (content, calls)


ALL = [(s[0], s[1], s[2], r) for s in SAMPLES for r in ("stop", "length")] + [
    (s[0], s[1], s[2], "length") for s in CUT_SAMPLES
]
CUT_IDS = {s[0] for s in CUT_SAMPLES}


@pytest.mark.parametrize("sid,framing,text,reason", ALL, ids=[f"{a[0]}-{a[3]}" for a in ALL])
def test_stream_matches_whole(sid, framing, text, reason):
    whole = tc.parse_tool_calls(framing, text, tools=TOOLS, finish_reason=reason, ids=counter_ids())
    rng = random.Random(sid)
    chunkings = [[text], list(text)] + [random_chunks(text, rng) for _ in range(12)]
    for chunks in chunkings:
        events = run_stream(framing, chunks, reason)
        assert assemble(events) == whole, chunks
        if whole[1] and sid not in CUT_IDS:  # a response with calls: no markup reached the content
            for e in events:
                if isinstance(e, ev.TextDelta):
                    assert not any(m in e.text for m in MARKUP), e
        assert not any(isinstance(e, ev.CallError) for e in events)


@pytest.mark.parametrize("sid,framing,text", [s[:3] for s in SAMPLES if s[4]], ids=[s[0] for s in SAMPLES if s[4]])
def test_every_cut_point_gives_valid_json(sid, framing, text):
    # Whatever position the token limit falls on, calls come back with valid
    # JSON arguments and nothing raises; ended there by the model instead, the
    # output either parses or is an error naming a call.
    for k in range(len(text) + 1):
        content, calls = tc.parse_tool_calls(framing, text[:k], tools=TOOLS, finish_reason="length")
        for c in calls:
            assert isinstance(json.loads(c.arguments), dict), (k, c)
        try:
            tc.parse_tool_calls(framing, text[:k], tools=TOOLS, finish_reason="stop")
        except tc.ToolCallParseError as e:
            assert e.name in {n for n, _ in SAMPLES[[s[0] for s in SAMPLES].index(sid)][4]}


def test_stream_holds_back_a_possible_opener():
    s = tc.ToolCallStream(tc.HERMES, TOOLS, ids=counter_ids())
    assert s.feed("Sure thing") == [ev.TextDelta("Sure thing")]
    assert s.feed(". <tool_c") == [ev.TextDelta(".")]  # " <tool_c" could still open a call
    assert s.feed("all>") == []
    assert s.feed("\n{\"name\": \"get_weather\", ") == [ev.CallStart(0, "id0", "get_weather")]
    assert s.feed('"arguments": {"city": "Ly') == [ev.CallArguments(0, '{"city": "Ly')]
    assert s.feed('on"}}\n</tool_call>') == [
        ev.CallArguments(0, 'on"}'), ev.CallEnd(0)]
    assert s.finish("stop") == []
    assert s.finish_reason("stop") == "tool_calls"
    assert s.content == "Sure thing."


def test_stream_releases_an_opener_that_was_not_one():
    s = tc.ToolCallStream(tc.HERMES, TOOLS)
    assert s.feed("a <tool") == [ev.TextDelta("a")]
    assert s.feed("box> b") == [ev.TextDelta(" <toolbox> b")]
    assert s.finish("stop") == []
    assert s.finish_reason("stop") == "stop"


def test_stream_argument_fragments_of_xml_values():
    events = run_stream(tc.QWEN3_CODER, [
        "<tool_call>\n<function=write_file>\n<parameter=content>\nline one\n", "line two\n</param", "eter>\n",
        "</function>\n</tool_call>"])
    frags = [e.fragment for e in events if isinstance(e, ev.CallArguments)]
    assert frags == ["{", '"content": "', "line one", "\\nline two", '"', "}"]
    assert json.loads("".join(frags)) == {"content": "line one\nline two"}


def test_cut_inside_a_call_ended_by_the_model_is_an_error():
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Ly'
    with pytest.raises(tc.ToolCallParseError) as err:
        tc.parse_tool_calls(tc.HERMES, text)
    assert err.value.index == 0 and err.value.name == "get_weather"
    assert "get_weather" in str(err.value)
    events = run_stream(tc.HERMES, [text], "stop")
    assert isinstance(events[-1], ev.CallError) and events[-1].name == "get_weather"


def test_broken_list_entry_is_an_error_naming_the_next_call():
    text = '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Lyon"}}, oops]'
    with pytest.raises(tc.ToolCallParseError) as err:
        tc.parse_tool_calls(tc.MISTRAL, text)
    assert (err.value.index, err.value.name) == (1, None)


def test_complete_arguments_without_the_closing_tag_are_a_call():
    # The model stopped after the arguments closed: lenient, as llama-server is.
    assert parse(tc.HERMES, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}}') == ("", [W])
    assert parse(tc.HERMES, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}') == ("", [W])


def test_markup_broken_after_the_name_is_an_error():
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": Lyon}}\n</tool_call> and more'
    with pytest.raises(tc.ToolCallParseError, match="get_weather"):
        tc.parse_tool_calls(tc.HERMES, text)
    s = tc.ToolCallStream(tc.HERMES)
    events = s.feed(text)
    assert isinstance(events[0], ev.CallStart) and isinstance(events[-1], ev.CallError)
    assert events[-1].index == 0 and events[-1].name == "get_weather"
    assert s.feed("even more") == [] and s.finish("stop") == []


def test_finish_reason():
    s = tc.ToolCallStream(tc.GENERIC, TOOLS)
    s.feed('{"tool_calls": [{"name": "get_time", "arguments": {}}]}')
    s.finish("stop")
    assert s.finish_reason("stop") == "tool_calls"
    assert s.finish_reason("length") == "length"
    plain = tc.ToolCallStream(tc.GENERIC, TOOLS)
    plain.feed("hello")
    plain.finish("stop")
    assert plain.finish_reason("stop") == "stop"


def test_call_ids():
    _, calls = tc.parse_tool_calls(tc.HERMES, SAMPLES[2][2])
    assert len({c.id for c in calls}) == 2
    assert all(re.fullmatch(r"call_[A-Za-z0-9]{24}", c.id) for c in calls)
    for framing in (tc.MISTRAL, tc.MISTRAL_ARGS):
        sample = next(s for s in SAMPLES if s[1] is framing and len(s[4]) == 2)
        _, calls = tc.parse_tool_calls(framing, sample[2])
        assert len({c.id for c in calls}) == 2
        assert all(re.fullmatch(r"[A-Za-z0-9]{9}", c.id) for c in calls), calls
    # A source that repeats itself still gives distinct ids within a response.
    repeats = iter(["dup", "dup", "dup", "other"])
    _, calls = tc.parse_tool_calls(tc.HERMES, SAMPLES[2][2], ids=lambda: next(repeats))
    assert [c.id for c in calls] == ["dup", "other"]


def test_openai_shapes():
    assert ev.chat_delta(ev.TextDelta("hi")) == {"content": "hi"}
    assert ev.chat_delta(ev.CallStart(1, "call_x", "f")) == {
        "tool_calls": [{"index": 1, "id": "call_x", "type": "function", "function": {"name": "f", "arguments": ""}}]}
    assert ev.chat_delta(ev.CallArguments(1, '{"a"')) == {
        "tool_calls": [{"index": 1, "function": {"arguments": '{"a"'}}]}
    assert ev.chat_delta(ev.CallEnd(1)) is None
    assert tc.ToolCall(0, "call_x", "f", "{}").to_openai() == {
        "id": "call_x", "type": "function", "function": {"name": "f", "arguments": "{}"}}


# ---------------------------------------------------------------------------
# Framing detection from templates
# ---------------------------------------------------------------------------

# Small templates that render tool declarations, assistant tool_calls and tool
# results the way each family's real template does.
QWEN25_LIKE = r"""
{%- if tools %}
{{- '<|im_start|>system\nYou are a helpful assistant.\n\n# Tools\n\n<tools>' }}
{%- for tool in tools %}{{- '\n' + (tool | tojson) }}{%- endfor %}
{{- '\n</tools>\n\nFor each function call, return a json object within <tool_call></tool_call> XML tags.<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'user' or message.role == 'system' or (message.role == 'assistant' and not message.tool_calls) %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant' }}
{%- if message.content %}{{- '\n' + message.content }}{%- endif %}
{%- for tool_call in message.tool_calls %}
{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
{{- '\n<tool_call>\n{"name": "' + tool_call.name + '", "arguments": ' + (tool_call.arguments | tojson) + '}\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- elif message.role == 'tool' %}
{{- '<|im_start|>user\n<tool_response>\n' + message.content + '\n</tool_response><|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
"""

# Qwen3's template tests the assistant's content for a thought and fails on
# null content: detection must retry with "".
QWEN3_LIKE = r"""
{%- for message in messages %}
{%- if message.role == 'assistant' %}
{%- set content = message.content %}
{%- if '</think>' in content %}{%- set content = content.split('</think>')[-1] %}{%- endif %}
{{- '<|im_start|>assistant\n' + content }}
{%- for tool_call in message.tool_calls | default([]) %}
{%- if (loop.first and content) or (not loop.first) %}{{- '\n' }}{%- endif %}
{%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}
{{- '<tool_call>\n{"name": "' + tool_call.name + '", "arguments": ' }}
{%- if tool_call.arguments is string %}{{- tool_call.arguments }}{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}
{{- '}\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- else %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
"""

QWEN3_CODER_LIKE = r"""
{%- if tools %}
{{- '<|im_start|>system\n# Tools\n\n<tools>' }}
{%- for tool in tools %}{{- '\n<function>\n<name>' + tool.function.name + '</name>\n</function>' }}{%- endfor %}
{{- '\n</tools><|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'assistant' and message.tool_calls %}
{{- '<|im_start|>assistant' }}
{%- if message.content %}{{- '\n' + message.content }}{%- endif %}
{%- for tool_call in message.tool_calls %}
{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
{{- '\n<tool_call>\n<function=' + tool_call.name + '>\n' }}
{%- for args_name, args_value in tool_call.arguments | items %}
{{- '<parameter=' + args_name + '>\n' }}
{%- if args_value is mapping or (args_value is sequence and args_value is not string) %}{{- args_value | tojson }}{%- else %}{{- args_value | string }}{%- endif %}
{{- '\n</parameter>\n' }}
{%- endfor %}
{{- '</function>\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- elif message.role == 'tool' %}
{{- '<|im_start|>user\n<tool_response>\n' + message.content + '\n</tool_response><|im_end|>\n' }}
{%- else %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
"""

LLAMA31_LIKE = r"""
{{- bos_token }}
{{- '<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n\n<|eot_id|>' }}
{%- if tools is not none %}
{%- set first_user_message = messages[0]['content'] | trim %}
{%- set messages = messages[1:] %}
{{- '<|start_header_id|>user<|end_header_id|>\n\n' }}
{{- 'Given the following functions, please respond with a JSON for a function call.\n\n' }}
{{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.\n\n' }}
{%- for t in tools %}{{- t | tojson(indent=4) + '\n\n' }}{%- endfor %}
{{- first_user_message + '<|eot_id|>' }}
{%- endif %}
{%- for message in messages %}
{%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\n\n' + message.content | trim + '<|eot_id|>' }}
{%- elif 'tool_calls' in message %}
{%- if not message.tool_calls | length == 1 %}{{- raise_exception('This model only supports single tool-calls at once!') }}{%- endif %}
{%- set tool_call = message.tool_calls[0].function %}
{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{{- '{"name": "' + tool_call.name + '", "parameters": ' + (tool_call.arguments | tojson) + '}<|eot_id|>' }}
{%- else %}
{{- '<|start_header_id|>ipython<|end_header_id|>\n\n' + message.content + '<|eot_id|>' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}
"""

MISTRAL_NEMO_LIKE = r"""
{%- set user_messages = messages | selectattr('role', 'equalto', 'user') | list %}
{{- bos_token }}
{%- for message in messages %}
{%- if message.role == 'user' %}
{%- if tools is not none and message == user_messages[-1] %}
{{- '[AVAILABLE_TOOLS][' }}{%- for tool in tools %}{{- tool | tojson }}{%- if not loop.last %}{{- ', ' }}{%- endif %}{%- endfor %}{{- '][/AVAILABLE_TOOLS]' }}
{%- endif %}
{{- '[INST]' + message.content + '[/INST]' }}
{%- elif message.tool_calls is defined and message.tool_calls is not none %}
{{- '[TOOL_CALLS][' }}
{%- for tool_call in message.tool_calls %}
{%- set out = tool_call.function | tojson %}
{{- out[:-1] }}
{%- if tool_call.id is not defined or tool_call.id | length != 9 %}{{- raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}{%- endif %}
{{- ', "id": "' + tool_call.id + '"}' }}
{%- if not loop.last %}{{- ', ' }}{%- else %}{{- ']' + eos_token }}{%- endif %}
{%- endfor %}
{%- elif message.role == 'assistant' %}
{{- message.content + eos_token }}
{%- elif message.role == 'tool' %}
{%- if message.tool_call_id | length != 9 %}{{- raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}{%- endif %}
{{- '[TOOL_RESULTS]{"content": ' + message.content | string + ', "call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
{%- endif %}
{%- endfor %}
"""

MINISTRAL_LIKE = r"""
{{- bos_token }}
{%- if tools %}{{- '[AVAILABLE_TOOLS]' + (tools | tojson) + '[/AVAILABLE_TOOLS]' }}{%- endif %}
{%- for message in messages %}
{%- if message.role == 'user' %}{{- '[INST]' + message.content + '[/INST]' }}
{%- elif message.role == 'assistant' %}
{%- if message.content %}{{- message.content }}{%- endif %}
{%- for tool_call in message.tool_calls | default([]) %}
{%- set arguments = tool_call.function.arguments %}
{%- if arguments is not string %}{%- set arguments = arguments | tojson %}{%- endif %}
{{- '[TOOL_CALLS]' + tool_call.function.name + '[ARGS]' + arguments }}
{%- endfor %}
{{- eos_token }}
{%- elif message.role == 'tool' %}{{- '[TOOL_RESULTS]' + message.content | string + '[/TOOL_RESULTS]' }}
{%- endif %}
{%- endfor %}
"""

GEMMA4_LIKE = r"""
{%- macro arg(v) -%}
{%- if v is string -%}{{- '<|"|>' + v + '<|"|>' -}}
{%- elif v is boolean -%}{{- 'true' if v else 'false' -}}
{%- elif v is mapping -%}{{- '{' -}}{%- for k, x in v | dictsort -%}{{- k + ':' + arg(x) -}}{%- if not loop.last %},{% endif -%}{%- endfor -%}{{- '}' -}}
{%- elif v is sequence -%}{{- '[' -}}{%- for x in v -%}{{- arg(x) -}}{%- if not loop.last %},{% endif -%}{%- endfor -%}{{- ']' -}}
{%- else -%}{{- v -}}{%- endif -%}
{%- endmacro -%}
{{- bos_token -}}
{%- if tools -%}
{{- '<|turn>system\n' -}}{%- for tool in tools -%}{{- '<|tool>declaration:' + tool.function.name + '{}<tool|>' -}}{%- endfor -%}{{- '<turn|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
{{- '<|turn>' + ('model' if message.role == 'assistant' else message.role) + '\n' -}}
{%- if message.tool_calls -%}
{%- for tool_call in message.tool_calls -%}
{{- '<|tool_call>call:' + tool_call.function.name + '{' -}}
{%- for k, v in tool_call.function.arguments | dictsort -%}{{- k + ':' + arg(v) -}}{%- if not loop.last %},{% endif -%}{%- endfor -%}
{{- '}<tool_call|>' -}}
{%- endfor -%}
{%- endif -%}
{%- if message.content is string -%}{{- message.content | trim -}}{%- endif -%}
{{- '<turn|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|turn>model\n' -}}{%- endif -%}
"""

FUNCTIONGEMMA_LIKE = r"""
{{- bos_token -}}
{%- for message in messages -%}
{{- '<start_of_turn>' + ('model' if message.role == 'assistant' else message.role) + '\n' -}}
{%- for tool_call in message.tool_calls | default([]) -%}
{{- '<start_function_call>call:' + tool_call.function.name + '{' -}}
{%- for k, v in tool_call.function.arguments | dictsort -%}
{{- k + ':' -}}{%- if v is string -%}{{- '<escape>' + v + '<escape>' -}}{%- else -%}{{- v | tojson -}}{%- endif -%}
{%- if not loop.last %},{% endif -%}
{%- endfor -%}
{{- '}<end_function_call>' -}}
{%- endfor -%}
{%- if message.content is string -%}{{- message.content -}}{%- endif -%}
{{- '<end_of_turn>\n' -}}
{%- endfor -%}
"""

REFUSES_TOOL_CALLS = r"""
{%- for message in messages -%}
{%- if message.tool_calls is defined -%}{{- raise_exception('tool calls are not supported') -}}{%- endif -%}
{{- message.role + ': ' + message.content + '\n' -}}
{%- endfor -%}
"""

OWN_MARKUP = r"""
{%- for message in messages -%}
{{- message.role + ': ' + (message.content or '') -}}
{%- for tool_call in message.tool_calls | default([]) -%}{{- ' >>>' + tool_call.function.name + '(' + (tool_call.function.arguments | tojson) + ')' -}}{%- endfor -%}
{{- '\n' -}}
{%- endfor -%}
"""


def renderer(template):
    def render(messages, tools):
        return ct.render_chat(template, messages, tools=tools, add_generation_prompt=False,
                              bos_token="<s>", eos_token="</s>")
    return render


DETECT_CASES = [
    ("smollm2", SMOLLM2_TEMPLATE, tc.GENERIC),
    ("gemma-fallback", ct.GEMMA, tc.GENERIC),
    ("chatml-fallback", ct.CHATML, tc.GENERIC),
    ("qwen2.5", QWEN25_LIKE, tc.HERMES),
    ("qwen3", QWEN3_LIKE, tc.HERMES),
    ("qwen3-coder", QWEN3_CODER_LIKE, tc.QWEN3_CODER),
    ("llama3.1", LLAMA31_LIKE, tc.LLAMA3_JSON),
    ("mistral-nemo", MISTRAL_NEMO_LIKE, tc.MISTRAL),
    ("ministral", MINISTRAL_LIKE, tc.MISTRAL_ARGS),
    ("gemma4", GEMMA4_LIKE, tc.GEMMA4),
    ("functiongemma", FUNCTIONGEMMA_LIKE, tc.FUNCTIONGEMMA),
    ("refuses-tool-calls", REFUSES_TOOL_CALLS, tc.GENERIC),
    ("unknown-markup", OWN_MARKUP, tc.GENERIC),
]


@pytest.mark.parametrize("name,template,framing", DETECT_CASES, ids=[c[0] for c in DETECT_CASES])
def test_detect_framing(name, template, framing):
    assert tc.detect_framing(renderer(template)) is framing


def test_detect_framing_survives_a_failing_renderer():
    def broken(messages, tools):
        raise RuntimeError("no template")
    assert tc.detect_framing(broken) is tc.GENERIC


CONVERSATION_ARGS = {"city": "Zürich", "days": 3, "metric": True}

# Where each template writes the assistant's turn: its markup is what the
# model learned to write, so the parser must read it back.
ROUND_TRIP = [
    (QWEN25_LIKE, "<|im_start|>assistant\n", "<|im_end|>"),
    (QWEN3_LIKE, "<|im_start|>assistant\n", "<|im_end|>"),
    (QWEN3_CODER_LIKE, "<|im_start|>assistant\n", "<|im_end|>"),
    (LLAMA31_LIKE, "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>"),
    (MISTRAL_NEMO_LIKE, "[/INST]", "</s>"),
    (MINISTRAL_LIKE, "[/INST]", "</s>"),
    (GEMMA4_LIKE, "<|turn>model\n", "<turn|>"),
    (FUNCTIONGEMMA_LIKE, "<start_of_turn>model\n", "<end_of_turn>"),
]


@pytest.mark.parametrize("template,start,end", ROUND_TRIP, ids=[
    "qwen2.5", "qwen3", "qwen3-coder", "llama3.1", "mistral-nemo", "ministral", "gemma4", "functiongemma"])
def test_parser_reads_what_the_template_writes(template, start, end):
    render = renderer(template)
    framing = tc.detect_framing(render)
    messages = tc.normalize_tool_messages([
        {"role": "user", "content": "Weather in Zürich for 3 days?"},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "aB3dE6gH9", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps(CONVERSATION_ARGS)}}]},
        {"role": "tool", "tool_call_id": "aB3dE6gH9", "content": "Sunny"},
    ])
    rendered = render(messages, TOOLS)
    written = rendered.split(start)[-1].split(end)[0] if framing is not tc.LLAMA3_JSON else \
        rendered.split(start)[1].split(end)[0]
    content, calls = parse(framing, written)
    assert calls == [("get_weather", CONVERSATION_ARGS)]
    assert content == ""


# ---------------------------------------------------------------------------
# Request validation and tool history
# ---------------------------------------------------------------------------


def test_validate_defaults():
    plan = tc.validate_tools(TOOLS)
    assert (plan.choice, plan.name, plan.parallel, plan.parse, plan.forced) == ("auto", None, False, True, False)
    assert tc.validate_tools(TOOLS, None, True).parallel
    assert plan.template_tools == TOOLS
    none = tc.validate_tools(TOOLS, "none", False)
    assert (none.parse, none.template_tools, none.parallel) == (False, None, False)
    empty = tc.validate_tools(None)
    assert (empty.parse, empty.template_tools, empty.tools) == (False, None, ())
    named = tc.validate_tools(TOOLS, {"type": "function", "function": {"name": "get_time"}})
    assert (named.choice, named.name, named.forced) == ("function", "get_time", True)
    assert tc.validate_tools(TOOLS, "required").forced
    bare = tc.validate_tools([{"type": "function", "function": {"name": "ping"}}])
    assert bare.tools[0]["function"]["parameters"] == {"type": "object", "properties": {}}


@pytest.mark.parametrize("tools,choice,parallel,message", [
    (TOOLS, {"type": "function", "function": {"name": "nope"}}, None, "tool_choice: the tool 'nope' is not among"),
    (None, "required", None, "tool_choice: a call is required, but no tools are declared"),
    (None, {"type": "function", "function": {"name": "get_time"}}, None, "'get_time' is not among"),
    (TOOLS, "sometimes", None, "tool_choice: unknown value 'sometimes'"),
    (TOOLS, {"type": "function"}, None, "tool_choice: expected"),
    (TOOLS, 3, None, "tool_choice: expected a string or an object"),
    (TOOLS, None, "yes", "parallel_tool_calls: expected a boolean"),
    ({"type": "function"}, None, None, "tools: expected an array"),
    ([{"type": "code_interpreter"}], None, None, "tools[0].type: only \"function\""),
    ([{"type": "function"}], None, None, "tools[0].function: expected an object"),
    ([{"type": "function", "function": {"name": "get weather"}}], None, None, "tools[0].function.name: 'get weather'"),
    ([{"type": "function", "function": {"name": "x" * 65}}], None, None, "is not a valid function name"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}], None, None,
     "tools[0].function.parameters: a function's parameters must be an object schema"),
    ([{"type": "function", "function": {"name": "f", "parameters": []}}], None, None, "expected a JSON schema object"),
    ([TOOLS[0], TOOLS[0]], None, None, "tools[1].function.name: 'get_weather' is declared twice"),
])
def test_validate_errors(tools, choice, parallel, message):
    with pytest.raises(tc.ToolRequestError) as err:
        tc.validate_tools(tools, choice, parallel)
    assert message in str(err.value)
    assert isinstance(err.value, ValueError) and isinstance(err.value, InvalidRequestError)


def test_normalize_tool_messages():
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Lyon"}'}},
            {"id": "call_2", "function": {"name": "get_time", "arguments": ""}},
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"},
        {"role": "tool", "tool_call_id": "call_2", "name": "clock", "content": "noon"},
        {"role": "assistant", "content": "Done.", "tool_calls": []},
    ]
    out = tc.normalize_tool_messages(messages)
    assert out[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Lyon"}
    assert out[1]["content"] == ""
    assert out[1]["tool_calls"][1] == {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": {}}}
    assert out[2]["name"] == "get_weather" and out[3]["name"] == "clock"
    assert "tool_calls" not in out[4]
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Lyon"}'  # the input is untouched


@pytest.mark.parametrize("messages,message", [
    ([{"role": "tool", "tool_call_id": "call_9", "content": "x"}], "messages[0].tool_call_id: 'call_9' answers no earlier tool call"),
    ([{"role": "assistant", "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": "{}"}}]},
      {"role": "tool", "tool_call_id": "b", "content": "x"}], "messages[1].tool_call_id: 'b' answers no earlier"),
    ([{"role": "tool", "content": "x"}], "messages[0].tool_call_id: a tool message needs the id"),
    ([{"role": "assistant", "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": "{oops"}}]}],
     "messages[0].tool_calls[0].function.arguments: not valid JSON"),
    ([{"role": "assistant", "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": "[1]"}}]}],
     "must be a JSON object"),
    ([{"role": "assistant", "tool_calls": [{"id": "a"}]}], "messages[0].tool_calls[0].function: expected an object"),
    ([{"role": "user", "content": "x", "tool_calls": [{"id": "a", "function": {"name": "f"}}]}],
     "only assistant messages carry tool calls"),
])
def test_normalize_tool_messages_errors(messages, message):
    with pytest.raises(tc.ToolRequestError) as err:
        tc.normalize_tool_messages(messages)
    assert message in str(err.value)
    assert isinstance(err.value, ValueError)


# ---------------------------------------------------------------------------
# The generic framing's prompt
# ---------------------------------------------------------------------------


def test_generic_tools_prompt_and_history():
    prompt = tc.generic_tools_system_prompt(TOOLS)
    for t in TOOLS:
        assert json.dumps(t["function"]) in prompt
    assert '{"tool_calls": [{"name": ' in prompt
    assert "exactly one call" in tc.generic_tools_system_prompt(TOOLS, parallel=False)

    history = tc.normalize_tool_messages([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Lyon and the time?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Lyon"}'}},
            {"id": "c2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "Sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "noon"},
    ])
    out = tc.apply_generic_tools(history, TOOLS)
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    assert out[0]["content"].startswith("Be brief.\n\n") and prompt in out[0]["content"]
    assert out[2]["content"] == 'Checking.\n{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Lyon"}}, ' \
                                '{"name": "get_time", "arguments": {}}]}'
    assert "tool_calls" not in out[2]
    results = [json.loads(line) for line in out[3]["content"].split("\n")]
    assert results == [{"tool_response": {"name": "get_weather", "tool_call_id": "c1", "content": "Sunny"}},
                       {"tool_response": {"name": "get_time", "tool_call_id": "c2", "content": "noon"}}]
    # What the model is shown of its own past calls is what the parser reads.
    assert parse(tc.GENERIC, out[2]["content"]) == ("Checking.", [("get_weather", {"city": "Lyon"}), ("get_time", {})])

    # A template without tool support renders all of it; without a system
    # message one is added in front.
    rendered = ct.render_chat(SMOLLM2_TEMPLATE, tc.apply_generic_tools(history[1:], TOOLS))
    assert rendered.startswith("<|im_start|>system\nYou can call the following tools.")
    assert '{"tool_response": ' in rendered and rendered.endswith("<|im_start|>assistant\n")
    # Without tools only the history is rewritten.
    assert tc.apply_generic_tools(history[1:], None)[0] == history[1]


# ---------------------------------------------------------------------------
# Grammars for forced calls
# ---------------------------------------------------------------------------


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


def test_plan_grammar():
    plan = tc.validate_tools(TOOLS, {"type": "function", "function": {"name": "get_time"}}, False)
    grammar = plan.grammar(tc.HERMES, json_rules)
    assert "call ::= tool-2-get-time" in grammar
    assert tc.validate_tools(TOOLS).grammar(tc.HERMES, json_rules) is None
