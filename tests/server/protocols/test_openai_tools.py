"""Tool calls on OpenAI's chat route (`ember.server.protocols.openai` over
`ember.chat.tools`). SmolLM2-135M is too small to call a tool by itself,
so these tests force calls (`tool_choice` "required" or a named function):
the constrained decoder writes the call in the template's framing with the
arguments held to the tool's schema, and the reply parser reads it back.
Parsing of unforced calls in each family's markup is tested on recorded
outputs in tests/chat/tools/; here a tiny Qwen-style model with a Hermes
template shows the same path through a real template's framing."""

from __future__ import annotations

import json
import sys

import pytest

from paths import FIXTURES
from server_process import ServerProcess, error_of, http, sse

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

sys.path.insert(0, str(FIXTURES))
import make_tiny_models  # noqa: E402

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a time zone.",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 12}},
                   "required": ["zone"]}}}
ASK = [{"role": "user", "content": "What is the weather in Lyon?"}]


@pytest.fixture(scope="module")
def server(smollm2_path):
    with ServerProcess(smollm2_path) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def check_call(call, tool) -> dict:
    assert call.type == "function" and call.function.name == tool["function"]["name"]
    assert call.id.startswith("call_")
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, tool["function"]["parameters"])
    return args


def test_a_required_call_is_whole_and_valid(client):
    r = client.chat.completions.create(model="any", messages=ASK, tools=[WEATHER], tool_choice="required",
                                       max_tokens=80, temperature=0)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", c
    assert len(c.message.tool_calls) >= 1 and not c.message.content
    check_call(c.message.tool_calls[0], WEATHER)


def test_a_named_function_is_the_one_called(client):
    for tool in (WEATHER, TIME):
        r = client.chat.completions.create(model="any", messages=ASK, tools=[WEATHER, TIME], max_tokens=80,
                                           tool_choice={"type": "function", "function": {"name": tool["function"]["name"]}},
                                           parallel_tool_calls=False, temperature=0.8, seed=3)
        calls = r.choices[0].message.tool_calls
        assert len(calls) == 1
        check_call(calls[0], tool)


def test_a_forced_call_streams_in_openais_shape(client, server):
    stream = client.chat.completions.create(model="any", messages=ASK, tools=[WEATHER], tool_choice="required",
                                            max_tokens=80, temperature=0, stream=True)
    chunks = list(stream)
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    call_deltas = [d.tool_calls[0] for d in deltas if d.tool_calls]
    first = call_deltas[0]
    assert first.index == 0 and first.id and first.type == "function" and first.function.name == "get_weather"
    arguments = "".join(d.function.arguments or "" for d in call_deltas)
    jsonschema.validate(json.loads(arguments), WEATHER["function"]["parameters"])
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert not "".join(d.content or "" for d in deltas), "no markup leaks into content"
    # The client's own stream helper reassembles the same call.
    with client.beta.chat.completions.stream(model="any", messages=ASK, tools=[WEATHER], tool_choice="required",
                                             max_tokens=80, temperature=0) as s:
        final = s.get_final_completion()
    assert final.choices[0].message.tool_calls[0].function.arguments == arguments


def test_a_tool_result_round_trip(client):
    r = client.chat.completions.create(model="any", messages=ASK, tools=[WEATHER], tool_choice="required",
                                       max_tokens=80, temperature=0)
    call = r.choices[0].message.tool_calls[0]
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 21, "sky": "clear"})},
    ]
    r2 = client.chat.completions.create(model="any", messages=history, tools=[WEATHER], max_tokens=24,
                                        temperature=0)
    assert r2.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert r2.choices[0].message.content or r2.choices[0].message.tool_calls


@pytest.mark.parametrize("body,param", [
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
    ({"tools": [WEATHER], "messages": ASK + [{"role": "tool", "tool_call_id": "call_x", "content": "1"}]}, "messages"),
])
def test_bad_tool_requests_are_400s(server, body, param):
    e = error_of(http(server.url + "/v1/chat/completions", {"messages": ASK, "max_tokens": 4, **body}), 400)
    assert e["param"] == param, e


HERMES_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\nYou may call functions. Tools:\\n' }}"
    "{%- for t in tools %}{{- t | tojson }}{{- '\\n' }}{%- endfor %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' and m.tool_calls -%}{{- '<|im_start|>assistant\\n' }}"
    "{%- for c in m.tool_calls -%}{{- '<tool_call>\\n{\"name\": \"' + c.function.name + '\", \"arguments\": ' }}"
    "{{- c.function.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor -%}{{- '<|im_end|>\\n' }}"
    "{%- elif m.role == 'tool' -%}{{- '<|im_start|>user\\n<tool_response>\\n' + m.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else -%}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif -%}"
    "{%- endfor -%}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def test_a_hermes_template_gets_its_own_framing(tmp_path):
    model = make_tiny_models.ensure("qwen2")
    tmpl = tmp_path / "hermes.jinja"
    tmpl.write_text(HERMES_TEMPLATE)
    with ServerProcess(model, "--chat-template-file", str(tmpl)) as s:
        body = {"messages": ASK, "tools": [WEATHER], "tool_choice": "required", "max_tokens": 80, "temperature": 0}
        status, _, raw = http(s.url + "/v1/chat/completions", body)
        assert status == 200, raw
        msg = json.loads(raw)["choices"][0]["message"]
        assert msg["tool_calls"][0]["function"]["name"] == "get_weather"
        jsonschema.validate(json.loads(msg["tool_calls"][0]["function"]["arguments"]),
                            WEATHER["function"]["parameters"])
        # The raw text was Hermes markup: shown by asking for it unparsed through the same grammar.
        status, _, raw = http(s.url + "/v1/chat/completions", {**body, "stream": True})
        deltas = [e["choices"][0]["delta"] for e in sse(raw) if isinstance(e, dict) and e.get("choices")]
        assert not any("<tool_call>" in (d.get("content") or "") for d in deltas)
        assert any(d.get("tool_calls") for d in deltas)


def test_every_call_grammar_starts_with_its_trigger():
    """A watched call waits for its framing's opener and then holds the output
    to the call grammar from that opener on: the grammar must read it."""
    from ember.structured import Grammar, json_schema_rules
    from ember.chat.tools import FRAMINGS, call_grammar, call_trigger, validate_tools

    plan = validate_tools([WEATHER, TIME])
    watched = set()
    for name, framing in FRAMINGS.items():
        trigger = call_trigger(framing)
        if trigger is None:
            continue
        g = Grammar.from_gbnf(call_grammar(framing, plan.tools, None, False, json_schema_rules))
        assert not g.accepts_prefix(b"Sure, " + trigger.encode()), framing
        if g.accepts_prefix(trigger.encode()):
            watched.add(name)
    # The route watches exactly these; Llama 3's calls may open bare, so it is not among them.
    assert {"hermes", "qwen3-coder", "mistral", "gemma4"} <= watched and "llama3-json" not in watched


def test_a_watched_call_lets_prose_through(tmp_path):
    """Under tool_choice auto the reply is free until a call opens: a model
    that writes no call answers in content, untouched by the call grammar."""
    model = make_tiny_models.ensure("qwen2")
    tmpl = tmp_path / "hermes.jinja"
    tmpl.write_text(HERMES_TEMPLATE)
    with ServerProcess(model, "--chat-template-file", str(tmpl)) as s:
        plain = {"messages": ASK, "max_tokens": 12, "temperature": 0}
        status, _, raw = http(s.url + "/v1/chat/completions", plain)
        without = json.loads(raw)["choices"][0]["message"]["content"]
        status, _, raw = http(s.url + "/v1/chat/completions", {**plain, "tools": [WEATHER]})
        assert status == 200, raw
        c = json.loads(raw)["choices"][0]
        assert c["finish_reason"] == "length" and c["message"].get("tool_calls") is None
        # The tools change the prompt, so only the shape is compared: free text, not JSON.
        assert c["message"]["content"] and without
