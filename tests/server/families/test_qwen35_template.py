"""Qwen3.5's chat template (tests/fixtures/Qwen3.5-4B.chat_template.jinja,
as llama.cpp ships it in models/templates) served on the tiny random-weight
qwen35 hybrid. Random weights write nothing sensible, so a grammar steers
the output through a thought and an answer, and a forced tool choice makes
the constrained decoder write a call in the template's XML framing: these
tests show the template's thinking default, the thought split and the call
framing on every chat route (OpenAI's chat and responses, Anthropic's
messages, Ollama's chat), not the model."""

from __future__ import annotations

import json
import sys

import pytest

from chat_cases import LOOKUP
from paths import FIXTURES
from server_process import ServerProcess, http, post_ok as post, thought_and_answer

jsonschema = pytest.importorskip("jsonschema")

sys.path.insert(0, str(FIXTURES))
import make_tiny_models  # noqa: E402

TEMPLATE = FIXTURES / "Qwen3.5-4B.chat_template.jinja"
CHAT = [{"role": "user", "content": "Why is the sky blue?"}]
#: The template opens the thought; the model closes it, then answers.
THOUGHT = r'''root ::= [a-z ]{1,8} "\n</think>\n\n" "The answer" [a-z ]{0,6}'''


@pytest.fixture(scope="module")
def server():
    with ServerProcess(make_tiny_models.ensure("qwen35"), "--chat-template-file", str(TEMPLATE)) as s:
        yield s


def test_thinking_is_on_unless_the_request_turns_it_off(server):
    on = post(server, "/apply-template", {"messages": CHAT})["prompt"]
    off = post(server, "/apply-template", {"messages": CHAT, "chat_template_kwargs": {"enable_thinking": False}})["prompt"]
    assert on.endswith("<|im_start|>assistant\n<think>\n"), on
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n"), off


@pytest.mark.parametrize("stream", [False, True])
def test_the_thought_leaves_in_reasoning_content(server, stream):
    body = {"messages": CHAT, "grammar": THOUGHT, "max_tokens": 60, "temperature": 0, "stream": stream}
    status, _, raw = http(server.url + "/v1/chat/completions", body)
    assert status == 200, raw
    reasoning, content = thought_and_answer(raw, stream)
    assert reasoning and "</think>" not in reasoning, reasoning
    assert content.startswith("The answer") and "</think>" not in content, content


def test_a_forced_call_is_written_in_the_xml_framing_and_read_back(server):
    body = {"messages": CHAT, "tools": [LOOKUP], "tool_choice": "required", "max_tokens": 80, "temperature": 0,
            "chat_template_kwargs": {"enable_thinking": False}}
    prompt = post(server, "/apply-template", {"messages": CHAT, "tools": [LOOKUP]})["prompt"]
    assert "<function=example_function_name>" in prompt and '"name": "lookup"' in prompt, prompt
    c = post(server, "/v1/chat/completions", body)["choices"][0]
    call = c["message"]["tool_calls"][0]["function"]
    assert c["finish_reason"] == "tool_calls" and call["name"] == "lookup", c
    jsonschema.validate(json.loads(call["arguments"]), LOOKUP["function"]["parameters"])
    assert "<function=" not in (c["message"].get("content") or "")


# -- the other routes: Anthropic's messages, OpenAI's responses, Ollama's chat --

def test_anthropic_messages_think_by_default_and_call_in_the_framing(server):
    """Thinking is the template's default: the random reply stays inside the
    thought the prompt opened and comes back as a thinking block; disabled,
    the prompt closes it and the reply is text; a forced tool is a tool_use
    block whose input the schema admits."""
    base = {"model": "m", "max_tokens": 8, "messages": CHAT, "temperature": 0}
    on = post(server, "/v1/messages", base)
    assert [b["type"] for b in on["content"]] == ["thinking"], on
    off = post(server, "/v1/messages", {**base, "thinking": {"type": "disabled"}})
    assert [b["type"] for b in off["content"]] == ["text"], off
    tool = {"name": "lookup", "description": "Looks a word up.", "input_schema": LOOKUP["function"]["parameters"]}
    called = post(server, "/v1/messages", {**base, "max_tokens": 80, "thinking": {"type": "disabled"},
                                           "tools": [tool], "tool_choice": {"type": "tool", "name": "lookup"}})
    use = [b for b in called["content"] if b["type"] == "tool_use"]
    assert called["stop_reason"] == "tool_use" and use and use[0]["name"] == "lookup", called
    jsonschema.validate(use[0]["input"], tool["input_schema"])


def test_responses_think_by_default_and_call_in_the_framing(server):
    base = {"model": "m", "input": "Why is the sky blue?", "max_output_tokens": 8, "temperature": 0}
    on = post(server, "/v1/responses", base)
    assert [i["type"] for i in on["output"]] == ["reasoning"], on
    fn = {"type": "function", "name": "lookup", "description": "Looks a word up.",
          "parameters": LOOKUP["function"]["parameters"]}
    called = post(server, "/v1/responses", {**base, "max_output_tokens": 120, "tools": [fn], "tool_choice": "required"})
    calls = [i for i in called["output"] if i["type"] == "function_call"]
    assert calls and calls[0]["name"] == "lookup", called
    jsonschema.validate(json.loads(calls[0]["arguments"]), fn["parameters"])


def test_ollama_chat_thinks_by_default_and_reads_a_call_in_the_framing(server):
    """Ollama's `think` switches the template's thinking; a call the model
    writes in the template's XML framing (held to it here by a grammar,
    ember's extension) comes back in `tool_calls`."""
    base = {"model": "m", "messages": CHAT, "stream": False, "options": {"num_predict": 8, "temperature": 0}}
    on = post(server, "/api/chat", base)["message"]
    assert on.get("thinking") and not on["content"], on
    off = post(server, "/api/chat", {**base, "think": False})["message"]
    assert off["content"] and not off.get("thinking"), off
    call = r'root ::= "<tool_call>\n<function=lookup>\n<parameter=q>\nsky\n</parameter>\n</function>\n</tool_call>"'
    got = post(server, "/api/chat", {**base, "think": False, "tools": [LOOKUP], "grammar": call,
                                     "options": {"num_predict": 60, "temperature": 0}})["message"]
    assert got["tool_calls"][0]["function"] == {"index": 0, "name": "lookup", "arguments": {"q": "sky"}}, got
