"""Inputs written to break the server (every route's checks:
`ember.server.wire`, `ember.server.http`, the middleware, the protocols' own),
each answered by a status naming the problem (never a crash, a 500, a stream
that starts and then fails, or a traceback in the log), and the server still
answering afterwards. Also llama-server's manners these inputs touch: a client
choosing its slot (`id_slot`)."""

from __future__ import annotations

import json
import socket
import threading
import time
from urllib.parse import urlparse

import pytest

from server_process import ServerProcess, error_of, http

CHAT = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server(smollm2_path):
    with ServerProcess(smollm2_path, "-np", "2") as s:
        yield s
        # Whatever was sent, the log holds no traceback: every input was answered, none escaped.
        log = "\n".join(s.lines)
        assert "Traceback" not in log and "Error handling request" not in log, log[-3000:]


def alive(server) -> None:
    status, _, raw = http(server.url + "/v1/chat/completions", {"messages": CHAT, "max_tokens": 2})
    assert status == 200, raw


GRAMMARS = [
    # The parser descends once per group: 20,000 levels would overflow its stack.
    "root ::= " + "(" * 20_000 + '"a"' + ")" * 20_000,
    # Nested optional rules: the paths through their empty alternatives multiply.
    'root ::= ((("a"){0,1000}){0,1000}){0,300}',
]


@pytest.mark.parametrize("route", ["/completion", "/v1/chat/completions"])
@pytest.mark.parametrize("grammar", GRAMMARS, ids=["deep-groups", "nested-repetitions"])
def test_a_grammar_built_to_crash_the_compiler_is_a_400(server, route, grammar):
    body = {"prompt": "hi", "n_predict": 4} if route == "/completion" else {"messages": CHAT, "max_tokens": 4}
    e = error_of(http(server.url + route, {**body, "grammar": grammar}), 400)
    assert e["message"].startswith("grammar:") and e["param"] == "grammar", e
    alive(server)


def test_a_grammar_that_fails_while_generating_is_a_400_before_any_stream(server):
    # Compiles, but after a few bytes more parses are alive than the automaton tracks.
    body = {"prompt": "hi", "n_predict": 4, "grammar": 'root ::= (("a"){0,100}){0,100}'}
    for stream in (False, True):
        status, headers, raw = http(server.url + "/completion", {**body, "stream": stream})
        assert status == 400 and headers["Content-Type"].startswith("application/json"), raw
        e = json.loads(raw)["error"]
        assert e["message"].startswith("grammar:") and e["param"] == "grammar"


@pytest.mark.parametrize("route,body,field", [
    ("/v1/chat/completions", {"messages": CHAT, "top_k": 2**31}, "top_k"),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 2**63}, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "repeat_last_n": 2**31}, "repeat_last_n"),
    ("/completion", {"prompt": "hi", "n_predict": 2**64}, "n_predict"),
])
def test_counts_beyond_32_bits_are_400s_streamed_or_not(server, route, body, field):
    for stream in (False, True):
        e = error_of(http(server.url + route, {**body, "stream": stream}), 400)
        assert e["param"] == field and e["message"].startswith(field + ":"), e


@pytest.mark.parametrize("raw,headers,says", [
    (b'{"messages":[{"role":"user","content":"\xff"}]}', {}, "UTF-8"),
    (b'{"messages":[{"role":"user","content":"hi"}],"junk":' + b"[" * 40_000 + b"]" * 40_000 + b"}", {},
     "too deeply"),
    (b"not gzip at all", {"Content-Encoding": "gzip"}, "cannot be read"),
], ids=["not-utf8", "deep-json", "bad-gzip"])
def test_bodies_that_do_not_decode_are_400s(server, raw, headers, says):
    e = error_of(http(server.url + "/v1/chat/completions", raw=raw, headers=headers), 400)
    assert says in e["message"], e
    alive(server)


def test_deeply_nested_tool_arguments_are_a_400(server):
    args = '{"a":' + "[" * 5000 + "]" * 5000 + "}"
    body = {"max_tokens": 2, "messages": [
        *CHAT, {"role": "assistant", "content": None,
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": args}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "r"}]}
    e = error_of(http(server.url + "/v1/chat/completions", body), 400)
    assert e["message"].startswith("messages[1].tool_calls[0].function.arguments:"), e


@pytest.mark.parametrize("body,field", [
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"text": "hi"}]}]}, "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0].text"),
    ({"messages": CHAT, "top_logprobs": 5}, "top_logprobs"),
    ({"messages": CHAT, "chat_template_kwargs": {"messages": 1}}, "chat_template_kwargs.messages"),
])
def test_chat_fields_left_out_or_misused_are_400s(server, body, field):
    e = error_of(http(server.url + "/v1/chat/completions", {"max_tokens": 2, **body}), 400)
    assert e["message"].startswith(field + ":"), e


def test_an_assistant_turn_of_calls_alone_may_leave_its_content_out(server):
    body = {"max_tokens": 2, "messages": [
        *CHAT, {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                                    "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "r"}]}
    status, _, raw = http(server.url + "/v1/chat/completions", body)
    assert status == 200, raw


@pytest.mark.parametrize("body,field", [
    ({"prompt": "def f(", "suffix": "return 1"}, "suffix"),
    ({"prompt": "hi", "best_of": 3}, "best_of"),
    ({"prompt": [1, "a"]}, "prompt"),
])
def test_text_completion_fields_ember_cannot_honour_are_refused(server, body, field):
    e = error_of(http(server.url + "/v1/completions", {"max_tokens": 2, **body}), 400)
    assert e["message"].startswith(field + ":"), e
    if field == "prompt":
        assert "one prompt per request" not in e["message"]


@pytest.mark.parametrize("body,field", [
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
    ({"messages": CHAT, "tools": [{"type": "function", "function": 5}]}, "tools[0].function"),
    ({"messages": CHAT, "chat_template_kwargs": {"tools": []}}, "chat_template_kwargs.tools"),
])
def test_apply_template_checks_what_a_chat_request_checks(server, body, field):
    e = error_of(http(server.url + "/apply-template", body), 400)
    assert e["message"].startswith(field + ":"), e


def test_apply_template_is_the_prompt_a_chat_request_reads(server):
    status, _, raw = http(server.url + "/apply-template", {"messages": CHAT})
    prompt = json.loads(raw)["prompt"]
    status, _, raw = http(server.url + "/tokenize", {"content": prompt, "add_special": True, "parse_special": True})
    n = len(json.loads(raw)["tokens"])
    status, _, raw = http(server.url + "/v1/chat/completions", {"messages": CHAT, "max_tokens": 1})
    assert json.loads(raw)["usage"]["prompt_tokens"] == n


def test_a_slot_id_that_is_not_an_ascii_number_is_a_400(server):
    e = error_of(http(server.url + "/slots/%C2%B2?action=erase", {}), 400)
    assert e["param"] == "id_slot"


def test_a_client_picks_its_slot_and_waits_for_it_when_busy(server):
    e = error_of(http(server.url + "/completion", {"prompt": "hi", "n_predict": 1, "id_slot": 2}), 400)
    assert e["param"] == "id_slot"
    for slot in (1, 0, 1):
        status, _, raw = http(server.url + "/completion", {"prompt": f"Slot {slot}.", "n_predict": 2, "id_slot": slot})
        reply = json.loads(raw)
        assert status == 200 and reply["id_slot"] == slot
        assert reply["tokens_cached"] == reply["tokens_evaluated"] + reply["tokens_predicted"] - 1

    # Two requests for slot 1: the second waits for the first instead of taking slot 0.
    replies: list[dict] = []
    body = {"prompt": "Count slowly:", "n_predict": 24, "id_slot": 1, "ignore_eos": True}
    threads = [threading.Thread(target=lambda: replies.append(json.loads(http(server.url + "/completion", body)[2])))
               for _ in range(2)]
    for t in threads:
        t.start()
        time.sleep(0.05)
    for t in threads:
        t.join()
    assert [r["id_slot"] for r in replies] == [1, 1]


def test_a_client_leaving_mid_stream_leaves_no_trace_but_its_log_line(server):
    u = urlparse(server.url)
    body = json.dumps({"messages": CHAT, "max_tokens": 64, "stream": True, "ignore_eos": True}).encode()
    for _ in range(3):
        with socket.create_connection((u.hostname, u.port)) as s:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            s.recv(200)  # the headers and a first event, then gone
    time.sleep(1.0)
    alive(server)
    assert any("client gone" in line for line in server.lines)


def test_a_web_page_cannot_shut_the_server_down(server):
    e = error_of(http(server.url + "/shutdown", {}, headers={"Origin": "http://evil.example"}), 403)
    assert "web page" in e["message"]
    alive(server)


# The number is bounded so that every document the schema admits fits the
# token budget: an unbounded integer let greedy decoding on another CPU's
# kernels run a 16-digit number into the limit, and a document cut short by
# the budget is not the schema's failure. The budget is the grammar's worst
# case: three runs of whitespace (a newline and at most 20 spaces each, one
# token a character at worst), `{`, `"n"`, `:`, three digits and `}`.
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 999}},
          "required": ["n"], "additionalProperties": False}
BUDGET = 3 * 21 + 1 + 3 + 1 + 3 + 1
ASK = "Give a number."
ANSWERS = {
    "/v1/messages": ({"messages": [{"role": "user", "content": ASK}], "max_tokens": BUDGET, "temperature": 0},
                     lambda r: r["content"][0]["text"]),
    "/v1/responses": ({"input": ASK, "max_output_tokens": BUDGET, "temperature": 0}, lambda r: r["output"][-1]["content"][0]["text"]),
    "/api/chat": ({"messages": [{"role": "user", "content": ASK}], "stream": False,
                   "options": {"num_predict": BUDGET, "temperature": 0}}, lambda r: r["message"]["content"]),
    "/api/generate": ({"prompt": ASK, "stream": False, "options": {"num_predict": BUDGET, "temperature": 0}},
                      lambda r: r["response"]),
}


@pytest.mark.parametrize("route", ANSWERS)
def test_json_schema_is_honoured_on_every_generating_route(server, route):
    """llama-server's `json_schema` field, read where it was once dropped
    (an unconstrained answer would have been failing open)."""
    body, answer = ANSWERS[route]
    status, _, raw = http(server.url + route, {**body, "json_schema": SCHEMA})
    assert status == 200, raw
    value = json.loads(answer(json.loads(raw)))
    assert isinstance(value, dict) and set(value) == {"n"} and isinstance(value["n"], int) and 0 <= value["n"] <= 999
    status, _, raw = http(server.url + route, {**body, "json_schema": {"type": 5}})
    assert status == 400 and b"json_schema" in raw, raw
