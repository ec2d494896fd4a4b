"""The middleware every route passes (`ember.server.middleware`), on a real
`ember serve` process: the API key, the error envelope of a path no route
takes, and one log line per request."""

from __future__ import annotations

import time

import pytest

from server_process import ServerProcess, error_of, http

openai = pytest.importorskip("openai")


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


def test_unknown_route_and_malformed_json(server):
    e = error_of(http(server.url + "/v2/nothing", {}), 404)
    assert e["type"] == "not_found_error" and "POST /v2/nothing" in e["message"]
    e = error_of(http(server.url + "/v1/chat/completions", raw=b'{"messages": ['), 400)
    assert "JSON" in e["message"]


def test_log_line_per_request(server):
    http(server.url + "/completion", {"prompt": "Hi", "n_predict": 2})
    time.sleep(0.2)
    lines = [l for l in server.lines if l.startswith("POST /completion 200")]
    assert lines and "prompt " in lines[-1] and "2 drawn" in lines[-1] and "max tokens" in lines[-1]


def test_the_key_is_asked_before_the_route_is_told(smollm2_path):
    """Without a key, which routes exist is not told: an unknown path or
    method is a 401 like any other (only /health and preflights answer)."""
    with ServerProcess(smollm2_path, "--api-key", "sekrit", ctx=256) as s:
        assert error_of(http(s.url + "/v2/nothing", {}), 401)["type"] == "authentication_error"
        assert error_of(http(s.url + "/v1/chat/completions", method="GET"), 401)
        ok = {"Authorization": "Bearer sekrit"}
        assert error_of(http(s.url + "/v2/nothing", {}, headers=ok), 404)
        assert error_of(http(s.url + "/v1/chat/completions", method="GET", headers=ok), 405)
        # With a key, the Host is not what guards the server: a client may reach it by any name.
        assert http(s.url + "/props", headers={**ok, "Host": "box.example:8080"})[0] == 200


def test_a_keyless_server_answers_only_its_own_host_names(server):
    port = server.url.rsplit(":", 1)[1]
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost"):
        assert http(server.url + "/props", headers={"Host": host})[0] == 200, host
    for host in (f"evil.example:{port}", "evil.example", f"10.0.0.7:{port}"):
        e = error_of(http(server.url + "/props", headers={"Host": host}), 403)
        assert "DNS rebinding" in e["message"], host
    # /health answers as it always has (load balancers), the guard aside.
    assert http(server.url + "/health", headers={"Host": "evil.example"})[0] == 200


def test_a_page_of_another_origin_is_refused_without_cors_origin(server):
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    for origin in ("http://evil.example", "null"):
        e = error_of(http(server.url + "/v1/chat/completions", chat, headers={"Origin": origin}), 403)
        assert "--cors-origin" in e["message"]
        # The preflight is refused as browsers read it (no CORS headers), the reason named in a header.
        status, headers, _ = http(server.url + "/v1/chat/completions", method="OPTIONS",
                                  headers={"Origin": origin, "Access-Control-Request-Method": "POST"})
        assert status == 200 and "Access-Control-Allow-Origin" not in headers
        assert "--cors-origin" in headers["X-Ember-Refused"]
    # The server's own pages (the chat page) are of its origin.
    status, headers, _ = http(server.url + "/v1/chat/completions", chat, headers={"Origin": server.url})
    assert status == 200 and "Access-Control-Allow-Origin" not in headers


def test_origins_allowed_by_flag_get_cors_and_null_never_does(smollm2_path):
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    with ServerProcess(smollm2_path, "--cors-origin", "http://app.example", ctx=256) as s:
        status, headers, raw = http(s.url + "/v1/chat/completions", method="OPTIONS",
                                    headers={"Origin": "http://app.example", "Access-Control-Request-Method": "POST"})
        assert status == 200 and raw == b""
        assert headers["Access-Control-Allow-Origin"] == "http://app.example"
        assert headers["Access-Control-Allow-Credentials"] == "true" and "POST" in headers["Access-Control-Allow-Methods"]
        for body in (chat, {**chat, "stream": True}):
            status, headers, _ = http(s.url + "/v1/chat/completions", body, headers={"Origin": "http://app.example"})
            assert status == 200 and headers["Access-Control-Allow-Origin"] == "http://app.example"
        assert error_of(http(s.url + "/v1/chat/completions", chat, headers={"Origin": "http://other.example"}), 403)
    with ServerProcess(smollm2_path, "--cors-origin", "*", ctx=256) as s:
        status, headers, _ = http(s.url + "/v1/chat/completions", chat, headers={"Origin": "http://any.example"})
        assert status == 200 and headers["Access-Control-Allow-Origin"] == "*"
        assert "Access-Control-Allow-Credentials" not in headers
        status, headers, _ = http(s.url + "/v1/chat/completions", chat, headers={"Origin": "null"})
        assert status == 200 and headers.get("Access-Control-Allow-Origin") == "*"
        assert "Access-Control-Allow-Credentials" not in headers
