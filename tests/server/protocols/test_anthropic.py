"""Anthropic's Messages API (`ember.server.protocols.anthropic`) end to end,
through the official `anthropic` client where it can say it and raw HTTP where
the wire itself is the point.

A request here must mean what the same conversation means on OpenAI's chat
route: greedy replies are compared between the two, so every conversion (the
system prompt, tool calls and their results, stop sequences) is checked
against the route already tested. SmolLM2-135M is too small to call a tool or
think by itself, so calls are forced (`tool_choice` any or tool) and thoughts
are steered by a grammar on a tiny random-weight model with a Qwen3-style
template, as in test_openai_tools.py and test_openai_reasoning.py."""

from __future__ import annotations

import json

import pytest

import thinking_model
from server_process import ServerProcess, http
from thinking_model import ANSWER_ONLY, STEERED

anthropic = pytest.importorskip("anthropic")
jsonschema = pytest.importorskip("jsonschema")


GREEDY = {"temperature": 0}
WEATHER = {"name": "get_weather", "description": "Current weather in a city.",
           "input_schema": {"type": "object", "properties": {
               "city": {"type": "string", "maxLength": 20},
               "unit": {"enum": ["celsius", "fahrenheit"]}},
               "required": ["city", "unit"], "additionalProperties": False}}
HELLO = [{"role": "user", "content": "Say hello to the reader."}]


@pytest.fixture(scope="module")
def server(smollm2_path):
    with ServerProcess(smollm2_path, "-np", "2") as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)


def openai_chat(server, messages, **body) -> dict:
    status, _, raw = http(server.url + "/v1/chat/completions", {"messages": messages, **GREEDY, **body})
    assert status == 200, raw
    return json.loads(raw)


def named_events(raw: bytes) -> list[tuple[str, dict]]:
    """(event name, data) of each block of an Anthropic stream; every block must name its event."""
    out = []
    for block in raw.decode().split("\n\n"):
        if not block.strip():
            continue
        head, data = block.split("\n", 1)
        assert head.startswith("event: ") and data.startswith("data: "), block
        ev = json.loads(data[len("data: "):])
        assert ev["type"] == head[len("event: "):]
        out.append((ev["type"], ev))
    return out


def test_a_reply_is_the_chat_routes_reply_in_content_blocks(server, client):
    msg = client.messages.create(model="any", max_tokens=24, messages=HELLO, system="You are terse.",
                                 extra_body=GREEDY)
    chat = openai_chat(server, [{"role": "system", "content": "You are terse."}, *HELLO], max_tokens=24)
    assert msg.type == "message" and msg.role == "assistant" and msg.id.startswith("msg_")
    assert [b.type for b in msg.content] == ["text"]
    assert msg.content[0].text == chat["choices"][0]["message"]["content"]
    assert msg.stop_reason == "max_tokens" and msg.stop_sequence is None
    assert msg.usage.output_tokens == 24
    prompt = chat["usage"]["prompt_tokens"]
    assert msg.usage.input_tokens + msg.usage.cache_read_input_tokens == prompt


def test_count_tokens_is_the_prompt_a_reply_reads(server, client):
    n = client.messages.count_tokens(model="any", messages=HELLO, system="You are terse.")
    chat = openai_chat(server, [{"role": "system", "content": "You are terse."}, *HELLO], max_tokens=1)
    assert n.input_tokens == chat["usage"]["prompt_tokens"]


def test_the_stream_builds_the_same_message(server, client):
    whole = client.messages.create(model="any", max_tokens=20, messages=HELLO, extra_body=GREEDY)
    status, headers, raw = http(server.url + "/v1/messages",
                                {"messages": HELLO, "max_tokens": 20, "stream": True, **GREEDY})
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    events = named_events(raw)
    kinds = [k for k, _ in events]
    assert kinds[:3] == ["message_start", "ping", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[3:-3]) == {"content_block_delta"}
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["id"].startswith("msg_")
    text = "".join(e["delta"]["text"] for k, e in events if k == "content_block_delta")
    assert text == whole.content[0].text
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == 20

    # And the official client's own accumulation of the stream agrees.
    with client.messages.stream(model="any", max_tokens=20, messages=HELLO, extra_body=GREEDY) as s:
        final = s.get_final_message()
    assert final.content[0].text == whole.content[0].text and final.stop_reason == "max_tokens"


def test_a_stop_sequence_ends_the_reply_and_is_named(client):
    whole = client.messages.create(model="any", max_tokens=24, messages=HELLO, extra_body=GREEDY)
    words = whole.content[0].text.split()
    stop = words[len(words) // 2]
    msg = client.messages.create(model="any", max_tokens=24, messages=HELLO, stop_sequences=[stop],
                                 extra_body=GREEDY)
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == stop
    assert whole.content[0].text.startswith(msg.content[0].text) and stop not in msg.content[0].text


def test_llama_server_s_logit_bias_is_read_here_too(server):
    """A bias keyed by text, as llama-server's clients send it on every
    route, bans each of its tokens here as on /completion."""
    ask = {"messages": HELLO, "max_tokens": 8, **GREEDY}
    plain = json.loads(http(server.url + "/v1/messages", ask)[2])["content"][0]["text"]
    # The reply's first word, as the tokenizer reads it alone, is the greedy first token: banned, the reply changes.
    status, _, raw = http(server.url + "/v1/messages", {**ask, "logit_bias": [[plain.split()[0], False]]})
    assert status == 200, raw
    assert json.loads(raw)["content"][0]["text"] != plain


def test_the_structured_outputs_beta_spelling_holds_the_answer(server):
    """`output_format`, the beta's name for `output_config.format` that
    clients still send: read as it, not dropped."""
    schema = {"type": "object", "properties": {"greeting": {"type": "string", "maxLength": 30}},
              "required": ["greeting"], "additionalProperties": False}
    status, _, raw = http(server.url + "/v1/messages", {"messages": HELLO, "max_tokens": 120, **GREEDY,
                                                        "output_format": {"type": "json_schema", "schema": schema}})
    assert status == 200, raw
    jsonschema.validate(json.loads(json.loads(raw)["content"][0]["text"]), schema)


def test_a_json_schema_answer_ends_the_turn(client):
    schema = {"type": "object", "properties": {"greeting": {"type": "string", "maxLength": 30}},
              "required": ["greeting"], "additionalProperties": False}
    msg = client.messages.create(model="any", max_tokens=120, messages=HELLO, extra_body=GREEDY,
                                 output_config={"format": {"type": "json_schema", "schema": schema}})
    jsonschema.validate(json.loads(msg.content[0].text), schema)
    assert msg.stop_reason == "end_turn"


def test_a_forced_tool_is_one_whole_tool_use_block(client):
    msg = client.messages.create(
        model="any", max_tokens=80, messages=[{"role": "user", "content": "Weather in Lyon?"}], tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}, extra_body=GREEDY)
    assert msg.stop_reason == "tool_use"
    uses = [b for b in msg.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "get_weather" and uses[0].id
    jsonschema.validate(uses[0].input, WEATHER["input_schema"])


def test_a_streamed_tool_use_carries_its_input_as_json_deltas(server, client):
    body = {"messages": [{"role": "user", "content": "Weather in Lyon?"}], "max_tokens": 80, "tools": [WEATHER],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True}, **GREEDY}
    _, _, whole = http(server.url + "/v1/messages", body)
    use = json.loads(whole)["content"][-1]
    status, _, raw = http(server.url + "/v1/messages", {**body, "stream": True})
    assert status == 200
    events = named_events(raw)
    starts = [e for k, e in events if k == "content_block_start" and e["content_block"]["type"] == "tool_use"]
    assert len(starts) == 1
    block = starts[0]["content_block"]
    assert block["name"] == "get_weather" and block["input"] == {}
    i = starts[0]["index"]
    partial = "".join(e["delta"]["partial_json"] for k, e in events
                      if k == "content_block_delta" and e["index"] == i)
    assert json.loads(partial) == use["input"]
    assert [e["index"] for k, e in events if k == "content_block_stop"][-1] == i
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"


def test_a_tool_round_trip_reads_as_on_the_chat_route(server, client):
    """An assistant's tool_use and the user's tool_result (with words after it)
    make the same prompt, and so the same greedy reply, as OpenAI's
    assistant tool_calls and tool message."""
    args = {"city": "Lyon", "unit": "celsius"}
    msg = client.messages.create(model="any", max_tokens=16, tools=[WEATHER], extra_body=GREEDY, messages=[
        {"role": "user", "content": "Weather in Lyon?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Let me look."},
                                          {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": args}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": [{"type": "text", "text": "12 degrees, light rain"}]},
                                     {"type": "text", "text": "Summarise it."}]}])
    fn = {k: WEATHER[k] for k in ("name", "description")} | {"parameters": WEATHER["input_schema"]}
    chat = openai_chat(server, [
        {"role": "user", "content": "Weather in Lyon?"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(args)}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "12 degrees, light rain"},
        {"role": "user", "content": "Summarise it."}], max_tokens=16, tools=[{"type": "function", "function": fn}])
    assert msg.content[0].text == chat["choices"][0]["message"]["content"]
    assert msg.usage.input_tokens + msg.usage.cache_read_input_tokens == chat["usage"]["prompt_tokens"]


def test_a_growing_conversation_reads_only_its_new_part(client):
    turns = [{"role": "user", "content": "Name a colour."}]
    n_first = client.messages.count_tokens(model="any", messages=turns).input_tokens
    first = client.messages.create(model="any", max_tokens=8, messages=turns, extra_body=GREEDY)
    turns += [{"role": "assistant", "content": first.content[0].text}, {"role": "user", "content": "Another one."}]
    n_second = client.messages.count_tokens(model="any", messages=turns).input_tokens
    second = client.messages.create(model="any", max_tokens=8, messages=turns, extra_body=GREEDY)
    # The whole first prompt came from the slot's cache; only what followed it was read.
    assert second.usage.cache_read_input_tokens >= n_first
    assert second.usage.input_tokens + second.usage.cache_read_input_tokens == n_second


BAD = [
    ({"messages": HELLO}, "max_tokens"),
    ({"messages": HELLO, "max_tokens": 0}, "max_tokens"),
    ({"messages": [], "max_tokens": 8}, "messages"),
    ({"messages": [{"role": "system", "content": "x"}], "max_tokens": 8}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                            "data": "AA=="}}]}], "max_tokens": 8},
     "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "hologram"}]}], "max_tokens": 8},
     "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}], "max_tokens": 8}, "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}],
      "max_tokens": 8}, "messages[0].content[0].type"),
    ({"messages": [{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "a"}]}], "max_tokens": 8},
     "messages[0].content[0].type"),
    ({"messages": HELLO, "max_tokens": 8, "tools": [{"name": "f"}]}, "tools[0].input_schema"),
    ({"messages": HELLO, "max_tokens": 8, "tools": [{"name": "web_search", "type": "web_search_20250305"}]},
     "tools[0].type"),
    ({"messages": HELLO, "max_tokens": 8, "tools": [WEATHER], "tool_choice": {"type": "tool"}}, "tool_choice.name"),
    ({"messages": HELLO, "max_tokens": 8, "tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}},
     "tool_choice.name"),
    ({"messages": HELLO, "max_tokens": 8, "tool_choice": {"type": "any"}}, "tool_choice.type"),
    ({"messages": HELLO, "max_tokens": 8, "tool_choice": {"type": "sometimes"}}, "tool_choice.type"),
    ({"messages": HELLO, "max_tokens": 8, "tools": [{**WEATHER, "input_schema": {"type": "object", "properties": 3}}],
      "tool_choice": {"type": "any"}}, "tools"),
    ({"messages": HELLO, "max_tokens": 8, "thinking": {"type": "enabled"}}, "thinking.budget_tokens"),
    ({"messages": HELLO, "max_tokens": 8, "thinking": {"type": "deep"}}, "thinking.type"),
    ({"messages": HELLO, "max_tokens": 8, "output_config": {"format": {"type": "xml"}}}, "output_config.format.type"),
    ({"messages": HELLO, "max_tokens": 8, "output_config": {"format": {"type": "json_schema", "schema": {"type": 7}}}},
     "output_config.format"),
    ({"messages": HELLO, "max_tokens": 8, "output_config": {"effort": "huge"}}, "output_config.effort"),
    ({"messages": HELLO, "max_tokens": 8, "output_format": {"type": "xml"}}, "output_format.type"),
    ({"messages": HELLO, "max_tokens": 8, "output_format": {"type": "json_schema", "schema": {"type": "object"}},
      "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}}, "output_format"),
    # What runs on Anthropic's side, and llama-server's samplers ember lacks, are refused, not skipped.
    ({"messages": HELLO, "max_tokens": 8, "mcp_servers": [{"type": "url", "url": "http://127.0.0.1:1", "name": "m"}]},
     "mcp_servers"),
    ({"messages": HELLO, "max_tokens": 8, "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}},
     "context_management"),
    ({"messages": HELLO, "max_tokens": 8, "mirostat": 2}, "mirostat"),
    ({"messages": HELLO, "max_tokens": 8, "samplers": ["top_k", "mirostat"]}, "samplers"),
    ({"messages": HELLO, "max_tokens": 8, "stop_sequences": "END"}, "stop_sequences"),
    ({"messages": HELLO, "max_tokens": 8, "temperature": -1}, "temperature"),
    ({"messages": HELLO, "max_tokens": 8, "temperature": 1.5}, "temperature"),
    ({"messages": HELLO, "max_tokens": 2**64}, "max_tokens"),
    ({"messages": HELLO, "max_tokens": 8, "thinking": {"type": "enabled", "budget_tokens": 2**70}},
     "thinking.budget_tokens"),
    ({"messages": HELLO, "max_tokens": 8, "thinking": {"type": "enabled", "budget_tokens": 8}}, "thinking.budget_tokens"),
    ({"messages": [{"role": "user", "content": ""}], "max_tokens": 8}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": []}], "max_tokens": 8}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": ""}]}], "max_tokens": 8},
     "messages[0].content[0].text"),
    # Errors the chat pipeline finds name the block the client sent, not the chat message it became.
    ({"system": "s", "max_tokens": 8, "messages": [
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "nope", "content": "r"}]}]},
     "messages[0].content[0].tool_use_id"),
    ({"max_tokens": 8, "tools": [{**WEATHER, "input_schema": {"type": "object", "properties": {"a": {"type": 5}}}}],
      "tool_choice": {"type": "any"}, "messages": HELLO}, "tools[0].input_schema"),
    ({"max_tokens": 8, "tools": [WEATHER], "tool_choice": {"type": "any"}, "messages": HELLO,
      "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}}, "tool_choice"),
]


@pytest.mark.parametrize("body,field", BAD, ids=[f for _, f in BAD])
def test_bad_requests_are_400s_in_anthropics_envelope(server, body, field):
    status, _, raw = http(server.url + "/v1/messages", body)
    assert status == 400, raw
    err = json.loads(raw)
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert err["error"]["message"].startswith(field), err


def test_the_official_client_lists_the_model(client):
    models = client.models.list().data
    assert len(models) == 1 and models[0].type == "model" and models[0].display_name == models[0].id
    one = client.models.retrieve(models[0].id)
    assert (one.id, one.type, one.display_name) == (models[0].id, "model", models[0].id)
    with pytest.raises(anthropic.NotFoundError):
        client.models.retrieve("claude-opus-4-1")


def test_the_official_client_reads_the_errors(client):
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="any", max_tokens=8, messages=[{"role": "system", "content": "x"}])
    assert e.value.body["error"]["message"].startswith("messages[0].role")
    with pytest.raises(anthropic.BadRequestError):
        client.messages.count_tokens(model="any", messages=[])


def test_routes_and_bodies_the_server_lacks_are_in_anthropics_envelope(server):
    for reply, status, kind in [
        (http(server.url + "/v1/messages/batches", {}), 404, "not_found_error"),
        (http(server.url + "/v1/messages", method="GET"), 405, "invalid_request_error"),
        (http(server.url + "/v1/messages", raw=b"{not json"), 400, "invalid_request_error"),
    ]:
        got, _, raw = reply
        assert got == status, raw
        assert json.loads(raw)["error"]["type"] == kind


def test_a_key_is_read_from_x_api_key(smollm2_path):
    with ServerProcess(smollm2_path, "--api-key", "sesame") as s:
        good = anthropic.Anthropic(base_url=s.url, api_key="sesame", max_retries=0)
        assert good.messages.count_tokens(model="any", messages=HELLO).input_tokens > 0
        bad = anthropic.Anthropic(base_url=s.url, api_key="wrong", max_retries=0)
        with pytest.raises(anthropic.AuthenticationError) as e:
            bad.messages.count_tokens(model="any", messages=HELLO)
        assert e.value.body["error"]["type"] == "authentication_error"


# -- thinking, on a tiny model whose template opens a thought -----------------------

@pytest.fixture(scope="module")
def thinker(tmp_path_factory):
    with thinking_model.serving(tmp_path_factory.mktemp("models")) as s:
        yield s


def test_a_thought_is_a_thinking_block_before_the_text(thinker):
    body = {"messages": [{"role": "user", "content": "Why?"}], "max_tokens": 40, "grammar": STEERED,
            "thinking": {"type": "enabled", "budget_tokens": 30}, **GREEDY}
    status, _, raw = http(thinker.url + "/v1/messages", body)
    assert status == 200, raw
    content = json.loads(raw)["content"]
    assert [b["type"] for b in content] == ["thinking", "text"]
    assert content[0]["thinking"].startswith("Let me think") and "</think>" not in content[0]["thinking"]
    assert content[0]["signature"] == ""
    assert content[1]["text"].startswith("The answer")

    status, _, raw = http(thinker.url + "/v1/messages", {**body, "stream": True})
    events = named_events(raw)
    blocks = [e["content_block"]["type"] for k, e in events if k == "content_block_start"]
    assert blocks == ["thinking", "text"]
    thought = "".join(e["delta"]["thinking"] for k, e in events
                      if k == "content_block_delta" and e["delta"]["type"] == "thinking_delta")
    assert thought == content[0]["thinking"]
    # The thinking block is closed, with its (empty) signature, before the text block opens.
    kinds = [(k, e.get("delta", {}).get("type")) for k, e in events]
    sig = kinds.index(("content_block_delta", "signature_delta"))
    assert kinds[sig + 1][0] == "content_block_stop" and kinds[sig + 2][0] == "content_block_start"

    status, _, raw = http(thinker.url + "/v1/messages",
                          {**body, "thinking": {"type": "enabled", "budget_tokens": 30, "display": "omitted"}})
    content = json.loads(raw)["content"]
    assert content[0] == {"type": "thinking", "thinking": "", "signature": ""}


def test_thinking_disabled_closes_the_thought_in_the_prompt(thinker):
    body = {"messages": [{"role": "user", "content": "Why?"}], "max_tokens": 20, "grammar": ANSWER_ONLY,
            "thinking": {"type": "disabled"}, **GREEDY}
    status, _, raw = http(thinker.url + "/v1/messages", body)
    assert status == 200, raw
    content = json.loads(raw)["content"]
    assert [b["type"] for b in content] == ["text"] and content[0]["text"].startswith("The answer")


def test_an_earlier_thought_goes_back_to_the_template(thinker):
    """An assistant's thinking block is its reasoning_content, as the chat route takes it."""
    history = [{"role": "user", "content": "Why?"},
               {"role": "assistant", "content": [{"type": "thinking", "thinking": "Because.", "signature": ""},
                                                 {"type": "text", "text": "The answer"}]},
               {"role": "user", "content": "And then?"}]
    status, _, raw = http(thinker.url + "/v1/messages/count_tokens", {"messages": history})
    assert status == 200, raw
    openai_history = [history[0], {"role": "assistant", "content": "The answer", "reasoning_content": "Because."},
                      history[2]]
    chat = openai_chat(thinker, openai_history, max_tokens=1)
    assert json.loads(raw)["input_tokens"] == chat["usage"]["prompt_tokens"]


def test_a_stop_sequence_inside_a_forced_call_closes_the_call(client):
    """The client's stop string cut the call: what was read of it comes back,
    as when max_tokens cuts it, rather than an error."""
    msg = client.messages.create(
        model="any", max_tokens=80, messages=[{"role": "user", "content": "Weather in Lyon?"}], tools=[WEATHER],
        stop_sequences=["unit"], extra_body=GREEDY,
        tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True})
    uses = [b for b in msg.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "get_weather"
    # Cut, so perhaps incomplete: said as the stop sequence, not as a call to run.
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == "unit"


def test_a_stop_string_inside_a_forced_call_is_stop_on_the_chat_route(server):
    body = {"messages": [{"role": "user", "content": "Weather in Lyon?"}], "max_tokens": 80, "stop": ["unit"],
            "tools": [{"type": "function", "function": {"name": WEATHER["name"], "parameters": WEATHER["input_schema"]}}],
            "tool_choice": "required", **GREEDY}
    status, _, raw = http(server.url + "/v1/chat/completions", body)
    choice = json.loads(raw)["choices"][0]
    assert status == 200 and choice["finish_reason"] == "stop" and choice["message"]["tool_calls"]


def test_text_parts_and_failed_results_read_as_on_the_chat_route(server, client):
    parts = [{"type": "text", "text": "First part."}, {"type": "text", "text": "Second part."}]
    n = client.messages.count_tokens(model="any", messages=[{"role": "user", "content": parts}]).input_tokens
    chat = openai_chat(server, [{"role": "user", "content": parts}], max_tokens=1)
    assert n == chat["usage"]["prompt_tokens"]
    # A failed tool's result says so to the model.
    def result(is_error):
        return client.messages.count_tokens(model="any", tools=[WEATHER], messages=[
            {"role": "user", "content": "Weather in Lyon?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather",
                                               "input": {"city": "Lyon", "unit": "celsius"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "timeout",
                                          "is_error": is_error}]}]).input_tokens
    assert result(True) > result(False)


def test_a_final_assistant_message_is_continued(server, client):
    """Anthropic's prefill: the reply goes on from the assistant's own words,
    as /completion goes on from the same prompt text."""
    turns = [{"role": "user", "content": "Count from one to ten."}, {"role": "assistant", "content": "One, two,"}]
    msg = client.messages.create(model="any", max_tokens=10, messages=turns, extra_body=GREEDY)
    _, _, raw = http(server.url + "/apply-template", {"messages": turns[:1]})
    prompt = json.loads(raw)["prompt"] + "One, two,"
    _, _, raw = http(server.url + "/completion", {"prompt": prompt, "n_predict": 10, **GREEDY})
    assert msg.content[0].text == json.loads(raw)["content"]
