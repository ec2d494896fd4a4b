"""Structured output over HTTP: GBNF grammars, JSON Schemas and JSON objects
on the chat and completion routes, and the refusals that keep a bad grammar
or schema from ever being served as unconstrained text.

SmolLM2-135M cannot be trusted to write JSON by itself; every document here
is whole because the constrained decoder allows nothing else, which is what
these tests check."""

from __future__ import annotations

import json

import pytest

from ember import _native
from server_process import ServerProcess, error_of, http, sse

openai = pytest.importorskip("openai")

CHAT = [{"role": "user", "content": "Describe a person as JSON."}]
PERSON_GBNF = r'''root ::= "{\"name\": \"" [A-Za-z ]{1,20} "\", \"age\": " [0-9]{1,3} "}"'''


@pytest.fixture(scope="module")
def server(smollm2_path):
    with ServerProcess(smollm2_path, "-np", "2") as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_a_grammar_holds_chat_and_completion_output(server):
    g = _native.Grammar.from_gbnf(PERSON_GBNF)
    for seed in range(3):
        body = {"messages": CHAT, "grammar": PERSON_GBNF, "temperature": 1.0, "seed": seed, "max_tokens": 60}
        status, _, raw = http(server.url + "/v1/chat/completions", body)
        assert status == 200, raw
        r = json.loads(raw)
        text = r["choices"][0]["message"]["content"]
        assert g.accepts(text.encode()), text
        assert r["choices"][0]["finish_reason"] == "stop"
        status, _, raw = http(server.url + "/completion", {"prompt": "Person:", "grammar": PERSON_GBNF,
                                                           "seed": seed, "n_predict": 60})
        assert status == 200, raw
        assert g.accepts(json.loads(raw)["content"].encode())


def test_a_grammar_holds_a_stream(server):
    status, _, raw = http(server.url + "/v1/chat/completions", {"messages": CHAT, "grammar": PERSON_GBNF, "stream": True,
                                                                "temperature": 0.7, "seed": 5, "max_tokens": 60})
    assert status == 200
    events = [e for e in sse(raw) if isinstance(e, dict) and e.get("choices")]
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events)
    assert _native.Grammar.from_gbnf(PERSON_GBNF).accepts(text.encode()), text


def test_the_grammar_is_kept_to_even_against_a_cut(server):
    # The token limit cuts the document: finish_reason says so, and the text
    # is still a prefix the grammar allows (never a stray token).
    body = {"messages": CHAT, "grammar": r'root ::= "[" ("\"" [a-z]{1,8} "\"" ", "){50} "]"', "max_tokens": 10}
    status, _, raw = http(server.url + "/v1/chat/completions", body)
    r = json.loads(raw)
    assert status == 200 and r["choices"][0]["finish_reason"] == "length"
    assert r["choices"][0]["message"]["content"].startswith('["')


@pytest.mark.parametrize("body,param,words", [
    ({"grammar": "root ::= \"a"}, "grammar", ["line 1", "unterminated"]),
    ({"grammar": "root ::= x"}, "grammar", ["\"x\"", "never defined"]),
    ({"grammar": "root ::= root \"a\" | \"b\""}, "grammar", ["left-recursive"]),
    ({"grammar": "root ::= \"a\"", "json_schema": {"type": "object"}}, "grammar", ["cannot be combined"]),
    ({"response_format": {"type": "json_object"}, "json_schema": {"type": "object"}}, "json_schema",
     ["cannot be combined"]),
    ({"response_format": {"type": "xml"}}, "response_format", ["json_schema"]),
    ({"response_format": "json"}, "response_format", ["type"]),
    ({"response_format": {"type": "json_schema", "json_schema": "x"}}, "response_format", ["json_schema"]),
])
def test_a_grammar_that_cannot_be_used_is_a_400_naming_its_field(server, body, param, words):
    for route, base in (("/v1/chat/completions", {"messages": CHAT, "max_tokens": 4}),
                        ("/completion", {"prompt": "Hi", "n_predict": 4})):
        e = error_of(http(server.url + route, {**base, **body}), 400)
        assert e["param"] == param, e
        for w in words:
            assert w in e["message"], e


def test_text_response_format_is_plain_text(server):
    status, _, raw = http(server.url + "/v1/chat/completions", {"messages": CHAT, "max_tokens": 4,
                                                                "response_format": {"type": "text"}})
    assert status == 200, raw
