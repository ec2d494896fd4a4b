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


# -- JSON Schema and JSON objects ---------------------------------------------------

def test_json_object_always_parses(server):
    for seed in range(3):
        status, _, raw = http(server.url + "/v1/chat/completions", {
            "messages": CHAT, "response_format": {"type": "json_object"}, "temperature": 1.0, "seed": seed,
            "max_tokens": 200})
        assert status == 200
        c = json.loads(raw)["choices"][0]
        if c["finish_reason"] == "stop":
            assert isinstance(json.loads(c["message"]["content"]), dict)


def test_json_schema_on_every_route(server):
    jsonschema = pytest.importorskip("jsonschema")
    # Bounded lengths and a budget with room: greedy answers differ between
    # CPUs' kernels, and an unbounded number could run any of them into the
    # limit, a cut document that is no fault of the schema's.
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                               "population": {"type": "integer", "minimum": 0, "maximum": 10**9},
                                               "capital": {"type": "boolean"}},
              "required": ["city", "population", "capital"], "additionalProperties": False}
    bodies = [
        ("/v1/chat/completions", {"messages": CHAT, "response_format": {
            "type": "json_schema", "json_schema": {"name": "city", "schema": schema, "strict": True}}}),
        ("/v1/chat/completions", {"messages": CHAT, "json_schema": schema}),
        ("/completion", {"prompt": "A city as JSON:", "json_schema": schema}),
        ("/v1/completions", {"prompt": "A city as JSON:", "response_format": {"type": "json_object", "schema": schema}}),
    ]
    for route, body in bodies:
        status, _, raw = http(server.url + route, {**body, "max_tokens": 240, "n_predict": 240, "temperature": 0})
        assert status == 200, raw
        r = json.loads(raw)
        text = r.get("content") if route == "/completion" else (
            r["choices"][0].get("text") if route == "/v1/completions" else r["choices"][0]["message"]["content"])
        doc = json.loads(text)
        jsonschema.validate(doc, schema)
        assert list(doc) == ["city", "population", "capital"], "properties come in the schema's order"


def test_pydantic_parse_round_trip(client):
    """The openai client's `.parse()` with a Pydantic model (nested models,
    an Optional field, a list, a Literal, an Enum) gets back a parsed object."""
    pydantic = pytest.importorskip("pydantic")
    from enum import Enum
    from typing import Literal, Optional

    class Colour(str, Enum):
        red = "red"
        green = "green"

    class Address(pydantic.BaseModel):
        street: str = pydantic.Field(max_length=30)
        number: int

    class Person(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=20)
        age: int = pydantic.Field(ge=0, le=130)
        nickname: Optional[str] = pydantic.Field(default=None, max_length=12)
        kind: Literal["human", "robot"]
        colour: Colour
        tags: list[str] = pydantic.Field(max_length=3)
        home: Address
        previous: Optional[Address] = None

    r = client.beta.chat.completions.parse(model="any", messages=CHAT, response_format=Person, max_tokens=300,
                                           temperature=0.7, seed=1)
    person = r.choices[0].message.parsed
    assert isinstance(person, Person), r.choices[0].message.content
    assert isinstance(person.home, Address) and 0 <= person.age <= 130


@pytest.mark.parametrize("schema,keyword", [
    ({"type": "integer", "multipleOf": 3}, "multipleOf"),
    ({"type": "object", "minProperties": 1}, "minProperties"),
    ({"type": "array", "uniqueItems": True}, "uniqueItems"),
    ({"type": "string", "format": "ipv4"}, "format"),
    ({"$ref": "other.json#/x"}, "$ref"),
    ({"not": {"type": "string"}}, "not"),
])
def test_a_schema_outside_the_subset_is_a_400_naming_the_keyword(server, schema, keyword):
    for body in ({"json_schema": schema}, {"response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": schema}}}):
        e = error_of(http(server.url + "/v1/chat/completions", {"messages": CHAT, "max_tokens": 4, **body}), 400)
        assert keyword in e["message"] and e["param"] in ("json_schema", "response_format"), e
