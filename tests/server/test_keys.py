"""API keys with scopes and limits (`ember.server.keys`, the middleware):
a key file's fields, the scope each route needs, in-flight and rate limits
as the official clients read them (their typed errors), refusals counted in
/metrics, and each key's prompts cached for that key alone."""

from __future__ import annotations

import pytest

from ember.server.errors import ApiError
from ember.server.keys import KeyLimits, KeyRule, parse_key_line, scope_needed
from server_process import ServerProcess, error_of, http

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")


def test_a_key_line_carries_scope_and_limits():
    assert parse_key_line("plain") == ("plain", KeyRule())
    key, rule = parse_key_line("k1 scope=inference,read inflight=2 rate=30/min burst=3")
    assert key == "k1" and rule.scopes == {"inference", "read"} and rule.inflight == 2
    assert rule.rate == pytest.approx(0.5) and rule.burst == 3
    assert parse_key_line("k2 rate=4/s")[1].burst == 4
    for bad, says in [("k scope=root", "scope"), ("k inflight=0", "at least 1"), ("k rate=5/h", "rate"),
                      ("k burst=2", "needs a rate"), ("k colour=red", "unknown field"), ("k scope", "name=value"),
                      ("k inflight=1 inflight=2", "twice")]:
        with pytest.raises(ValueError, match=says):
            parse_key_line(bad)


@pytest.mark.parametrize("method, path, scope", [
    ("POST", "/v1/chat/completions", "inference"), ("POST", "/v1/embeddings", "inference"),
    ("POST", "/api/chat", "inference"), ("GET", "/v1/models", "read"), ("GET", "/metrics", "read"),
    ("GET", "/slots", "read"), ("POST", "/api/show", "read"), ("POST", "/slots/0", "admin"),
    ("POST", "/shutdown", "admin"), ("GET", "/v1/models/m1", "read"), ("POST", "/v1/models/m1", "inference"),
])
def test_each_route_needs_its_scope(method, path, scope):
    assert scope_needed(method, path) == scope


def test_limits_refuse_past_inflight_and_rate_with_retry_after():
    limits = KeyLimits({"a": KeyRule(inflight=1), "b": KeyRule(rate=1.0, burst=2)})
    limits.enter("a")
    with pytest.raises(ApiError) as e:
        limits.enter("a")
    assert e.value.status == 429 and e.value.headers["Retry-After"] == "1"
    limits.leave("a")
    limits.enter("a")
    limits.enter("b")
    limits.enter("b")
    with pytest.raises(ApiError) as e:
        limits.enter("b")
    assert e.value.status == 429 and int(e.value.headers["Retry-After"]) >= 1
    limits.enter("unlimited")  # a key without a rule is never counted


@pytest.fixture(scope="module")
def keyed(smollm2_path, tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys.write_text("# the keys of this test\n"
                    "admin-key\n"
                    "reader scope=read\n"
                    "writer scope=inference inflight=1\n"
                    "slow scope=inference rate=2/min burst=2\n"
                    "other scope=inference\n")
    with ServerProcess(smollm2_path, "--api-key-file", str(keys), "--metrics", "-np", "2", ctx=1024) as s:
        yield s


def _client(server, key):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0)


CHAT = [{"role": "user", "content": "Say hi."}]


def test_scopes_as_the_official_clients_read_them(keyed):
    _client(keyed, "reader").models.list()
    with pytest.raises(openai.PermissionDeniedError) as e:
        _client(keyed, "reader").chat.completions.create(model="x", messages=CHAT, max_tokens=1)
    assert "inference scope" in str(e.value)
    with pytest.raises(openai.PermissionDeniedError):
        _client(keyed, "writer").models.list()
    a = anthropic.Anthropic(base_url=keyed.url, api_key="reader", max_retries=0)
    with pytest.raises(anthropic.PermissionDeniedError):
        a.messages.create(model="x", max_tokens=1, messages=CHAT)
    e = error_of(http(keyed.url + "/slots/0?action=erase", {}, headers={"Authorization": "Bearer other"}), 403)
    assert "admin scope" in e["message"]
    e = error_of(http(keyed.url + "/completion", {"prompt": "hi", "n_predict": 1, "id_slot": 0},
                      headers={"Authorization": "Bearer other"}), 403)
    assert e["param"] == "id_slot"
    assert http(keyed.url + "/slots/0?action=erase", {}, headers={"Authorization": "Bearer admin-key"})[0] == 200


def test_limits_as_the_official_clients_read_them(keyed):
    w = _client(keyed, "writer")
    # The held request is known to be in flight once its first chunk is read
    # (a sleep raced a fast decode), and stays so for hundreds of tokens.
    held = w.chat.completions.create(model="x", messages=CHAT, max_tokens=400, stream=True,
                                     extra_body={"ignore_eos": True})
    next(iter(held))
    with pytest.raises(openai.RateLimitError) as e:
        w.chat.completions.create(model="x", messages=CHAT, max_tokens=1)
    assert e.value.response.headers["Retry-After"] == "1"
    held.close()
    s = _client(keyed, "slow")
    s.chat.completions.create(model="x", messages=CHAT, max_tokens=1)
    s.chat.completions.create(model="x", messages=CHAT, max_tokens=1)
    with pytest.raises(openai.RateLimitError) as e:
        s.chat.completions.create(model="x", messages=CHAT, max_tokens=1)
    assert int(e.value.response.headers["Retry-After"]) >= 1
    metrics = http(keyed.url + "/metrics", headers={"Authorization": "Bearer reader"})[2].decode()
    assert 'ember:requests_refused_total{cause="inflight"} 1' in metrics
    assert 'ember:requests_refused_total{cause="rate"} 1' in metrics


def test_one_keys_cached_prompt_is_never_reused_for_another(keyed):
    """A client that could see how much of its prompt was cached could read
    another's prompt a token at a time (a PIN guessed digit by digit): each
    key's prompts are cached for that key alone."""
    secret = "The vault code is 4 7 1 9 and the guard changes at midnight, every night of the week. " * 3

    def cached(key, text):
        r = http(keyed.url + "/completion", {"prompt": text, "n_predict": 1, "temperature": 0},
                 headers={"Authorization": f"Bearer {key}"})
        assert r[0] == 200, r
        import json
        return json.loads(r[2])["timings"]["cache_n"]

    cached("admin-key", secret)
    assert cached("other", secret) == 0
    assert cached("admin-key", secret + " And") > 0  # its own are still reused
