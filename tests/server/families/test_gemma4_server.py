"""Gemma 4 through the server, end to end: the tiny random-weight gemma4 model
(a Gemma 4-style vocabulary with its markup tokens, see
make_tiny_models.gemma4_vocab) served with Gemma 4's real chat template
(tests/fixtures/google-gemma-4-31B-it.chat_template.jinja, as llama.cpp ships
it in models/templates). Random weights write nothing sensible, so grammars
steer the output through a thought and an answer, and forced tool choices make
the constrained decoder write calls in Gemma 4's markup: what these tests show
is the template, the thought channel and the call framing on each route, not
the model."""

from __future__ import annotations

import json
import sys

import pytest

from chat_cases import LOOKUP
from paths import FIXTURES
from server_process import ServerProcess, http, post_ok as post, sse, thought_and_answer

jsonschema = pytest.importorskip("jsonschema")

sys.path.insert(0, str(FIXTURES))
import make_tiny_models  # noqa: E402

TEMPLATE = FIXTURES / "google-gemma-4-31B-it.chat_template.jinja"
CHAT = [{"role": "user", "content": "Why is the sky blue?"}]
#: A thought in Gemma 4's channel, its close, then the answer.
THOUGHT = r'''root ::= "<|channel>thought\n" [a-z ]{1,8} "<channel|>" "The answer" [a-z ]{0,6}'''


@pytest.fixture(scope="module")
def server():
    with ServerProcess(make_tiny_models.ensure("gemma4"), "--chat-template-file", str(TEMPLATE)) as s:
        yield s


def test_the_template_renders_gemma_4_turns(server):
    on = post(server, "/apply-template", {"messages": CHAT, "chat_template_kwargs": {"enable_thinking": True}})["prompt"]
    off = post(server, "/apply-template",
               {"messages": CHAT, "chat_template_kwargs": {"enable_thinking": False}})["prompt"]
    # Unless told, the template thinks, as llama-server tells it (its "auto" on a template that thinks).
    assert post(server, "/apply-template", {"messages": CHAT})["prompt"] == on
    assert "<|turn>user\nWhy is the sky blue?<turn|>" in on and on.endswith("<|turn>model\n")
    assert "<|think|>" in on and "<|think|>" not in off
    # Thinking off: the template closes the thought channel in the prompt.
    assert off.endswith("<|turn>model\n<|channel>thought\n<channel|>")


@pytest.mark.parametrize("stream", [False, True])
def test_the_thought_channel_leaves_in_reasoning_content(server, stream):
    body = {"messages": CHAT, "grammar": THOUGHT, "max_tokens": 60, "temperature": 0, "stream": stream,
            "chat_template_kwargs": {"enable_thinking": True}}
    status, _, raw = http(server.url + "/v1/chat/completions", body)
    assert status == 200, raw
    reasoning, content = thought_and_answer(raw, stream)
    assert reasoning and "<|channel>" not in reasoning and "<channel|>" not in reasoning, reasoning
    assert content.startswith("The answer") and "<channel|>" not in content, content


def test_a_forced_call_is_written_in_gemma_4_markup_and_read_back(server):
    body = {"messages": CHAT, "tools": [LOOKUP], "tool_choice": "required", "max_tokens": 80, "temperature": 0}
    c = post(server, "/v1/chat/completions", body)["choices"][0]
    call = c["message"]["tool_calls"][0]["function"]
    assert c["finish_reason"] == "tool_calls" and call["name"] == "lookup"
    jsonschema.validate(json.loads(call["arguments"]), LOOKUP["function"]["parameters"])
    assert not (c["message"].get("content") or "").strip()
    # Streamed, the call arrives as deltas that rebuild the same arguments.
    status, _, raw = http(server.url + "/v1/chat/completions", {**body, "stream": True})
    deltas = [e["choices"][0]["delta"] for e in sse(raw) if isinstance(e, dict) and e.get("choices")]
    parts = [d["tool_calls"][0] for d in deltas if d.get("tool_calls")]
    assert parts and parts[0]["function"]["name"] == "lookup"
    assert "".join(p["function"].get("arguments") or "" for p in parts) == call["arguments"]
    assert not any("<|tool_call>" in (d.get("content") or "") for d in deltas)


def test_a_call_round_trip_renders_the_result_in_the_template(server):
    call = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": json.dumps({"q": "sky"})}}
    messages = CHAT + [{"role": "assistant", "content": None, "tool_calls": [call]},
                       {"role": "tool", "tool_call_id": "call_1", "content": "Rayleigh scattering"}]
    prompt = post(server, "/apply-template", {"messages": messages, "tools": [LOOKUP]})["prompt"]
    assert "<|tool_call>call:lookup{" in prompt and "<|tool_response>" in prompt and "Rayleigh scattering" in prompt
    c = post(server, "/v1/chat/completions", {"messages": messages, "tools": [LOOKUP], "max_tokens": 8,
                                               "temperature": 0})["choices"][0]
    assert c["finish_reason"] in ("length", "stop", "tool_calls")


def test_anthropic_and_responses_routes_read_the_same_call(server):
    ask = {"tool_choice": {"type": "any"}, "max_tokens": 80, "temperature": 0,
           "messages": [{"role": "user", "content": "Why is the sky blue?"}],
           "tools": [{"name": "lookup", "description": "Looks a word up.",
                      "input_schema": LOOKUP["function"]["parameters"]}]}
    msg = post(server, "/v1/messages", ask)
    uses = [b for b in msg["content"] if b["type"] == "tool_use"]
    assert msg["stop_reason"] == "tool_use" and uses and uses[0]["name"] == "lookup"
    jsonschema.validate(uses[0]["input"], LOOKUP["function"]["parameters"])
    resp = post(server, "/v1/responses", {"input": "Why is the sky blue?", "tool_choice": "required", "max_output_tokens": 80,
                                          "temperature": 0, "tools": [{"type": "function", "name": "lookup",
                                                                       "parameters": LOOKUP["function"]["parameters"]}]})
    calls = [o for o in resp["output"] if o["type"] == "function_call"]
    assert calls and calls[0]["name"] == "lookup"
    jsonschema.validate(json.loads(calls[0]["arguments"]), LOOKUP["function"]["parameters"])
