"""The HTTP API of a real `ember serve` process: OpenAI's clients against it,
llama-server's routes, the error envelope, and that a client leaving
mid-stream frees the engine."""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from server_process import ServerProcess, error_of, http, sse

openai = pytest.importorskip("openai")

CHAT = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def server(smollm2_path):
    with ServerProcess(smollm2_path) as s:
        yield s








@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


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


# -- llama-server routes ----------------------------------------------------------

def test_completion_non_stream(server):
    status, _, body = http(server.url + "/completion", {"prompt": "Hello", "n_predict": 5, "temperature": 0, "n_probs": 2})
    r = json.loads(body)
    assert status == 200 and r["stop"] is True and r["stop_type"] == "limit" and r["tokens_predicted"] == 5
    assert r["timings"]["predicted_n"] == 5 and r["tokens_evaluated"] == r["timings"]["prompt_n"]
    assert len(r["completion_probabilities"]) == 5
    assert len(r["completion_probabilities"][0]["top_logprobs"]) == 2


def test_completion_stream(server):
    status, headers, body = http(server.url + "/completion", {"prompt": "Hello", "n_predict": 5, "temperature": 0, "stream": True})
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    events = sse(body)
    assert all(e["stop"] is False for e in events[:-1]) and events[-1]["stop"] is True
    assert "[DONE]" not in events
    whole = json.loads(http(server.url + "/completion", {"prompt": "Hello", "n_predict": 5, "temperature": 0})[2])
    assert "".join(e["content"] for e in events) == whole["content"]


def test_completion_stop_word(server):
    whole = json.loads(http(server.url + "/completion", {"prompt": "Once upon a time", "n_predict": 10, "temperature": 0})[2])
    word = whole["content"].split()[2]
    r = json.loads(http(server.url + "/completion", {"prompt": "Once upon a time", "n_predict": 10, "temperature": 0, "stop": [word]})[2])
    assert r["stop_type"] == "word" and r["stopping_word"] == word and word not in r["content"]


def test_tokenize_round_trip(server, smollm2):
    text = "Hello world, héllo <|im_start|>"
    tokens = json.loads(http(server.url + "/tokenize", {"content": text})[2])["tokens"]
    assert tokens == smollm2.tokenize(text, add_special=False, parse_special=True)
    assert json.loads(http(server.url + "/detokenize", {"tokens": tokens})[2])["content"] == smollm2.detokenize(tokens)
    pieces = json.loads(http(server.url + "/tokenize", {"content": "héllo", "with_pieces": True})[2])["tokens"]
    assert [p["id"] for p in pieces] == smollm2.tokenize("héllo", add_special=False, parse_special=True)
    assert "".join(p["piece"] for p in pieces if isinstance(p["piece"], str)) in ("héllo", "hllo", "h")


def test_apply_template(server, smollm2):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    status, _, body = http(server.url + "/apply-template", {"messages": msgs})
    assert status == 200 and json.loads(body)["prompt"] == smollm2.render_chat(msgs)


def test_props_health_metrics(server):
    props = json.loads(http(server.url + "/props")[2])
    assert props["default_generation_settings"]["n_ctx"] == 2048 and props["total_slots"] == 1
    assert props["model_path"].endswith(".gguf") and props["chat_template"]
    status, _, body = http(server.url + "/health")
    assert status == 200 and json.loads(body) == {"status": "ok"}
    assert error_of(http(server.url + "/metrics"), 501)["type"] == "not_supported_error"


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


def test_n_other_than_one(server):
    e = error_of(http(server.url + "/v1/chat/completions", {"messages": CHAT, "n": 2}), 400)
    assert e["param"] == "n" and "one choice" in e["message"]


def test_prompt_too_long(server):
    e = error_of(http(server.url + "/v1/completions", {"prompt": "hello " * 3000, "max_tokens": 1}), 400)
    assert e["type"] == "exceed_context_size_error" and e["n_ctx"] == 2048 and e["n_prompt_tokens"] > 2048
    e = error_of(http(server.url + "/completion", {"prompt": list(range(100, 2200)), "n_predict": 1}), 400)
    assert e["type"] == "exceed_context_size_error"


def test_unknown_route_and_malformed_json(server):
    e = error_of(http(server.url + "/v2/nothing", {}), 404)
    assert e["type"] == "not_found_error" and "POST /v2/nothing" in e["message"]
    e = error_of(http(server.url + "/v1/chat/completions", raw=b'{"messages": ['), 400)
    assert "JSON" in e["message"]


def test_body_too_large_refused_before_read(server):
    # Announces 50 MB but sends a few bytes: the answer must come without the rest.
    u = urllib.parse.urlsplit(server.url)
    with socket.create_connection((u.hostname, u.port), timeout=10) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 50000000\r\n\r\n{\"prompt\": \"")
        reply = s.recv(4096).decode()
    assert reply.startswith("HTTP/1.1 413"), reply
    assert '"code":413' in reply


def test_gzip_body(server):
    body = gzip.compress(json.dumps({"content": "Hello world"}).encode())
    status, _, out = http(server.url + "/tokenize", raw=body, headers={"Content-Encoding": "gzip"})
    assert status == 200 and len(json.loads(out)["tokens"]) == 2


def test_log_line_per_request(server):
    http(server.url + "/completion", {"prompt": "Hi", "n_predict": 2})
    time.sleep(0.2)
    lines = [l for l in server.lines if l.startswith("POST /completion 200")]
    assert lines and "prompt " in lines[-1] and "2 drawn" in lines[-1] and "max tokens" in lines[-1]


# -- cancellation -----------------------------------------------------------------------

def _open_stream(server, prompt: str, n: int, stream: bool = True) -> socket.socket:
    u = urllib.parse.urlsplit(server.url)
    body = json.dumps({"prompt": prompt, "n_predict": n, "ignore_eos": True, "stream": stream}).encode()
    s = socket.create_connection((u.hostname, u.port), timeout=30)
    s.sendall(b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    return s


def test_client_gone_frees_engine(server):
    s = _open_stream(server, "Once upon a time", 1500)
    got = b""
    while got.count(b"data: ") < 3:
        got += s.recv(4096)
    s.close()
    t0 = time.monotonic()
    status, _, out = http(server.url + "/completion", {"prompt": "Hi", "n_predict": 4, "temperature": 0})
    took = time.monotonic() - t0
    assert status == 200 and json.loads(out)["tokens_predicted"] == 4
    # 1500 tokens would take tens of seconds here; the engine must have dropped them.
    assert took < 5, took
    time.sleep(0.3)
    assert any("client gone" in l for l in server.lines if "/completion" in l)


def test_queued_request_cancelled_never_runs(server):
    running = _open_stream(server, "Once upon a time", 1500)
    running.recv(4096)
    queued = _open_stream(server, "A queued prompt", 1500, stream=False)
    time.sleep(0.5)
    queued.close()  # gone while waiting: it must never reach the model
    time.sleep(0.5)
    running.close()
    t0 = time.monotonic()
    status, _, _ = http(server.url + "/completion", {"prompt": "Hi", "n_predict": 2})
    assert status == 200 and time.monotonic() - t0 < 5
    time.sleep(0.3)
    gone = [l for l in server.lines if l.startswith("POST /completion") and "client gone" in l]
    assert any(" 0 drawn" in l for l in gone), gone


# -- API keys ----------------------------------------------------------------------------

def test_api_key(smollm2_path):
    with ServerProcess(smollm2_path, "--api-key", "sekrit", ctx=256) as s:
        assert http(s.url + "/health")[0] == 200
        e = error_of(http(s.url + "/props"), 401)
        assert e["type"] == "authentication_error"
        assert http(s.url + "/props", headers={"Authorization": "Bearer sekrit"})[0] == 200
        assert http(s.url + "/props", headers={"x-api-key": "sekrit"})[0] == 200
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            c.models.list()


# -- loading ---------------------------------------------------------------------------

def test_load_failure_answers_503(tmp_path):
    from aiohttp.test_utils import TestClient, TestServer

    from ember.server.app import create_app
    from ember.server.options import ServerOptions

    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"not a model")

    async def go():
        app = create_app(ServerOptions(model=str(bogus), port=0), log=lambda line: None)
        async with TestClient(TestServer(app)) as c:
            await asyncio.wait_for(app["load_failed"].wait(), 30)
            health = await c.get("/health")
            models = await c.get("/v1/models")
            return health.status, await health.json(), models.status, await models.json()

    hs, hb, ms, mb = asyncio.run(go())
    assert hs == 503 and hb["error"]["type"] == "unavailable_error" and "failed to load" in hb["error"]["message"]
    assert ms == 503 and "failed to load" in mb["error"]["message"]
