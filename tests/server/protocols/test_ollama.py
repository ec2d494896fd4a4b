"""Ollama's API (`ember.server.protocols.ollama`) end to end, through the
official `ollama` client and raw HTTP (newline-delimited JSON, Ollama's
default). A chat must mean what the same conversation means on OpenAI's chat
route, so greedy replies and prompt sizes are compared between the two.
SmolLM2-135M cannot call a tool by itself, so calls are forced through ember's
`tool_choice` extension; thoughts are steered by a grammar on a tiny
random-weight model with a Qwen3-style template."""

from __future__ import annotations

import json

import numpy as np
import pytest

import thinking_model
from server_process import ServerProcess, http
from thinking_model import ANSWER_ONLY, STEERED

ollama = pytest.importorskip("ollama")
jsonschema = pytest.importorskip("jsonschema")


GREEDY = {"temperature": 0}
HELLO = [{"role": "user", "content": "Say hello to the reader."}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}


@pytest.fixture(scope="module")
def server(smollm2_path):
    with ServerProcess(smollm2_path, "-np", "2", "--embeddings") as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return ollama.Client(host=server.url)


def openai_chat(server, messages, **body) -> dict:
    status, _, raw = http(server.url + "/v1/chat/completions", {"messages": messages, **GREEDY, **body})
    assert status == 200, raw
    return json.loads(raw)


def lines(raw: bytes) -> list[dict]:
    return [json.loads(line) for line in raw.decode().splitlines() if line.strip()]


def test_a_chat_is_the_chat_routes_reply(server, client):
    r = client.chat(model="any", messages=HELLO, options={**GREEDY, "num_predict": 20})
    c = openai_chat(server, HELLO, max_tokens=20)
    assert r.message.role == "assistant" and r.message.content == c["choices"][0]["message"]["content"]
    assert r.done and r.done_reason == "length" and r.eval_count == 20
    assert r.prompt_eval_count == c["usage"]["prompt_tokens"]
    assert r.total_duration >= r.eval_duration > 0


def test_the_stream_is_ndjson_ending_in_the_stats(server, client):
    whole = client.chat(model="any", messages=HELLO, options={**GREEDY, "num_predict": 16})
    parts = list(client.chat(model="any", messages=HELLO, options={**GREEDY, "num_predict": 16}, stream=True))
    assert "".join(p.message.content for p in parts) == whole.message.content
    assert all(not p.done for p in parts[:-1]) and parts[-1].done and parts[-1].eval_count == 16

    status, headers, raw = http(server.url + "/api/chat", {"messages": HELLO, "options": {**GREEDY, "num_predict": 4}})
    assert status == 200 and headers["Content-Type"].startswith("application/x-ndjson")
    objs = lines(raw)
    assert objs[-1]["done"] is True and "created_at" in objs[0] and objs[0]["created_at"].endswith("Z")


def test_generate_wraps_the_prompt_in_the_template_unless_raw(server, client):
    r = client.generate(model="any", prompt="Say hello to the reader.", options={**GREEDY, "num_predict": 12})
    c = openai_chat(server, HELLO, max_tokens=12)
    assert r.response == c["choices"][0]["message"]["content"]
    assert len(r.context) == r.prompt_eval_count + r.eval_count == c["usage"]["total_tokens"]
    raw = client.generate(model="any", prompt="The capital of France is", raw=True,
                          options={**GREEDY, "num_predict": 6})
    status, _, body = http(server.url + "/v1/completions", {"prompt": "The capital of France is", "max_tokens": 6,
                                                             **GREEDY})
    assert raw.response == json.loads(body)["choices"][0]["text"]
    # An empty prompt loads the model, as Ollama's clients use it; so do no messages on the chat route.
    assert client.generate(model="any", prompt="").done_reason == "load"
    loaded = client.chat(model="any", messages=[])
    assert loaded.done_reason == "load" and loaded.message.content == ""


def test_a_context_continues_where_the_last_reply_ended(client):
    first = client.generate(model="any", prompt="Name a colour.", options={**GREEDY, "num_predict": 6})
    second = client.generate(model="any", prompt="Another one.", context=first.context,
                             options={**GREEDY, "num_predict": 6})
    assert second.context[:len(first.context)] == first.context
    assert second.prompt_eval_count > len(first.context)


def test_a_tool_round_trip_reads_as_on_the_chat_route(server, client):
    args = {"city": "Lyon", "unit": "celsius"}
    # Raw HTTP: the client rewrites tool schemas through its own model of them.
    status, _, raw = http(server.url + "/api/chat", {
        "tools": [WEATHER], "options": {**GREEDY, "num_predict": 12}, "stream": False, "messages": [
            {"role": "user", "content": "Weather in Lyon?"},
            {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather", "arguments": args}}]},
            {"role": "tool", "content": "12 degrees, light rain", "tool_name": "get_weather"},
            {"role": "user", "content": "Summarise it."}]})
    assert status == 200, raw
    r = ollama.ChatResponse(**json.loads(raw))
    c = openai_chat(server, [
        {"role": "user", "content": "Weather in Lyon?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1_0", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(args)}}]},
        {"role": "tool", "tool_call_id": "call_1_0", "content": "12 degrees, light rain"},
        {"role": "user", "content": "Summarise it."}], max_tokens=12, tools=[WEATHER])
    assert r.message.content == c["choices"][0]["message"]["content"]
    assert r.prompt_eval_count == c["usage"]["prompt_tokens"]


def test_a_forced_call_comes_back_with_object_arguments(server):
    body = {"messages": [{"role": "user", "content": "Weather in Lyon?"}], "tools": [WEATHER], "stream": False,
            "tool_choice": "required", "options": {**GREEDY, "num_predict": 80}}
    status, _, raw = http(server.url + "/api/chat", body)
    assert status == 200, raw
    calls = json.loads(raw)["message"]["tool_calls"]
    assert len(calls) == 1 and calls[0]["function"]["name"] == "get_weather" and calls[0]["id"]
    jsonschema.validate(calls[0]["function"]["arguments"], WEATHER["function"]["parameters"])
    status, _, raw = http(server.url + "/api/chat", {**body, "stream": True})
    streamed = [o["message"].get("tool_calls") for o in lines(raw) if o["done"]][0]
    # Each reply names its calls afresh.
    assert [{k: v for k, v in c.items() if k != "id"} for c in streamed] == [
        {k: v for k, v in c.items() if k != "id"} for c in calls] and streamed[0]["id"]


def test_a_format_schema_holds_the_answer(client):
    schema = {"type": "object", "properties": {"greeting": {"type": "string", "maxLength": 30}},
              "required": ["greeting"], "additionalProperties": False}
    r = client.chat(model="any", messages=HELLO, format=schema, options={**GREEDY, "num_predict": 120})
    jsonschema.validate(json.loads(r.message.content), schema)
    assert r.done_reason == "stop"
    # A prompt this small model answers in a few lines under greedy decoding
    # (the grammar holds the form, not the length: others it nests without end).
    r = client.generate(model="any", prompt="Give a JSON object with a name and an age.", format="json",
                        options={**GREEDY, "num_predict": 200})
    assert r.done_reason == "stop" and isinstance(json.loads(r.response), dict)


def test_logprobs_come_with_each_token_as_on_chat_completions(server, client):
    """Ollama's `logprobs` and `top_logprobs`: each drawn token's, whole or
    spread over the stream's lines, the same as chat completions give for
    the same conversation."""
    r = client.chat(model="any", messages=HELLO, logprobs=True, top_logprobs=2, options={**GREEDY, "num_predict": 6})
    assert len(r.logprobs) == r.eval_count == 6
    assert all(len(lp.top_logprobs) == 2 and lp.top_logprobs[0].logprob >= lp.top_logprobs[1].logprob
               for lp in r.logprobs)
    chat = json.loads(http(server.url + "/v1/chat/completions", {"messages": HELLO, "max_tokens": 6, "temperature": 0,
                                                                  "logprobs": True, "top_logprobs": 2})[2])
    want = [(e["token"], e["logprob"]) for e in chat["choices"][0]["logprobs"]["content"]]
    assert [(lp.token, lp.logprob) for lp in r.logprobs] == want
    streamed = [lp for part in client.chat(model="any", messages=HELLO, logprobs=True, top_logprobs=2, stream=True,
                                           options={**GREEDY, "num_predict": 6}) for lp in (part.logprobs or [])]
    assert [(lp.token, lp.logprob) for lp in streamed] == want
    g = client.generate(model="any", prompt="Say hello.", logprobs=True, options={**GREEDY, "num_predict": 3})
    assert len(g.logprobs) == 3 and all(lp.top_logprobs == [] for lp in g.logprobs)
    assert "logprobs" not in client.chat(model="any", messages=HELLO, options={**GREEDY, "num_predict": 2}).model_dump(
        exclude_none=True)


def test_the_model_is_listed_and_described(client, smollm2):
    listed = client.list().models
    assert len(listed) == 1
    m = listed[0]
    assert m.model.endswith(":latest") and " " not in m.model
    assert m.details.format == "gguf" and m.details.family == "llama"
    assert m.details.parameter_size == "135M" and m.details.quantization_level == "Q4_1"
    shown = client.show(m.model)
    assert shown.details.family == "llama" and shown.modelinfo["general.architecture"] == "llama"
    assert shown.template == smollm2.chat_template
    running = client.ps().models
    assert running[0].model == m.model


def test_embed_answers_a_vector_per_input(client, smollm2):
    r = client.embed(model="any", input=["The cat sat on the mat.", "Quarterly revenue grew."])
    assert len(r.embeddings) == 2
    assert np.allclose(r.embeddings[0], smollm2.embed("The cat sat on the mat.", pooling="mean"), atol=1e-6)
    # The older route answers the pooled vector unnormalized, as Ollama's does.
    old = client.embeddings(model="any", prompt="The cat sat on the mat.")
    assert np.allclose(old.embedding, smollm2.embed("The cat sat on the mat.", pooling="mean", normalize=-1), atol=1e-5)
    assert client.embeddings(model="any", prompt="").embedding == []
    # Longer than a slot: cut to fit, as Ollama does unless told not to.
    assert len(client.embed(model="any", input="word " * 3000).embeddings[0]) == smollm2.n_embd


# -- num_ctx: the context a request asks for ---------------------------------------------

def test_a_smaller_num_ctx_ends_the_reply_where_that_context_is_full(server, client):
    n_prompt = openai_chat(server, HELLO, max_tokens=1)["usage"]["prompt_tokens"]
    r = client.chat(model="any", messages=HELLO, options={**GREEDY, "num_predict": 40, "num_ctx": n_prompt + 5})
    c = openai_chat(server, HELLO, max_tokens=5)
    assert r.eval_count == 5 and r.done_reason == "length"
    assert r.message.content == c["choices"][0]["message"]["content"]
    # "Until the context is full" is until that context is full.
    g = client.chat(model="any", messages=HELLO, options={**GREEDY, "num_predict": -2, "num_ctx": n_prompt + 3})
    assert g.eval_count == 3 and g.done_reason == "length"
    # A larger one than a slot's gets a slot's, as Ollama gives a model's trained context to a request for more.
    big = client.chat(model="any", messages=HELLO, options={**GREEDY, "num_predict": 20, "num_ctx": 1 << 20})
    assert big.eval_count == 20


def test_embed_cuts_each_input_to_the_num_ctx_asked_for(client, smollm2):
    text = "word " * 40
    r = client.embed(model="any", input=text, options={"num_ctx": 16})
    assert r.prompt_eval_count == 16
    ids = smollm2.tokenize(text, add_special=True, parse_special=True)[:16]
    assert np.allclose(r.embeddings[0], smollm2.embed(ids, pooling="mean"), atol=1e-6)


# -- tool results matched to their calls by id ------------------------------------------

def test_a_tool_result_answers_the_call_whose_id_it_gives():
    from ember.server.protocols.ollama import ChatBody, Message, _chat_messages

    calls = [{"id": "lyon", "function": {"name": "get_weather", "arguments": {"city": "Lyon"}}},
             {"id": "oslo", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]
    body = ChatBody(messages=[
        Message(role="user", content="Weather in Lyon and Oslo?"),
        Message(role="assistant", tool_calls=calls),
        Message(role="tool", content="-3 degrees", tool_call_id="oslo", tool_name="get_weather"),
        Message(role="tool", content="12 degrees", tool_call_id="lyon")])
    assert [m.get("tool_call_id") for m in _chat_messages(body)] == [None, None, "oslo", "lyon"]
    # Without ids, the first call still waiting.
    for m in body.messages[2:]:
        m.tool_call_id = None
    assert [m.get("tool_call_id") for m in _chat_messages(body)] == [None, None, "lyon", "oslo"]


@pytest.mark.parametrize("route,body,says", [
    ("/api/chat", {"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ("/api/chat", {"messages": [{"role": "user", "content": "x", "images": ["AAAA"]}]}, "messages[0].images"),
    ("/api/chat", {"messages": [{"role": "tool", "content": "x"}]}, "messages[0]"),
    ("/api/chat", {"messages": HELLO, "format": 7}, "format"),
    ("/api/chat", {"messages": HELLO, "think": "maybe"}, "think"),
    ("/api/chat", {"messages": HELLO, "options": {"temperature": -1}}, "options.temperature"),
    ("/api/chat", {"messages": HELLO, "options": {"mirostat": 2}}, "options.mirostat"),
    ("/api/chat", {"messages": HELLO, "options": {"tfs_z": 0.9}}, "options.tfs_z"),
    ("/api/generate", {"prompt": "x", "options": {"penalize_newline": False}}, "options.penalize_newline"),
    ("/api/chat", {"messages": HELLO, "options": {"num_ctx": 0}}, "options.num_ctx"),
    ("/api/chat", {"messages": HELLO, "options": {"num_ctx": 8}}, "options.num_ctx: the prompt's"),
    ("/api/embed", {"input": "word " * 40, "truncate": False, "options": {"num_ctx": 16}}, "input[0]"),
    ("/api/chat", {"messages": [
        {"role": "user", "content": "x"},
        {"role": "assistant", "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": {}}}]},
        {"role": "tool", "content": "1", "tool_call_id": "b"}]}, "messages[2].tool_call_id"),
    ("/api/chat", {"messages": [
        {"role": "user", "content": "x"},
        {"role": "assistant", "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": {}}}]},
        {"role": "tool", "content": "1", "tool_call_id": "a", "tool_name": "g"}]}, "messages[2].tool_name"),
    ("/api/generate", {"prompt": "x", "template": "{{ .Prompt }}"}, "template"),
    ("/api/generate", {"prompt": "x", "suffix": "y"}, "suffix"),
    ("/api/embed", {}, "input"),
    ("/api/embed", {"input": "x", "dimensions": 8}, "dimensions"),
    ("/api/embed", {"input": "word " * 3000, "truncate": False}, "input[0]"),
    ("/api/chat", {"messages": HELLO, "format": {"type": "nope"}}, "format"),
    ("/api/chat", {"messages": HELLO, "options": {"top_k": -3}}, "options.top_k"),
    ("/api/generate", {"prompt": "x", "context": [999_999_999]}, "context"),
    # Sampling settings belong in options: at the top level Ollama drops them
    # unread, which would sample a reply the client asked to be greedy.
    ("/api/generate", {"prompt": "x", "temperature": 0}, "temperature: Ollama's routes read it from options"),
    ("/api/chat", {"messages": HELLO, "num_predict": 4}, "num_predict"),
    ("/api/chat", {"messages": HELLO, "seed": 1, "options": {"seed": 1}}, "seed"),
    ("/api/chat", {"messages": HELLO, "max_tokens": 4}, "max_tokens: Ollama's routes read it from options; send "
     "options.num_predict"),
    ("/api/chat", {"messages": HELLO, "top_logprobs": 3}, "top_logprobs: requires logprobs"),
    ("/api/generate", {"prompt": "x", "logprobs": True, "top_logprobs": 99}, "top_logprobs"),
])
def test_bad_requests_are_400s_in_ollamas_envelope(server, route, body, says):
    status, _, raw = http(server.url + route, {"stream": False, **body})
    assert status == 400, raw
    err = json.loads(raw)
    assert list(err) == ["error"] and err["error"].startswith(says), err


def test_the_client_reads_the_errors_and_unserved_routes_say_so(server, client):
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="any", messages=[{"role": "robot", "content": "x"}])
    assert e.value.status_code == 400 and "role" in e.value.error
    status, _, raw = http(server.url + "/api/pull", {"model": "llama3"})
    assert status == 501 and "not managed" in json.loads(raw)["error"]
    status, _, raw = http(server.url + "/", method="GET")
    assert status == 200 and b"running" in raw


# -- thinking -------------------------------------------------------------------

def test_a_thought_comes_back_in_thinking(tmp_path):
    with thinking_model.serving(tmp_path) as s:
        body = {"messages": [{"role": "user", "content": "Why?"}], "grammar": STEERED, "stream": False,
                "options": {**GREEDY, "num_predict": 40}}
        msg = json.loads(http(s.url + "/api/chat", body)[2])["message"]
        assert msg["thinking"].startswith("Let me think") and msg["content"].startswith("The answer")
        streamed = lines(http(s.url + "/api/chat", {**body, "stream": True})[2])
        assert "".join(o["message"].get("thinking", "") for o in streamed) == msg["thinking"]
        assert "".join(o["message"]["content"] for o in streamed) == msg["content"]
        off = json.loads(http(s.url + "/api/chat", {**body, "think": False, "grammar": ANSWER_ONLY})[2])["message"]
        assert "thinking" not in off and off["content"].startswith("The answer")


def test_a_stop_string_inside_a_forced_call_closes_the_call(server):
    body = {"messages": [{"role": "user", "content": "Weather in Lyon?"}], "tools": [WEATHER],
            "tool_choice": "required", "options": {**GREEDY, "num_predict": 80, "stop": ["unit"]}}
    for stream in (False, True):
        status, _, raw = http(server.url + "/api/chat", {**body, "stream": stream})
        assert status == 200, raw
        last = json.loads(raw) if not stream else lines(raw)[-1]
        assert last["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
        assert last["done_reason"] == "stop"
