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
    assert server.url == server.root + PREFIX
    for path in ("/health", "/v1/models", "/props", "/api/tags", "/openapi.json"):
        status, _, body = http(server.url + path)
        assert status == 200, (path, body)
    models = json.loads(http(server.url + "/v1/models")[2])
    assert [m["id"] for m in models["data"]]
    for path in ("/health", "/v1/models", "/", "/llm/health", PREFIX, PREFIX + "x/health", "/webui/app.js"):
        status, _, body = http(server.root + path, headers=HTML)
        assert status == 404, (path, body)
        assert b"no such route" in body
    assert any(f"routes: every one under {PREFIX} (--api-prefix)" in line for line in server.lines)


def test_a_query_and_an_encoded_path_pass_below_the_prefix(server):
    status, _, body = http(server.url + "/v1/stream?conv_id=ab%20c")
    assert status == 404 and "no stream is kept under 'ab c'" in json.loads(body)["error"]["message"]
    status, _, body = http(server.url + "/v1/no%20such")
    assert status == 404 and b"/v1/no such: no such route" in body


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
