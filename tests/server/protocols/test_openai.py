"""OpenAI's API (`ember.server.protocols.openai`) on a real `ember serve`
process: chat and text completions and the model list through OpenAI's
clients and raw HTTP, the fields it refuses, and the flags it answers by."""

from __future__ import annotations

import asyncio
import json

import pytest

from api_helpers import ALIAS, CHAT
from server_process import ServerProcess, error_of, http, sse

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def client(plain_server):
    return openai.OpenAI(base_url=plain_server.url + "/v1", api_key="unused", max_retries=0)


# -- OpenAI clients ------------------------------------------------------------

def test_chat_sync(client):
    r = client.chat.completions.create(model="any", messages=CHAT, max_tokens=8, temperature=0)
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 8 and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    timings = r.model_extra["timings"]
    assert r.usage.prompt_tokens_details.cached_tokens == timings["cache_n"] < r.usage.prompt_tokens
    assert timings["prompt_n"] + timings["cache_n"] == r.usage.prompt_tokens


def test_chat_stream_with_usage(client):
    chunks = list(client.chat.completions.create(model="any", messages=CHAT, max_tokens=6, temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    whole = client.chat.completions.create(model="any", messages=CHAT, max_tokens=6, temperature=0)
    assert text == whole.choices[0].message.content


def test_chat_async_stream(server):
    async def go():
        c = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        stream = await c.chat.completions.create(model="any", messages=CHAT, max_tokens=5, temperature=0, stream=True)
        parts = [ch.choices[0].delta.content or "" async for ch in stream if ch.choices]
        r = await c.chat.completions.create(model="any", messages=CHAT, max_tokens=5, temperature=0)
        await c.close()
        return "".join(parts), r.choices[0].message.content

    streamed, whole = asyncio.run(go())
    assert streamed == whole and whole


def test_chat_logprobs(client):
    r = client.chat.completions.create(model="any", messages=CHAT, max_tokens=4, temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == 4
    for e in content:
        assert e.logprob <= 0 and len(e.top_logprobs) == 3
        assert bytes(e.bytes).decode("utf-8", "replace") == e.token
        # greedy: the drawn token is the most likely one
        assert e.top_logprobs[0].token == e.token


def test_chat_stop_sequence(client):
    free = client.chat.completions.create(model="any", messages=CHAT, max_tokens=12, temperature=0).choices[0].message.content
    word = free.split()[1]
    r = client.chat.completions.create(model="any", messages=CHAT, max_tokens=12, temperature=0, stop=[word])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == free[: free.index(word)]


def test_text_completion_and_stream(client):
    r = client.completions.create(model="any", prompt="Once upon a time", max_tokens=6, temperature=0, logprobs=2, echo=True)
    ch = r.choices[0]
    assert ch.text.startswith("Once upon a time") and len(ch.logprobs.tokens) == 6
    assert all(len(t) == 2 for t in ch.logprobs.top_logprobs)
    parts = list(client.completions.create(model="any", prompt="Once upon a time", max_tokens=6, temperature=0, stream=True))
    assert "Once upon a time" + "".join(p.choices[0].text for p in parts) == ch.text


def test_models(client):
    models = client.models.list().data
    assert len(models) == 1 and models[0].owned_by == "ember" and models[0].id
    # One by its name; another name is a 404 in OpenAI's shape.
    assert client.models.retrieve(models[0].id).id == models[0].id
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("gpt-4o")
    assert "'gpt-4o' is not served here" in e.value.body["message"]


def test_bad_field_is_typed_error(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="any", messages=CHAT, max_tokens=4, temperature=-1)
    assert "temperature" in str(e.value)
    assert e.value.body["param"] == "temperature"


# -- greedy through the server equals the in-process model ----------------------

def test_greedy_matches_model(server, smollm2):
    prompt = "The quick brown fox"
    status, _, body = http(server.url + "/completion", {"prompt": prompt, "n_predict": 16, "temperature": 0, "return_tokens": True})
    assert status == 200
    got = json.loads(body)
    want = smollm2.complete(prompt, 16, temperature=0, parse_special=True)
    assert got["tokens"] == want.tokens
    assert got["content"] == want.text
    r = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0).chat.completions.create(
        model="any", messages=CHAT, max_tokens=10, temperature=0)
    assert r.choices[0].message.content == smollm2.chat(CHAT, 10, temperature=0)["content"]


# -- errors over raw HTTP ------------------------------------------------------------

def test_wrong_type_names_field(server):
    e = error_of(http(server.url + "/v1/chat/completions", {"messages": CHAT, "max_tokens": "ten"}), 400)
    assert e["type"] == "invalid_request_error" and e["param"] == "max_tokens" and "max_tokens" in e["message"]
    e = error_of(http(server.url + "/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}), 400)
    assert e["param"] == "messages[0].role"


def test_non_finite_number(server):
    e = error_of(http(server.url + "/v1/chat/completions", raw=b'{"messages": [{"role": "user", "content": "x"}], "top_p": 1e999}'), 400)
    assert e["param"] == "top_p"
    e = error_of(http(server.url + "/v1/chat/completions", {"messages": CHAT, "top_p": 1.5}), 400)
    assert e["param"] == "top_p"


def test_n_beyond_the_slots_or_out_of_range_is_refused(server):
    e = error_of(http(server.url + "/v1/chat/completions", {"messages": CHAT, "n": 5}), 400)
    assert e["param"] == "n" and "this server has 4 (-np)" in e["message"]
    for n in (0, -1, 1000):
        e = error_of(http(server.url + "/v1/completions", {"prompt": "x", "n": n}), 400)
        assert e["param"] == "n", e


def test_prompt_too_long(server):
    e = error_of(http(server.url + "/v1/completions", {"prompt": "hello " * 3000, "max_tokens": 1}), 400)
    assert e["type"] == "exceed_context_size_error" and e["n_ctx"] == 2048 and e["n_prompt_tokens"] > 2048
    e = error_of(http(server.url + "/completion", {"prompt": list(range(100, 2200)), "n_predict": 1}), 400)
    assert e["type"] == "exceed_context_size_error"


# -- request shapes, on the flags server ------------------------------------------

@pytest.mark.with_flags
def test_image_content_part_is_400_naming_the_field(server):
    msgs = [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                         {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]
    e = error_of(http(server.url + "/v1/chat/completions", {"messages": msgs, "max_tokens": 2}), 400)
    assert e["param"] == "messages[0].content[1].type" and "image_url" in e["message"]


@pytest.mark.with_flags
def test_five_stop_strings_work(server):
    stops = ["zzqx1", "zzqx2", "zzqx3", "zzqx4", "."]
    status, _, out = http(server.url + "/v1/chat/completions",
                          {"messages": CHAT, "max_tokens": 40, "temperature": 0, "stop": stops})
    assert status == 200, out
    r = json.loads(out)
    assert "." not in r["choices"][0]["message"]["content"]


@pytest.mark.with_flags
def test_negative_max_tokens_is_400(server):
    e = error_of(http(server.url + "/v1/chat/completions", {"messages": CHAT, "max_tokens": -2}), 400)
    assert e["param"] == "max_tokens" and "max_tokens" in e["message"]
    e = error_of(http(server.url + "/v1/completions", {"prompt": "Hi", "max_tokens": -2}), 400)
    assert e["param"] == "max_tokens"
    # -1 stays llama-server's "until the context is full", which is allowed.
    status, _, _ = http(server.url + "/v1/chat/completions", {"messages": CHAT, "max_tokens": -1, "stop": ["\n", " "]})
    assert status == 200


@pytest.mark.with_flags
@pytest.mark.parametrize("field,value", [
    ("mirostat", 2),
    ("dry_multiplier", 0.8),
    ("xtc_probability", 0.5),
    ("adaptive_target", 0.5),
    ("min_keep", 2),
    ("grammar_lazy", True),
])
def test_a_field_ember_cannot_honour_is_refused_by_name(server, field, value):
    """Never fail open: a request asking for something ember does not do yet is a
    400 naming the field, not an answer that silently ignores it."""
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, field: value}
    e = error_of(http(server.url + "/v1/chat/completions", body), 400)
    assert e["param"] == field and field in e["message"]
    e = error_of(http(server.url + "/completion", {"prompt": "Hi", "n_predict": 2, field: value}), 400)
    assert e["param"] == field


@pytest.mark.with_flags
def test_those_fields_at_their_off_values_are_accepted(server):
    off = {"adaptive_target": -1, "min_keep": 0, "grammar_lazy": False, "t_max_predict_ms": 0, "n_indent": 0,
           "mirostat": 0, "samplers": None}
    status, _, raw = http(server.url + "/completion", {"prompt": "Hi", "n_predict": 2, **off, "t_max_predict_ms": -1})
    assert status == 200, raw
    status, _, raw = http(server.url + "/v1/chat/completions", {"messages": CHAT, "max_tokens": 2, **off})
    assert status == 200, raw


@pytest.mark.parametrize("field,value", [
    ("functions", [{"name": "f", "parameters": {"type": "object"}}]),
    ("function_call", {"name": "f"}),
    ("modalities", ["text", "audio"]),
    ("audio", {"voice": "alloy", "format": "wav"}),
    ("web_search_options", {}),
    ("verbosity", "high"),
])
def test_openai_s_fields_for_what_this_server_does_not_do_are_refused(server, field, value):
    e = error_of(http(server.url + "/v1/chat/completions", {"messages": CHAT, "max_tokens": 2, field: value}), 400)
    assert e["param"] == field and e["message"].startswith(field)


def test_their_plain_values_and_llama_server_s_slot_fields_are_read_on_chat(server):
    ask = {"messages": CHAT, "max_tokens": 2, "temperature": 0, "modalities": ["text"], "verbosity": "medium"}
    assert http(server.url + "/v1/chat/completions", ask)[0] == 200
    # The prompt was just read into a slot; without the cache it is read again whole.
    r = json.loads(http(server.url + "/v1/chat/completions", {**ask, "cache_prompt": False})[2])
    assert r["timings"]["cache_n"] == 0 and r["timings"]["prompt_n"] == r["usage"]["prompt_tokens"]
    r = json.loads(http(server.url + "/v1/chat/completions", ask)[2])
    assert r["timings"]["cache_n"] > 0
    e = error_of(http(server.url + "/v1/chat/completions", {**ask, "id_slot": 99}), 400)
    assert e["param"] == "id_slot"
    assert http(server.url + "/v1/chat/completions", {**ask, "id_slot": 0})[0] == 200


# -- -a/--alias -------------------------------------------------------------------------

@pytest.mark.with_flags
def test_alias_is_the_model_id(server):
    models = json.loads(http(server.url + "/v1/models")[2])
    assert [m["id"] for m in models["data"]] == [ALIAS]
    status, _, out = http(server.url + "/v1/chat/completions", {"messages": CHAT, "max_tokens": 2})
    assert status == 200 and json.loads(out)["model"] == ALIAS
    status, _, out = http(server.url + "/v1/chat/completions", {"messages": CHAT, "max_tokens": 2, "stream": True})
    chunks = [c for c in sse(out) if c != "[DONE]"]
    assert chunks and all(c["model"] == ALIAS for c in chunks)
    assert any(f"model name: {ALIAS}" in l for l in server.lines)


def test_without_alias_the_id_is_general_name(smollm2_path):
    from ember import _native

    name = _native.inspect(str(smollm2_path), 0)["metadata"]["general.name"]
    with ServerProcess(smollm2_path, ctx=256) as s:
        models = json.loads(http(s.url + "/v1/models")[2])
        assert [m["id"] for m in models["data"]] == [name]
        status, _, out = http(s.url + "/v1/chat/completions", {"messages": CHAT, "max_tokens": 1})
        assert status == 200 and json.loads(out)["model"] == name


# -- -n/--n-predict ---------------------------------------------------------------------

@pytest.mark.with_flags
def test_n_predict_is_the_default_max_tokens(server):
    status, _, out = http(server.url + "/v1/chat/completions", {"messages": CHAT, "ignore_eos": True, "temperature": 0})
    assert status == 200, out
    r = json.loads(out)
    assert r["usage"]["completion_tokens"] == 5 and r["choices"][0]["finish_reason"] == "length"
    # A request that asks for more still gets more.
    status, _, out = http(server.url + "/v1/chat/completions",
                          {"messages": CHAT, "ignore_eos": True, "temperature": 0, "max_tokens": 8})
    assert json.loads(out)["usage"]["completion_tokens"] == 8


# -- the reply's length, by any of its names ------------------------------------------------

@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize("names, want", [
    ({"max_tokens": 3}, 3),
    ({"max_completion_tokens": 4}, 4),
    ({"n_predict": 2}, 2),
    # llama-server's order: n_predict, then max_completion_tokens, then max_tokens
    ({"n_predict": 2, "max_completion_tokens": 4, "max_tokens": 3}, 2),
    ({"max_completion_tokens": 4, "max_tokens": 3}, 4),
])
def test_every_name_of_the_reply_length_bounds_it(plain_server, route, names, want):
    body = {"messages": CHAT} if route == "/v1/chat/completions" else {"prompt": "Once upon a time"}
    status, _, out = http(plain_server.url + route, {**body, **names, "ignore_eos": True, "temperature": 0})
    assert status == 200, out
    r = json.loads(out)
    assert r["usage"]["completion_tokens"] == want and r["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize("field, value, instead", [
    ("n_probs", 3, "logprobs"),
    ("post_sampling_probs", True, "logprobs"),
    ("n_cmpl", 2, "n"),
])
def test_completions_own_fields_are_refused_with_openais_name(plain_server, route, field, value, instead):
    body = {"messages": CHAT} if route == "/v1/chat/completions" else {"prompt": "Hi"}
    e = error_of(http(plain_server.url + route, {**body, "max_tokens": 1, field: value}), 400)
    assert e["param"] == field and f"send {instead}" in e["message"], e
    # Their off values ask for nothing.
    off = {"n_probs": 0, "post_sampling_probs": False, "n_cmpl": None}[field]
    status, _, out = http(plain_server.url + route, {**body, "max_tokens": 1, field: off})
    assert status == 200, out


# -- the prompt cache across stateless requests -------------------------------------------

@pytest.mark.with_flags
def test_a_growing_conversation_reads_only_its_new_part(server):
    story = "Tell me about lighthouses, their keepers, storms and ships. " * 8
    msgs = [{"role": "user", "content": story}]
    status, _, body = http(server.url + "/v1/chat/completions", {"messages": msgs, "max_tokens": 4, "temperature": 0})
    assert status == 200, body
    first = json.loads(body)
    msgs += [first["choices"][0]["message"], {"role": "user", "content": "And the storms?"}]
    status, _, body = http(server.url + "/v1/chat/completions", {"messages": msgs, "max_tokens": 4, "temperature": 0})
    assert status == 200, body
    second = json.loads(body)
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    # The whole first prompt is held (the template only appends after it).
    assert cached >= first["usage"]["prompt_tokens"] - 1, (first["usage"], second["usage"])
    assert second["timings"]["cache_n"] == cached
    assert second["timings"]["prompt_n"] == second["usage"]["prompt_tokens"] - cached


# -- llama-server's fields on chat completions --------------------------------------

BOOK = [{"role": "system", "content": "Book"}, {"role": "user", "content": "What is the best book"}]


def _prompt_of(plain_server, body: dict) -> str:
    status, _, raw = http(plain_server.url + "/v1/chat/completions", {**body, "max_tokens": 1, "verbose": True})
    assert status == 200, raw
    return json.loads(raw)["__verbose"]["prompt"]


def test_continue_final_message_and_add_generation_prompt(plain_server):
    prefilled = [*BOOK, {"role": "assistant", "content": "Whill"}]
    continued = _prompt_of(plain_server, {"messages": prefilled, "add_generation_prompt": False,
                                          "continue_final_message": True})
    assert continued.endswith("<|im_start|>assistant\nWhill") and continued == _prompt_of(plain_server,
                                                                                          {"messages": prefilled})
    assert _prompt_of(plain_server, {"messages": BOOK}).endswith("<|im_start|>assistant\n")
    left_open = _prompt_of(plain_server, {"messages": BOOK, "add_generation_prompt": False})
    assert left_open.endswith("What is the best book<|im_end|>\n"), left_open
    both = {"messages": prefilled, "add_generation_prompt": True, "continue_final_message": True}
    e = error_of(http(plain_server.url + "/v1/chat/completions", both), 400)
    assert e["param"] == "continue_final_message" and "add_generation_prompt" in e["message"]
    e = error_of(http(plain_server.url + "/v1/chat/completions", {"messages": BOOK, "continue_final_message": True}),
                 400)
    assert "the last message must be the assistant's" in e["message"]
    twice = [*prefilled, {"role": "assistant", "content": "and again"}]
    e = error_of(http(plain_server.url + "/v1/chat/completions", {"messages": twice}), 400)
    assert e["param"] == "messages[3]" and "two assistant messages" in e["message"]


def test_input_tokens_count_what_the_reply_would_read(plain_server):
    status, _, raw = http(plain_server.url + "/v1/chat/completions/input_tokens", {"messages": BOOK})
    counted = json.loads(raw)
    assert status == 200 and counted["object"] == "response.input_tokens"
    usage = json.loads(http(plain_server.url + "/v1/chat/completions", {"messages": BOOK, "max_tokens": 1})[2])["usage"]
    assert counted["input_tokens"] == usage["prompt_tokens"]
    body = {"input": "What is the best book", "instructions": "Book"}
    counted = json.loads(http(plain_server.url + "/v1/responses/input_tokens", body)[2])
    usage = json.loads(http(plain_server.url + "/v1/responses", {**body, "max_output_tokens": 1, "store": False})[2])
    assert counted["input_tokens"] == usage["usage"]["input_tokens"]
    assert error_of(http(plain_server.url + "/v1/chat/completions/input_tokens", {"messages": []}), 400)
