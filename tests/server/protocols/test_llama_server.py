"""llama-server's own API (`ember.server.protocols.llama_server`) on a real
`ember serve` process: /completion, /tokenize, /apply-template, /props,
/metrics, /health, and the slots (-np, /slots, the prompt and host caches)."""

from __future__ import annotations

import json
import re
import threading
import time

import openai
import pytest

from api_helpers import CHAT, TEMPLATE
from server_process import ServerProcess, error_of, http, post_ok, sse


def metrics(url: str) -> dict[str, float]:
    status, headers, body = http(url + "/metrics")
    assert status == 200, body
    out = {}
    for line in body.decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


# -- /completion ------------------------------------------------------------------

def test_completion_non_stream(server):
    status, _, body = http(server.url + "/completion", {"prompt": "Hello", "n_predict": 5, "temperature": 0, "n_probs": 2})
    r = json.loads(body)
    assert status == 200 and r["stop"] is True and r["stop_type"] == "limit" and r["tokens_predicted"] == 5
    assert r["timings"]["predicted_n"] == 5 and r["tokens_evaluated"] == r["timings"]["prompt_n"]
    # The first token comes from the prompt's pass: the rate is over the 4 steps after it, as llama-server's.
    t = r["timings"]
    assert t["predicted_per_second"] == pytest.approx(4e3 / t["predicted_ms"])
    assert t["predicted_per_token_ms"] == pytest.approx(t["predicted_ms"] / 4)
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


def test_completion_reads_llama_server_s_other_names_and_response_fields(server):
    """max_completion_tokens for n_predict and logprobs for n_probs, each read
    where the first name is absent (once dropped: the reply ran to the end of
    the context); response_fields answers only the paths asked for."""
    ask = {"prompt": "Hello", "temperature": 0}
    r = post_ok(server, "/completion", {**ask, "max_completion_tokens": 3, "logprobs": 2})
    assert r["tokens_predicted"] == 3 and len(r["completion_probabilities"]) == 3
    assert len(r["completion_probabilities"][0]["top_logprobs"]) == 2
    assert post_ok(server, "/completion", {**ask, "n_predict": 2, "max_completion_tokens": 4})["tokens_predicted"] == 2
    assert post_ok(server, "/completion", {**ask, "max_completion_tokens": 2, "max_tokens": 4})["tokens_predicted"] == 2
    r = post_ok(server, "/completion", {**ask, "n_predict": 2, "response_fields": ["content", "timings/predicted_n",
                                                                                  "timings/nothing", "nothing"]})
    assert set(r) == {"content", "timings/predicted_n"} and r["timings/predicted_n"] == 2
    e = error_of(http(server.url + "/completion", {**ask, "logprobs": 99}), 400)
    assert e["param"] == "logprobs"


@pytest.mark.with_flags
def test_n_cmpl_answers_a_prompt_several_times_each_with_the_next_seed(server):
    ask = {"prompt": "Once upon a time", "n_predict": 6, "temperature": 1.0}
    both = post_ok(server, "/completion", {**ask, "n_cmpl": 2, "seed": 7})
    assert [r["index"] for r in both] == [0, 1]
    alone = [post_ok(server, "/completion", {**ask, "seed": s})["content"] for s in (7, 8)]
    assert [r["content"] for r in both] == alone
    assert [r["content"] for r in post_ok(server, "/completion", {**ask, "n": 2, "seed": 7})] == alone
    e = error_of(http(server.url + "/completion", {**ask, "n_cmpl": 3}), 400)
    assert e["param"] == "n_cmpl" and "slots (2)" in e["message"]
    e = error_of(http(server.url + "/completion", {**ask, "n_cmpl": 2, "id_slot": 1}), 400)
    assert e["param"] == "id_slot"


def test_completion_stop_word(server):
    whole = json.loads(http(server.url + "/completion", {"prompt": "Once upon a time", "n_predict": 10, "temperature": 0})[2])
    word = whole["content"].split()[2]
    r = json.loads(http(server.url + "/completion", {"prompt": "Once upon a time", "n_predict": 10, "temperature": 0, "stop": [word]})[2])
    assert r["stop_type"] == "word" and r["stopping_word"] == word and word not in r["content"]


def test_a_stop_word_inside_a_run_of_forced_tokens_ends_the_reply(server):
    """A grammar's literal is drawn as one run of forced tokens, one pass; a
    stop word inside it ends the reply there and the rest of the run is
    dropped (once, the server's loop met the run's later tokens for a slot
    it had already freed, and the request hung)."""
    body = {"prompt": "Hi", "grammar": 'root ::= "alpha beta gamma delta"', "n_predict": 16, "temperature": 0}
    r = post_ok(server, "/completion", {**body, "stop": ["gamma"]})
    assert r["content"] == "alpha beta " and r["stop_type"] == "word" and r["stopping_word"] == "gamma"
    # The server goes on serving.
    assert post_ok(server, "/completion", body)["content"] == "alpha beta gamma delta"


@pytest.mark.parametrize("keyed_by", ["text", "ids"])
@pytest.mark.parametrize("openai_style", [False, True])
def test_logit_bias_by_text_bans_each_of_its_tokens(server, keyed_by, openai_style):
    """llama-server's logit_bias takes a text in place of a token id: each of
    its tokens gets the bias. The greedy reply's own words, banned, are gone."""
    ask = {"prompt": "What is the best book", "n_predict": 24, "temperature": 0}
    words = post_ok(server, "/completion", ask)["content"].split()[:4]
    assert words, "the model says something to ban"
    texts = [" " + w for w in words]
    if keyed_by == "ids":
        keys = [t for x in texts for t in post_ok(server, "/tokenize", {"content": x})["tokens"]]
    else:
        keys = texts
    bias = {k: -100 for k in keys} if openai_style else [[k, False] for k in keys]
    banned = post_ok(server, "/completion", {**ask, "logit_bias": bias})["content"]
    assert not any((" " + banned).count(x) for x in texts), (texts, banned)


def test_generation_settings_list_the_biases_and_ignore_eos_s_bans(server, smollm2):
    """As llama-server reports them: {bias, token} objects, -inf as null, and
    ignore_eos shown as the end-of-generation tokens it bans."""
    ask = {"prompt": "Once upon a time", "n_predict": 2, "temperature": 0}
    plain = post_ok(server, "/completion", ask)["generation_settings"]["logit_bias"]
    assert plain == []
    biased = post_ok(server, "/completion", {**ask, "logit_bias": [[5, 1.5], [7, False]]})
    assert biased["generation_settings"]["logit_bias"] == [{"bias": 1.5, "token": 5}, {"bias": None, "token": 7}]
    banned = post_ok(server, "/completion", {**ask, "ignore_eos": True})["generation_settings"]["logit_bias"]
    eog = smollm2._native.eog_ids
    assert eog and banned == [{"bias": None, "token": t} for t in eog]


@pytest.mark.parametrize("bias, said", [
    ([["", -1]], "keys are token ids or texts"), ([[True, -1]], "keys are token ids or texts"),
    ([[1, "x"]], "a bias is a number"), ([[1]], "expected [token id or text, bias] pairs"),
    ({"999999999": -1}, "outside the vocabulary"),
])
def test_bad_logit_biases_are_refused_by_name(server, bias, said):
    e = error_of(http(server.url + "/completion", {"prompt": "Hi", "n_predict": 1, "logit_bias": bias}), 400)
    assert "logit_bias" in e["message"] and said in e["message"], e


@pytest.mark.with_flags
def test_repeat_last_n_minus_one_is_the_whole_history(server):
    status, _, body = http(server.url + "/completion", {"prompt": "Hi", "n_predict": 3, "repeat_last_n": -1,
                                                        "repeat_penalty": 1.3, "temperature": 0})
    assert status == 200, body


@pytest.mark.with_flags
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


# -- /tokenize, /apply-template, /props, /health ------------------------------------

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


@pytest.mark.with_flags
def test_chat_template_file_is_rendered(server):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    status, _, body = http(server.url + "/apply-template", {"messages": msgs})
    assert status == 200, body
    assert json.loads(body)["prompt"] == "<<system>>Be brief.<<user>>Hi"
    props = json.loads(http(server.url + "/props")[2])
    assert props["chat_template"] == TEMPLATE


def test_props_health_metrics(server):
    props = json.loads(http(server.url + "/props")[2])
    # The default slots (-np auto, llama-server's): four sharing the context.
    assert props["default_generation_settings"]["n_ctx"] == 2048 and props["total_slots"] == 4
    assert props["model_path"].endswith(".gguf") and props["chat_template"]
    status, _, body = http(server.url + "/health")
    assert status == 200 and json.loads(body) == {"status": "ok"}
    assert error_of(http(server.url + "/metrics"), 501)["type"] == "not_supported_error"


# -- --metrics ---------------------------------------------------------------------

@pytest.mark.with_flags
def test_metrics_text_and_counters(server):
    status, headers, body = http(server.url + "/metrics")
    assert status == 200
    ctype = headers["Content-Type"]
    assert ctype.startswith("text/plain") and "version=0.0.4" in ctype
    assert abs(int(headers["Process-Start-Time-Unix"]) - time.time()) < 3600, "when the server started"
    text = body.decode()
    for name in ("llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens_cached_total", "llamacpp:n_decode_total",
                 "llamacpp:spec_decode_num_drafts_total", "llamacpp:tokens_predicted_total",
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
    # As llama-server counts them: the tokens read, and those the cache held, apart.
    read, cached = (after[f"llamacpp:{n}"] - before[f"llamacpp:{n}"]
                    for n in ("prompt_tokens_total", "prompt_tokens_cached_total"))
    assert cached == usage["prompt_tokens_details"]["cached_tokens"] and read + cached == usage["prompt_tokens"]
    assert after["llamacpp:n_decode_total"] - before["llamacpp:n_decode_total"] >= 7
    assert after["llamacpp:n_busy_slots_per_decode"] >= 1 and after["llamacpp:n_tokens_max"] >= read
    assert after["llamacpp:tokens_predicted_total"] - before["llamacpp:tokens_predicted_total"] == usage["completion_tokens"] == 7
    assert after["llamacpp:requests_processing"] == 0 and after["llamacpp:requests_deferred"] == 0
    assert after["llamacpp:kv_cache_tokens"] == 0  # the finished request's cache is freed


# -- slots: -np 2, the prompt cache, /slots, --cache-ram -----------------------------

def _stream_text(url: str, prompt: str, n: int) -> str:
    status, _, out = http(url + "/v1/chat/completions", {
        "messages": [{"role": "user", "content": prompt}], "max_tokens": n, "temperature": 0,
        "ignore_eos": True, "stream": True})
    assert status == 200, out
    chunks = sse(out)
    assert chunks[-1] == "[DONE]"
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks[:-1] if c["choices"])


@pytest.mark.with_flags
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


@pytest.mark.parametrize("which", ["smollm2_path", "gemma3_path"])
def test_ten_turns_read_only_their_new_tokens(which, request):
    path = request.getfixturevalue(which)
    with ServerProcess(path, "-np", "2", ctx=4096) as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
        messages = [{"role": "user", "content": "Let us talk about lighthouses."}]
        prev_prompt = None
        for turn in range(10):
            r = client.chat.completions.create(model="any", messages=messages, max_tokens=8, temperature=0)
            usage, timings = r.usage, r.model_extra["timings"]
            assert timings["prompt_n"] + timings["cache_n"] == usage.prompt_tokens
            if prev_prompt is not None:
                # Everything the last turn's prompt held is reused; what is read
                # is what this turn added (the answer as the template writes it,
                # and the new question), nothing before it.
                assert usage.prompt_tokens_details.cached_tokens >= prev_prompt, (turn, usage, timings)
                assert timings["prompt_n"] <= usage.prompt_tokens - prev_prompt, (turn, usage, timings)
            prev_prompt = usage.prompt_tokens
            messages += [{"role": "assistant", "content": r.choices[0].message.content or ""},
                         {"role": "user", "content": f"Tell me one more thing, number {turn + 2}."}]


def test_slots_list_save_erase_restore(smollm2_path, tmp_path):
    with ServerProcess(smollm2_path, "-np", "2", "--slot-save-path", str(tmp_path)) as s:
        prompt = "The lighthouse keeper climbed the stairs every evening to light the lamp. " * 3
        status, _, body = http(s.url + "/completion", {"prompt": prompt, "n_predict": 4, "temperature": 0})
        assert status == 200, body
        status, _, body = http(s.url + "/slots")
        assert status == 200
        listed = json.loads(body)
        assert [x["id"] for x in listed] == [0, 1]
        assert all(x["n_ctx"] == 1024 and not x["is_processing"] and x["prompt"] == "" for x in listed)
        used = next(x for x in listed if x["n_cached_tokens"] > 0)
        sid, held = used["id"], used["n_cached_tokens"]
        assert prompt not in body.decode(), "never another client's text"

        status, _, body = http(f"{s.url}/slots/{sid}?action=save", {"filename": "keeper.bin"})
        saved = json.loads(body)
        assert status == 200 and saved["id_slot"] == sid and saved["n_saved"] == held, saved
        assert (tmp_path / "keeper.bin").stat().st_size == saved["n_written"]
        # Sized by the tokens held: the keys and values of `held` positions
        # (f16, 30 layers, 3 KV heads of 64), not the slot's 1024.
        per_position = 30 * 2 * 3 * 64 * 2
        assert saved["n_written"] < held * per_position + 64 * 1024, (saved, held)
        # A second save under that name is refused unless it says to replace the file.
        e = error_of(http(f"{s.url}/slots/{sid}?action=save", {"filename": "keeper.bin"}), 409)
        assert "overwrite" in e["message"]
        again = json.loads(http(f"{s.url}/slots/{sid}?action=save", {"filename": "keeper.bin", "overwrite": True})[2])
        assert again["n_saved"] == held
        status, _, body = http(f"{s.url}/slots/{sid}?action=erase", {})
        assert status == 200 and json.loads(body) == {"id_slot": sid, "n_erased": held}
        status, _, body = http(f"{s.url}/slots/{sid}?action=restore", {"filename": "keeper.bin"})
        restored = json.loads(body)
        assert status == 200 and restored["n_restored"] == held, restored
        # The restored slot serves a continuation from its cache.
        status, _, body = http(s.url + "/completion", {"prompt": prompt + " Then", "n_predict": 2, "temperature": 0})
        assert json.loads(body)["timings"]["cache_n"] >= held - 4

        for path, payload, code, needle in [
            (f"/slots/{sid}?action=save", {"filename": "../escape.bin"}, 400, "filename"),
            (f"/slots/{sid}?action=save", {"filename": "a/b"}, 400, "filename"),
            (f"/slots/{sid}?action=save", {"filename": ".hidden"}, 400, "filename"),
            (f"/slots/{sid}?action=save", {"filename": "-rf"}, 400, "filename"),
            (f"/slots/{sid}?action=save", {"filename": "x.bin", "overwrite": "yes"}, 400, "overwrite"),
            (f"/slots/{sid}?action=restore", {"filename": "missing.bin"}, 400, "missing.bin"),
            (f"/slots/{sid}?action=dance", {}, 400, "action"),
            ("/slots/7?action=erase", {}, 400, "no slot"),
        ]:
            e = error_of(http(s.url + path, payload), code)
            assert needle in e["message"], (path, e)
        (tmp_path / "junk.bin").write_bytes(b"junk")
        e = error_of(http(f"{s.url}/slots/{sid}?action=restore", {"filename": "junk.bin"}), 400)
        assert "not a saved slot" in e["message"]
        assert not (tmp_path.parent / "escape.bin").exists()


def test_slot_files_need_a_save_path(smollm2_path):
    with ServerProcess(smollm2_path) as s:
        e = error_of(http(s.url + "/slots/0?action=save", {"filename": "x.bin"}), 501)
        assert "--slot-save-path" in e["message"]


def test_the_host_cache_brings_a_conversation_back(smollm2_path):
    """One slot, two alternating conversations: each comes back from host
    memory (--cache-ram) instead of being read again; with it off, it is read."""
    a = "Conversation A is about the tides, the moon and the harbour master. " * 3
    b = "Conversation B is about bread, ovens and the baker's early mornings. " * 3
    for flags, reused in ((["--cache-ram", "64"], True), (["--cache-ram", "0"], False)):
        with ServerProcess(smollm2_path, "-np", "1", *flags) as s:
            for prompt in (a, b):
                assert http(s.url + "/completion", {"prompt": prompt, "n_predict": 2})[0] == 200
            status, _, body = http(s.url + "/completion", {"prompt": a + " More", "n_predict": 2})
            t = json.loads(body)["timings"]
            assert status == 200 and (t["cache_n"] >= 30) == reused, (flags, t)


# -- penalties count the prompt ------------------------------------------------------

def test_penalties_count_the_prompt_s_last_tokens_as_llama_server_s_do(server):
    """Recorded from llama.cpp's llama-server (tests/golden/penalties-smollm2.json):
    the prompts repeat themselves, so the first token is the penalised one
    only if the prompt's last tokens count."""
    from paths import ROOT

    recorded = json.loads((ROOT / "tests" / "golden" / "penalties-smollm2.json").read_text())["cases"]
    for case in recorded:
        got = post_ok(server, "/completion", case["request"])
        # The first tokens, where the penalties decide: further on, a greedy
        # continuation may part from llama.cpp's where its top two are close
        # (the logits themselves are held by the parity tests).
        n = 8
        assert got["tokens"][:n] == case["tokens"][:n], (case["request"]["prompt"], got["content"], case["content"])
        unpenalised = post_ok(server, "/completion", {**case["request"], "repeat_last_n": 0})
        assert unpenalised["tokens"][0] != case["tokens"][0], "the case must turn on the prompt's penalties"


# -- return_progress, timings_per_token ------------------------------------------------

def _check_progress(reports: list[dict], n_prompt: int) -> None:
    """llama-server's manner: one report before the first pass (nothing read
    yet beyond the cache), then one after each pass, the last with all read."""
    assert len(reports) >= 2, reports
    first, last = reports[0], reports[-1]
    assert first["processed"] == first["cache"] and first["time_ms"] == 0.0
    assert all(r["total"] == n_prompt and r["cache"] == first["cache"] for r in reports)
    assert all(a["processed"] < b["processed"] for a, b in zip(reports, reports[1:]))
    assert last["processed"] == n_prompt and last["time_ms"] > 0


def test_a_stream_reports_the_prompt_s_reading_and_each_chunk_s_timings(smollm2_path):
    asked = {"stream": True, "return_progress": True, "timings_per_token": True}
    with ServerProcess(smollm2_path, "-b", "16", "-ub", "16", ctx=512) as s:
        chat = {"messages": [{"role": "user", "content": "This is a test. " * 8}], "max_tokens": 3,
                "stream_options": {"include_usage": True}}
        for again in (False, True):  # the second finds all but the last prompt token in its slot
            events = sse(http(s.url + "/v1/chat/completions", {**chat, **asked})[2])[:-1]
            usage = events[-1]["usage"]
            reports = [e["prompt_progress"] for e in events if "prompt_progress" in e]
            _check_progress(reports, usage["prompt_tokens"])
            assert reports[0]["cache"] == usage["prompt_tokens_details"]["cached_tokens"]
            assert (len(reports) == 2) == again, reports
            assert all(e["choices"] == [] for e in events if "prompt_progress" in e)
            tokens = [e for e in events if e["choices"] and e["choices"][0]["delta"].get("content")]
            assert tokens and all(e["timings"]["prompt_n"] == usage["prompt_tokens"] - reports[0]["cache"]
                                  for e in tokens)
            assert [e["timings"]["predicted_n"] for e in tokens] == list(range(1, len(tokens) + 1))
        plain = sse(http(s.url + "/v1/chat/completions", {**chat, "stream": True})[2])[:-1]
        assert not any("prompt_progress" in e for e in plain)
        assert not any("timings" in e for e in plain if e["choices"] and e["choices"][0]["finish_reason"] is None)

        prompt = "the quick brown fox jumps over the lazy dog " * 6
        events = sse(http(s.url + "/completion", {"prompt": prompt, "n_predict": 3, **asked})[2])
        _check_progress([e["prompt_progress"] for e in events if "prompt_progress" in e], events[-1]["tokens_evaluated"])
        assert all("timings" in e for e in events)
        events = sse(http(s.url + "/v1/completions", {"prompt": prompt + "!", "max_tokens": 3, **asked})[2])[:-1]
        reports = [e["prompt_progress"] for e in events if "prompt_progress" in e]
        _check_progress(reports, reports[-1]["total"])

        st, _, raw = http(s.url + "/v1/responses", {"input": "This is a test. " * 8, "max_output_tokens": 3, **asked})
        kinds = [json.loads(line[5:]) for line in raw.decode().splitlines() if line.startswith("data:")]
        reports = [k["prompt_progress"] for k in kinds if "prompt_progress" in k]
        assert all(k["type"] == "response.in_progress" for k in kinds if "prompt_progress" in k)
        end = kinds[-1]
        _check_progress(reports, end["response"]["usage"]["input_tokens"])
        assert "timings" in end and all("timings" in k for k in kinds if k["type"] == "response.output_text.delta")


def test_completion_reads_every_prompt_form_llama_server_reads(server):
    """A string, ids, ids and strings in one list, {"prompt_string"}, and a
    list of those (each its own prompt, answered in a list by index)."""
    text = "I believe the meaning of life is"
    ids = post_ok(server, "/tokenize", {"content": text, "add_special": True})["tokens"]
    ask = {"n_predict": 4, "temperature": 0}
    alone = post_ok(server, "/completion", {**ask, "prompt": text})
    for same in (ids, {"prompt_string": text}, [text]):
        r = post_ok(server, "/completion", {**ask, "prompt": same})
        assert r["content"] == alone["content"] and r["tokens_evaluated"] == len(ids), same
    several = post_ok(server, "/completion", {**ask, "prompt": [ids, text, {"prompt_string": text}]})
    assert [r["index"] for r in several] == [0, 1, 2]
    assert all(r["content"] == alone["content"] and r["stop"] for r in several)
    # Mixed: each string tokenized in its place, a BOS only where a string comes first.
    mixed = post_ok(server, "/completion", {**ask, "prompt": [*ids[:3], " meaning", 42, text]})
    bare = [len(post_ok(server, "/tokenize", {"content": x})["tokens"]) for x in (" meaning", text)]
    assert mixed["tokens_evaluated"] == 3 + bare[0] + 1 + bare[1]
    events = sse(http(server.url + "/completion", {**ask, "prompt": [text, ids], "stream": True})[2])
    finals = sorted((e for e in events if e["stop"]), key=lambda e: e["index"])
    assert [e["index"] for e in finals] == [0, 1]
    for i in (0, 1):
        assert "".join(e["content"] for e in events if e["index"] == i) == alone["content"]
    for bad, said in (([{"prompt_string": text, "multimodal_data": ["AAAA"]}], "read text only"),
                      ([{"text": text}], "prompt_string"), ([[1.5]], "expected a string")):
        assert said in error_of(http(server.url + "/completion", {**ask, "prompt": bad}), 400)["message"]


def test_post_sampling_probs_are_the_draw_s_distribution(server):
    """llama-server's post_sampling_probs: `prob` and `top_probs` from what
    the samplers left (top-k 3 here: three candidates whose probabilities
    add up to 1), not the model's log-probabilities over the vocabulary."""
    ask = {"prompt": "Today was the day. Today I would finally become a", "n_probs": 10, "n_predict": 5,
           "temperature": 1.0, "top_k": 3, "top_p": 1.0, "min_p": 0.0, "seed": 9}
    r = post_ok(server, "/completion", {**ask, "post_sampling_probs": True})
    for tok in r["completion_probabilities"]:
        top = tok["top_probs"]
        assert "logprob" not in tok and "top_logprobs" not in tok
        assert len(top) == 3 and sum(p["prob"] for p in top) == pytest.approx(1.0, abs=1e-5)
        assert all(0 < p["prob"] <= 1 for p in top) and top == sorted(top, key=lambda p: -p["prob"])
        assert tok["prob"] == next(p["prob"] for p in top if p["id"] == tok["id"])
    model_s = post_ok(server, "/completion", ask)["completion_probabilities"]
    assert [t["id"] for t in model_s] == [t["id"] for t in r["completion_probabilities"]], "the same draws"
    assert len(model_s[0]["top_logprobs"]) == 10
    greedy = post_ok(server, "/completion", {**ask, "temperature": 0, "post_sampling_probs": True})
    assert all(t["prob"] == 1.0 and [p["id"] for p in t["top_probs"]] == [t["id"]]
               for t in greedy["completion_probabilities"])
