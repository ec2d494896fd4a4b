"""--api-prefix, as llama-server's: every route, the chat page and its
files served below one path, and nothing outside it; a path it cannot be
(no leading slash, a trailing one, characters a URL would encode) refused
at the start."""

from __future__ import annotations

import json

import pytest

from api_helpers import openai_client
from ember.server.cli import OptionError, parse_options
from server_process import ServerProcess, http

PREFIX = "/llm/v2"
HTML = {"Accept": "text/html"}


@pytest.fixture(scope="module")
def server(smollm2_path):
    with ServerProcess(smollm2_path, "--api-prefix", PREFIX) as s:
        yield s


def test_the_routes_answer_below_the_prefix_and_nothing_outside_it(server):
    for path in ("/health", "/v1/models", "/props", "/api/tags", "/openapi.json"):
        status, _, body = http(server.url + path)
        assert status == 200, (path, body)
    models = json.loads(http(server.url + "/v1/models")[2])
    assert [m["id"] for m in models["data"]]
    for path in ("/health", "/v1/models", "/", "/llm/health", PREFIX, PREFIX + "x/health", "/webui/app.js",
                 PREFIX + "//health", PREFIX + "//evil.example/v1/models"):
        status, _, body = http(server.root + path, headers=HTML)
        assert status == 404, (path, body)
        assert f"GET {path}: no such route".encode() in body, body
    # A preflight outside the prefix is no route's either.
    status, headers, _ = http(server.root + "/v1/models", method="OPTIONS",
                              headers={"Origin": "http://localhost:1", "Access-Control-Request-Method": "GET"})
    assert status == 404 and "Access-Control-Allow-Origin" not in headers
    assert http(server.url + "/health", method="HEAD")[0] == 200
    assert any(f"routes: every one under {PREFIX} (--api-prefix)" in line for line in server.lines)


def test_a_query_and_an_encoded_path_pass_below_the_prefix(server):
    status, _, body = http(server.url + "/v1/stream?conv_id=ab%20c")
    assert status == 404 and "no stream is kept under 'ab c'" in json.loads(body)["error"]["message"]
    status, _, body = http(server.url + "/v1/no%20such")
    assert status == 404 and f"GET {PREFIX}/v1/no such: no such route".encode() in body
    # The log names the path as sent.
    assert server.saw(f"GET {PREFIX}/v1/no such 404")


def test_the_official_client_streams_and_answers_below_the_prefix(server):
    client = openai_client(server)
    ask = dict(model="any", messages=[{"role": "user", "content": "Say hi."}], max_tokens=4, temperature=0)
    whole = client.chat.completions.create(**ask)
    chunks = client.chat.completions.create(**ask, stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert whole.choices[0].message.content and streamed == whole.choices[0].message.content


def test_the_page_and_its_requests_go_below_the_prefix(server):
    status, headers, body = http(server.url + "/", headers=HTML)
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    page = body.decode()
    assert f'<meta name="ember-api-prefix" content="{PREFIX}">' in page
    assert f'<script src="{PREFIX}/webui/app.js"' in page and "{{api_prefix}}" not in page
    status, _, script = http(server.url + "/webui/app.js")
    assert status == 200 and b'fetch(API + "/v1/chat/completions"' in script and b'fetch("/' not in script
    # The API description places its paths below the prefix.
    doc = json.loads(http(server.url + "/openapi.json")[2])
    assert doc["servers"] == [{"url": PREFIX}] and "/v1/chat/completions" in doc["paths"]


@pytest.mark.parametrize("value", ["api", "/api/", "/a b", "/api/../x", "/a%2Fb", "/a//b", "/a?b", "//"])
def test_a_prefix_that_is_no_plain_path_is_refused(smollm2_path, value):
    with pytest.raises(OptionError, match="--api-prefix") as e:
        parse_options(["-m", str(smollm2_path), "--api-prefix", value], {})
    assert "a leading slash, no trailing one" in str(e.value)


def test_the_environment_names_the_prefix_as_llama_server_s_does(smollm2_path):
    opts, lines = parse_options(["-m", str(smollm2_path)], {"LLAMA_ARG_API_PREFIX": "/api"})
    assert opts.api_prefix == "/api" and any("every one under /api" in line for line in lines)
    assert parse_options(["-m", str(smollm2_path)], {})[0].api_prefix == ""
    _, lines = parse_options(["-m", str(smollm2_path), "--api-prefix", "/api", "--metrics"], {})
    assert "metrics: at /api/metrics" in lines and "web page: a chat page at /api/ (--no-webui turns it off)" in lines


def test_with_a_key_the_prefix_s_routes_ask_for_it_and_outside_them_is_no_route(smollm2_path):
    """Outside the prefix nothing answers, keyed or not (404, not 401); below
    it a route asks for the key as at the root."""
    with ServerProcess(smollm2_path, "--api-prefix", "/p", "--api-key", "k1") as s:
        key = {"Authorization": "Bearer k1"}
        assert http(s.url + "/v1/models")[0] == 401
        assert http(s.url + "/v1/models", headers=key)[0] == 200
        for headers in ({}, key):
            assert http(s.root + "/v1/models", headers=headers)[0] == 404
