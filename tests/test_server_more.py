"""More of `ember serve` against real processes: /metrics counters, the model
alias, a chat template file, -n/--n-predict, -np queueing, request-shape
errors; and, in-process, the answers while the model is still loading."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time

import pytest

from server_process import ServerProcess, error_of, http, sse

CHAT = [{"role": "user", "content": "What is the capital of France?"}]
TEMPLATE = "{% for m in messages %}<<{{ m.role }}>>{{ m.content }}{% endfor %}"
ALIAS = "my-alias"








def metrics(url: str) -> dict[str, float]:
    status, headers, body = http(url + "/metrics")
    assert status == 200, body
    out = {}
    for line in body.decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


@pytest.fixture(scope="module")
def template_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("tpl") / "chat.jinja"
    p.write_text(TEMPLATE, encoding="utf-8")
    return p


@pytest.fixture(scope="module")
def server(smollm2_path, template_file):
    """One process for the flags that do not get in each other's way."""
    with ServerProcess(smollm2_path, "--metrics", "-a", ALIAS, "--chat-template-file", str(template_file),
                       "-n", "5", "-np", "2") as s:
        yield s


# -- 1. --metrics ----------------------------------------------------------------------

def test_metrics_text_and_counters(server):
    status, headers, body = http(server.url + "/metrics")
    assert status == 200
    ctype = headers["Content-Type"]
    assert ctype.startswith("text/plain") and "version=0.0.4" in ctype
    text = body.decode()
    for name in ("llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total",
                 "llamacpp:requests_processing", "llamacpp:requests_deferred",
                 "llamacpp:kv_cache_tokens", "llamacpp:kv_cache_usage_ratio"):
        assert re.search(rf"^{re.escape(name)} [0-9.e+-]+$", text, re.M), name
        assert f"# TYPE {name} " in text
    before = metrics(server.url)
    assert before["llamacpp:requests_processing"] == 0 and before["llamacpp:requests_deferred"] == 0
    status, _, out = http(server.url + "/v1/chat/completions",
                          {"messages": CHAT, "max_tokens": 7, "temperature": 0, "ignore_eos": True})
    assert status == 200, out
    usage = json.loads(out)["usage"]
    after = metrics(server.url)
    assert after["llamacpp:prompt_tokens_total"] - before["llamacpp:prompt_tokens_total"] == usage["prompt_tokens"]
    assert after["llamacpp:tokens_predicted_total"] - before["llamacpp:tokens_predicted_total"] == usage["completion_tokens"] == 7
    assert after["llamacpp:requests_processing"] == 0 and after["llamacpp:requests_deferred"] == 0
    assert after["llamacpp:kv_cache_tokens"] == 0  # the finished request's cache is freed


# -- 2. while the model loads (in-process) ----------------------------------------------

def test_answers_while_loading_then_ready(smollm2_path, monkeypatch):
    from aiohttp.test_utils import TestClient, TestServer

    import ember.model
    from ember.server.app import create_app
    from ember.server.options import ServerOptions

    release = threading.Event()
    real = ember.model.Model

    class BlockingModel(real):
        def __init__(self, *a, **kw):
            assert release.wait(60), "the test never released the load"
            super().__init__(*a, **kw)

    monkeypatch.setattr(ember.model, "Model", BlockingModel)

    async def go():
        app = create_app(ServerOptions(model=str(smollm2_path), port=0, ctx_size=256), log=lambda line: None)
        async with TestClient(TestServer(app)) as c:
            try:
                await asyncio.sleep(0.2)  # the load thread is now blocked in the constructor
                loading = []
                for path in ("/v1/models", "/health", "/v1/health"):
                    r = await c.get(path)
                    loading.append((path, r.status, await r.json()))
                r = await c.post("/v1/chat/completions", json={"messages": CHAT})
                loading.append(("/v1/chat/completions", r.status, await r.json()))
            finally:
                release.set()
            await asyncio.wait_for(app["ready"].wait(), 60)
            ready = []
            for path in ("/v1/models", "/health"):
                r = await c.get(path)
                ready.append((path, r.status, await r.json()))
            return loading, ready

    loading, ready = asyncio.run(go())
    expected = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
    for path, status, body in loading:
        assert status == 503, (path, body)
        assert body["error"]["type"] == "unavailable_error"
        assert "loading" in body["error"]["message"].lower(), (path, body)
    assert loading[1][2] == expected and loading[2][2] == expected
    (_, ms, mb), (_, hs, hb) = ready
    assert ms == 200 and mb["data"][0]["id"] == "Smollm2 135M 8k Lc100K Mix1 Ep2"
    assert hs == 200 and hb == {"status": "ok"}


# -- 3. -a/--alias -------------------------------------------------------------------------

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


# -- 4. --chat-template-file ----------------------------------------------------------------

def test_chat_template_file_is_rendered(server):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    status, _, body = http(server.url + "/apply-template", {"messages": msgs})
    assert status == 200, body
    assert json.loads(body)["prompt"] == "<<system>>Be brief.<<user>>Hi"
    props = json.loads(http(server.url + "/props")[2])
    assert props["chat_template"] == TEMPLATE


# -- 5. -n/--n-predict ---------------------------------------------------------------------

def test_n_predict_is_the_default_max_tokens(server):
    status, _, out = http(server.url + "/v1/chat/completions", {"messages": CHAT, "ignore_eos": True, "temperature": 0})
    assert status == 200, out
    r = json.loads(out)
    assert r["usage"]["completion_tokens"] == 5 and r["choices"][0]["finish_reason"] == "length"
    # A request that asks for more still gets more.
    status, _, out = http(server.url + "/v1/chat/completions",
                          {"messages": CHAT, "ignore_eos": True, "temperature": 0, "max_tokens": 8})
    assert json.loads(out)["usage"]["completion_tokens"] == 8


# -- 6. -np 2 ------------------------------------------------------------------------------

def _stream_text(url: str, prompt: str, n: int) -> str:
    status, _, out = http(url + "/v1/chat/completions", {
        "messages": [{"role": "user", "content": prompt}], "max_tokens": n, "temperature": 0,
        "ignore_eos": True, "stream": True})
    assert status == 200, out
    chunks = sse(out)
    assert chunks[-1] == "[DONE]"
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks[:-1] if c["choices"])


def test_two_slots_answer_together_as_each_would_alone(server):
    assert any(l.startswith("ember: slots: 2, each of ") for l in server.lines), server.lines
    prompts = ["Tell me a long story about a dragon.", "List the planets of the solar system.",
               "Describe a day at the seaside."]
    n = 120
    got: dict[int, str] = {}
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            got[i] = _stream_text(server.url, prompts[i], n)
        except BaseException as e:  # noqa: BLE001 - reported by the test thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    threads[0].start()
    threads[1].start()
    deadline = time.monotonic() + 30
    both_seen = deferred_seen = False
    while not both_seen and time.monotonic() < deadline:
        both_seen = metrics(server.url)["llamacpp:requests_processing"] == 2
        time.sleep(0.005)
    # A third waits for a slot while the two are answered.
    threads[2].start()
    while threads[2].is_alive() and not deferred_seen and time.monotonic() < deadline + 30:
        m = metrics(server.url)
        # Seen once the two have read into their caches (right after they
        # are placed, before the first pass, the caches may still be empty).
        if m["llamacpp:requests_deferred"] == 1 and m["llamacpp:kv_cache_tokens"] > 0:
            deferred_seen = True
            assert m["llamacpp:requests_processing"] == 2
            assert 0 < m["llamacpp:kv_cache_usage_ratio"] <= 1
        time.sleep(0.005)
    for t in threads:
        t.join(120)
    assert not errors, errors
    # 120 tokens take far longer than a few /metrics polls: both states are seen.
    assert both_seen and deferred_seen
    alone = [_stream_text(server.url, p, n) for p in prompts]
    assert [got[i] for i in range(3)] == alone


def test_a_burst_is_answered_or_refused_never_lost(smollm2_path):
    """Eight times the slots plus queue, at once: each request gets a 200 or a
    503 with Retry-After, none hangs, none errors."""
    with ServerProcess(smollm2_path, "-np", "2", "--queue-depth", "2", "-n", "4") as s:
        results: list[tuple[int, dict]] = []
        lock = threading.Lock()

        def one(i: int) -> None:
            status, headers, body = http(s.url + "/v1/completions", {"prompt": f"Count to {i}:", "max_tokens": 4})
            with lock:
                results.append((status, headers))

        threads = [threading.Thread(target=one, args=(i,)) for i in range(32)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert len(results) == 32
        codes = sorted(st for st, _ in results)
        assert set(codes) <= {200, 503}, codes
        assert codes.count(200) >= 4, codes
        assert all("Retry-After" in h for st, h in results if st == 503)


# -- 7. request shapes ---------------------------------------------------------------------

def test_array_body_is_400(server):
    for path in ("/v1/chat/completions", "/v1/completions", "/completion", "/tokenize"):
        e = error_of(http(server.url + path, [CHAT[0]]), 400)
        assert e["type"] == "invalid_request_error" and "object" in e["message"], (path, e)


def test_image_content_part_is_400_naming_the_field(server):
    msgs = [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                         {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]
    e = error_of(http(server.url + "/v1/chat/completions", {"messages": msgs, "max_tokens": 2}), 400)
    assert e["param"] == "messages[0].content[1].type" and "image_url" in e["message"]


def test_five_stop_strings_work(server):
    stops = ["zzqx1", "zzqx2", "zzqx3", "zzqx4", "."]
    status, _, out = http(server.url + "/v1/chat/completions",
                          {"messages": CHAT, "max_tokens": 40, "temperature": 0, "stop": stops})
    assert status == 200, out
    r = json.loads(out)
    assert "." not in r["choices"][0]["message"]["content"]


def test_negative_max_tokens_is_400(server):
    e = error_of(http(server.url + "/v1/chat/completions", {"messages": CHAT, "max_tokens": -2}), 400)
    assert e["param"] == "max_tokens" and "max_tokens" in e["message"]
    e = error_of(http(server.url + "/v1/completions", {"prompt": "Hi", "max_tokens": -2}), 400)
    assert e["param"] == "max_tokens"
    # -1 stays llama-server's "until the context is full", which is allowed.
    status, _, _ = http(server.url + "/v1/chat/completions", {"messages": CHAT, "max_tokens": -1, "stop": ["\n", " "]})
    assert status == 200


@pytest.mark.parametrize("field,value", [
    ("mirostat", 2),
    ("dry_multiplier", 0.8),
    ("xtc_probability", 0.5),
])
def test_a_field_ember_cannot_honour_is_refused_by_name(server, field, value):
    """Never fail open: a request asking for something ember does not do yet is a
    400 naming the field, not an answer that silently ignores it."""
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, field: value}
    e = error_of(http(server.url + "/v1/chat/completions", body), 400)
    assert e["param"] == field and field in e["message"]
    e = error_of(http(server.url + "/completion", {"prompt": "Hi", "n_predict": 2, field: value}), 400)
    assert e["param"] == field


def test_repeat_last_n_minus_one_is_the_whole_history(server):
    status, _, body = http(server.url + "/completion", {"prompt": "Hi", "n_predict": 3, "repeat_last_n": -1,
                                                        "repeat_penalty": 1.3, "temperature": 0})
    assert status == 200, body


# -- the prompt cache across stateless requests -------------------------------------------

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


def test_cache_prompt_false_reads_the_whole_prompt(server):
    prompt = "The keeper of the lighthouse wrote in his log every night. " * 4
    for cache_prompt, expect_cached in ((True, None), (True, True), (False, False)):
        status, _, body = http(server.url + "/completion", {"prompt": prompt, "n_predict": 2, "temperature": 0,
                                                             "cache_prompt": cache_prompt})
        assert status == 200, body
        reply = json.loads(body)
        t = reply["timings"]
        if expect_cached is not None:
            assert (t["cache_n"] > 0) == expect_cached, t
        assert t["prompt_n"] + t["cache_n"] == reply["tokens_evaluated"]
