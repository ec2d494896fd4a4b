"""Tool calls read from a model's output (`ember.chat.tools.stream`, with each
framing's block parser: hermes, qwen3_coder, llama3, mistral, gemma, generic),
whole and streamed, equal for every chunking; the calls' ids and OpenAI shapes.

The model outputs are recorded-style samples written out by hand in each
family's markup: the small test models cannot call tools by themselves, so no
real generation would exercise these paths."""

from __future__ import annotations

import json
import random
import re

import pytest

from ember.chat import events as ev
from ember.chat import tools as tc
from tool_cases import TOOLS, counter_ids, parse


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
