"""The generic framing (`ember.chat.tools.generic`), for templates with no
tool markup of their own: the tools described in the system prompt and the
tool history rewritten, as llama-server does."""

from __future__ import annotations

import json

from ember import chat_template as ct
from ember.chat import tools as tc
from tool_cases import SMOLLM2_TEMPLATE, TOOLS, parse


def test_generic_tools_prompt_and_history():
    prompt = tc.generic_tools_system_prompt(TOOLS)
    for t in TOOLS:
        assert json.dumps(t["function"]) in prompt
    assert '{"tool_calls": [{"name": ' in prompt
    assert "exactly one call" in tc.generic_tools_system_prompt(TOOLS, parallel=False)

    history = tc.normalize_tool_messages([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Lyon and the time?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Lyon"}'}},
            {"id": "c2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "Sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "noon"},
    ])
    out = tc.apply_generic_tools(history, TOOLS)
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    assert out[0]["content"].startswith("Be brief.\n\n") and prompt in out[0]["content"]
    assert out[2]["content"] == 'Checking.\n{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Lyon"}}, ' \
                                '{"name": "get_time", "arguments": {}}]}'
    assert "tool_calls" not in out[2]
    results = [json.loads(line) for line in out[3]["content"].split("\n")]
    assert results == [{"tool_response": {"name": "get_weather", "tool_call_id": "c1", "content": "Sunny"}},
                       {"tool_response": {"name": "get_time", "tool_call_id": "c2", "content": "noon"}}]
    # What the model is shown of its own past calls is what the parser reads.
    assert parse(tc.GENERIC, out[2]["content"]) == ("Checking.", [("get_weather", {"city": "Lyon"}), ("get_time", {})])

    # A template without tool support renders all of it; without a system
    # message one is added in front.
    rendered = ct.render_chat(SMOLLM2_TEMPLATE, tc.apply_generic_tools(history[1:], TOOLS))
    assert rendered.startswith("<|im_start|>system\nYou can call the following tools.")
    assert '{"tool_response": ' in rendered and rendered.endswith("<|im_start|>assistant\n")
    # Without tools only the history is rewritten.
    assert tc.apply_generic_tools(history[1:], None)[0] == history[1]
