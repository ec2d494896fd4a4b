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
