"""OpenAI's Responses API (`ember.server.protocols.responses`) end to end,
through the official `openai` client (whose stream accumulator checks every
item's identity from `added` to `done` to the final response) and raw HTTP
where the wire is the point.

As with Anthropic's route, a request must mean what the same conversation
means on chat completions: greedy replies and prompt sizes are compared
between the two. SmolLM2-135M cannot call a tool or think by itself, so calls
are forced and thoughts are steered by a grammar on a tiny random-weight model
with a Qwen3-style template."""

from __future__ import annotations

import json

import pytest

import thinking_model
from server_process import ServerProcess, error_of, http
from thinking_model import STEERED

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")


WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather in a city.",
           "parameters": {"type": "object", "properties": {
               "city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["celsius", "fahrenheit"]}},
               "required": ["city", "unit"], "additionalProperties": False}}
CHAT_WEATHER = {"type": "function", "function": {k: WEATHER[k] for k in ("name", "description", "parameters")}}


@pytest.fixture(scope="module")
def server(smollm2_path):
    with ServerProcess(smollm2_path, "-np", "2") as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def chat(server, messages, **body) -> dict:
    status, _, raw = http(server.url + "/v1/chat/completions", {"messages": messages, "temperature": 0, **body})
    assert status == 200, raw
    return json.loads(raw)


def events_of(raw: bytes) -> list[dict]:
    out = []
    for block in raw.decode().split("\n\n"):
        if block.strip():
            head, data = block.split("\n", 1)
            ev = json.loads(data[len("data: "):])
            assert head == f"event: {ev['type']}"
            out.append(ev)
    return out


def test_a_reply_is_the_chat_routes_reply_as_a_message_item(server, client):
    r = client.responses.create(model="any", input="Say hello.", instructions="You are terse.", temperature=0,
                                max_output_tokens=20)
    c = chat(server, [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hello."}],
             max_tokens=20)
    assert r.object == "response" and r.id.startswith("resp_")
    assert [o.type for o in r.output] == ["message"]
    assert r.output_text == c["choices"][0]["message"]["content"]
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output[0].status == "incomplete"
    assert r.usage.input_tokens == c["usage"]["prompt_tokens"] and r.usage.output_tokens == 20
    assert r.usage.total_tokens == r.usage.input_tokens + 20


def test_the_stream_builds_the_same_response(server, client):
    whole = client.responses.create(model="any", input="Name three colours.", temperature=0, max_output_tokens=400)
    assert whole.status == "completed"  # the model ends its turn well before the limit
    with client.responses.stream(model="any", input="Name three colours.", temperature=0,
                                 max_output_tokens=400) as s:
        final = s.get_final_response()
    assert final.output_text == whole.output_text and final.status == "completed"

    status, _, raw = http(server.url + "/v1/responses", {"input": "Name three colours.", "temperature": 0,
                                                         "max_output_tokens": 400, "stream": True})
    events = events_of(raw)
    kinds = [e["type"] for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == whole.output_text
    done = events[-1]["response"]
    assert done["id"] == events[0]["response"]["id"] and done["output"][0]["id"] == events[2]["item"]["id"]

    # Cut by max_output_tokens: the stream ends in response.incomplete, the item incomplete too.
    status, _, raw = http(server.url + "/v1/responses", {"input": "Name three colours.", "temperature": 0,
                                                         "max_output_tokens": 3, "stream": True})
    events = events_of(raw)
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert events[-2]["type"] == "response.output_item.done" and events[-2]["item"]["status"] == "incomplete"


def test_a_forced_call_is_a_function_call_item(server, client):
    r = client.responses.create(model="any", input="Weather in Lyon?", tools=[WEATHER], tool_choice="required",
                                parallel_tool_calls=False, temperature=0, max_output_tokens=80)
    calls = [o for o in r.output if o.type == "function_call"]
    assert r.status == "completed" and len(calls) == 1
    assert calls[0].name == "get_weather" and calls[0].call_id and calls[0].id.startswith("fc_")
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER["parameters"])

    status, _, raw = http(server.url + "/v1/responses", {
        "input": "Weather in Lyon?", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "get_weather"},
        "parallel_tool_calls": False, "temperature": 0, "max_output_tokens": 80, "stream": True})
    events = events_of(raw)
    added = [e for e in events if e["type"] == "response.output_item.added" and e["item"]["type"] == "function_call"]
    assert len(added) == 1
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
    done = next(e for e in events if e["type"] == "response.function_call_arguments.done")
    assert deltas == done["arguments"] == calls[0].arguments

    # The official client's accumulator checks each item's identity from added to done.
    with client.responses.stream(model="any", input="Weather in Lyon?", tools=[WEATHER], tool_choice="required",
                                 parallel_tool_calls=False, temperature=0, max_output_tokens=80) as s:
        final = s.get_final_response()
    streamed = [o for o in final.output if o.type == "function_call"]
    assert len(streamed) == 1 and streamed[0].name == "get_weather"
    assert streamed[0].arguments == calls[0].arguments


def test_a_call_and_its_output_read_as_on_the_chat_route(server, client):
    args = json.dumps({"city": "Lyon", "unit": "celsius"})
    r = client.responses.create(model="any", tools=[WEATHER], temperature=0, max_output_tokens=16, input=[
        {"role": "user", "content": "Weather in Lyon?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": args},
        {"type": "function_call_output", "call_id": "call_1", "output": "12 degrees, light rain"},
        {"role": "user", "content": [{"type": "input_text", "text": "Summarise it."}]}])
    # The Responses API lets several calls through unless told otherwise (the
    # chat route, as llama-server, one): the same grammar on both routes.
    c = chat(server, [
        {"role": "user", "content": "Weather in Lyon?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": args}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12 degrees, light rain"},
        {"role": "user", "content": "Summarise it."}], max_tokens=16, tools=[CHAT_WEATHER], parallel_tool_calls=True)
    assert r.output_text == c["choices"][0]["message"]["content"]
    assert r.usage.input_tokens == c["usage"]["prompt_tokens"]
    assert r.usage.input_tokens_details.cached_tokens > 0  # the chat request left the same prefix in a slot


def test_llama_server_penalties_are_read_here_too(server):
    """The penalties llama-server's clients send on every route shape this
    route's answer as they shape the chat route's (they were once dropped);
    an `include` with nothing to add is accepted."""
    ask = {"input": "List the colours of the rainbow, comma-separated, twice.", "max_output_tokens": 24,
           "temperature": 0}
    plain = json.loads(http(server.url + "/v1/responses", ask)[2])
    status, _, raw = http(server.url + "/v1/responses", {**ask, "presence_penalty": 2.0, "frequency_penalty": 2.0,
                                                         "include": ["reasoning.encrypted_content"]})
    assert status == 200, raw
    chat = json.loads(http(server.url + "/v1/chat/completions", {
        "messages": [{"role": "user", "content": ask["input"]}], "max_tokens": 24, "temperature": 0,
        "presence_penalty": 2.0, "frequency_penalty": 2.0})[2])
    penalised = json.loads(raw)["output"][-1]["content"][0]["text"]
    assert penalised == chat["choices"][0]["message"]["content"]
    assert penalised != plain["output"][-1]["content"][0]["text"]


def test_a_json_schema_format_holds_the_answer(client):
    schema = {"type": "object", "properties": {"greeting": {"type": "string", "maxLength": 30}},
              "required": ["greeting"], "additionalProperties": False}
    r = client.responses.create(model="any", input="Greet me in JSON.", temperature=0, max_output_tokens=120,
                                text={"format": {"type": "json_schema", "name": "g", "schema": schema}})
    assert r.status == "completed"
    jsonschema.validate(json.loads(r.output_text), schema)


BAD = [
    ({}, "input"),
    ({"input": []}, "input"),
    ({"input": ""}, "input"),
    ({"input": "", "instructions": "Be brief."}, "input"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": "x", "tools": [{"type": "function"}]}, "tools[0].name"),
    ({"input": "x", "tools": [WEATHER], "tool_choice": {"type": "file_search"}}, "tool_choice"),
    ({"input": "x", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"input": [{"type": "telepathy"}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]},
     "input[0].content[0].type"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].id"),
    ({"input": [{"type": "function_call", "name": "f"}]}, "input[0]"),
    ({"input": "x", "text": {"format": {"type": "yaml"}}}, "text.format.type"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "g", "schema": {"type": 5}}}}, "text.format"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "x", "reasoning": {"effort": "enormous"}}, "reasoning.effort"),
    ({"input": "x", "top_logprobs": 3}, "top_logprobs"),
    ({"input": "x", "temperature": -2}, "temperature"),
    ({"input": "x", "temperature": 3}, "temperature"),
    ({"input": "x", "background": True, "store": False}, "background"),
    ({"input": "x", "background": True, "stream": True}, "background"),
    ({"input": "x", "truncation": "auto"}, "truncation"),
    # What this server does not keep or return is refused, not skipped.
    ({"input": "x", "include": ["message.output_text.logprobs"]}, "include[0]"),
    ({"input": "x", "include": ["reasoning.encrypted_content", "everything"]}, "include[1]"),
    ({"input": "x", "conversation": "conv_123"}, "conversation"),
    ({"input": "x", "prompt": {"id": "pmpt_1", "variables": {"a": "b"}}}, "prompt"),
    ({"input": "x", "text": {"verbosity": "low"}}, "text.verbosity"),
    ({"input": "x", "mirostat": 2}, "mirostat"),
    ({"input": "x", "dry_multiplier": 0.8}, "dry_multiplier"),
    ({"input": "x", "max_output_tokens": 2**40}, "max_output_tokens"),
    ({"input": "x", "tool_choice": "sometimes"}, "tool_choice"),
    # Errors the chat pipeline finds name the item the client sent, not the chat message it became.
    ({"instructions": "i", "input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "not json"}]},
     "input[0].arguments"),
    ({"input": [{"type": "function_call_output", "call_id": "nope", "output": "r"}]}, "input[0].call_id"),
    ({"input": "x", "tools": [{**WEATHER, "parameters": {"type": "object", "properties": {"a": {"type": 5}}}}],
      "tool_choice": "required"}, "tools[0].parameters"),
]


@pytest.mark.parametrize("body,field", BAD, ids=[f for _, f in BAD])
def test_bad_requests_are_400s_naming_the_field(server, body, field):
    e = error_of(http(server.url + "/v1/responses", body), 400)
    assert e["message"].startswith(field), e


def test_the_official_client_reads_the_errors(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="any", input="x", truncation="auto")
    assert e.value.body["param"] == "truncation"
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model="any", input="x", previous_response_id="resp_1")
    assert e.value.body["param"] == "previous_response_id" and "no stored response" in e.value.body["message"]


# -- reasoning, on a tiny model whose template opens a thought ------------------------

@pytest.fixture(scope="module")
def thinker(tmp_path_factory):
    with thinking_model.serving(tmp_path_factory.mktemp("models")) as s:
        yield s


def test_a_thought_is_a_reasoning_item_before_the_message(thinker):
    body = {"input": "Why?", "max_output_tokens": 40, "grammar": STEERED, "temperature": 0}
    status, _, raw = http(thinker.url + "/v1/responses", body)
    assert status == 200, raw
    r = json.loads(raw)
    assert [o["type"] for o in r["output"]] == ["reasoning", "message"]
    thought = r["output"][0]["content"][0]["text"]
    assert thought.startswith("Let me think") and "</think>" not in thought
    assert r["output"][1]["content"][0]["text"].startswith("The answer")
    assert 0 < r["usage"]["output_tokens_details"]["reasoning_tokens"] < r["usage"]["output_tokens"]

    status, _, raw = http(thinker.url + "/v1/responses", {**body, "stream": True})
    events = events_of(raw)
    streamed = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta")
    assert streamed == thought
    kinds = [e["type"] for e in events]
    assert kinds.index("response.reasoning_text.done") < kinds.index("response.output_text.delta")

    # An earlier turn's reasoning item goes back to the template as that turn's reasoning_content.
    history = [{"role": "user", "content": "Why?"},
               {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Because."}]},
               {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "The answer"}]},
               {"role": "user", "content": "And then?"}]
    status, _, raw = http(thinker.url + "/v1/responses", {"input": history, "max_output_tokens": 1, "temperature": 0})
    assert status == 200, raw
    c = chat(thinker, [history[0], {"role": "assistant", "content": "The answer", "reasoning_content": "Because."},
                       history[3]], max_tokens=1)
    assert json.loads(raw)["usage"]["input_tokens"] == c["usage"]["prompt_tokens"]


# -- llama-server's fields, read as its own responses route reads them ------------------

def _respond(server, **body) -> dict:
    status, _, raw = http(server.url + "/v1/responses", {"input": "Name three colours.", "temperature": 0,
                                                         "ignore_eos": True, **body})
    assert status == 200, raw
    return json.loads(raw)


def test_n_predict_bounds_the_reply_before_max_output_tokens(server):
    r = _respond(server, n_predict=3, max_output_tokens=9)
    assert r["usage"]["output_tokens"] == 3
    assert r["status"] == "incomplete" and r["incomplete_details"] == {"reason": "max_output_tokens"}


def test_stop_strings_end_the_reply_where_they_first_appear(server):
    whole = _respond(server, max_output_tokens=16)["output"][-1]["content"][0]["text"]
    words = whole.split()
    assert len(words) >= 3, whole
    stop = words[2]
    r = _respond(server, max_output_tokens=16, stop=[stop])
    assert r["status"] == "completed"
    assert r["output"][-1]["content"][0]["text"] == whole[:whole.index(stop)]
    e = error_of(http(server.url + "/v1/responses", {"input": "Hi", "stop": 7}), 400)
    assert e["param"] == "stop", e
