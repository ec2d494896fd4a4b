"""A request's tool fields (`ember.chat.tools.request`): `tools`,
`tool_choice` and `parallel_tool_calls` validated into a plan, and the tool
history made ready for a template."""

from __future__ import annotations

import pytest

from ember.chat import tools as tc
from ember.errors import InvalidRequestError
from tool_cases import TOOLS


def test_validate_defaults():
    plan = tc.validate_tools(TOOLS)
    assert (plan.choice, plan.name, plan.parallel, plan.parse, plan.forced) == ("auto", None, False, True, False)
    assert tc.validate_tools(TOOLS, None, True).parallel
    assert plan.template_tools == TOOLS
    none = tc.validate_tools(TOOLS, "none", False)
    assert (none.parse, none.template_tools, none.parallel) == (False, None, False)
    empty = tc.validate_tools(None)
    assert (empty.parse, empty.template_tools, empty.tools) == (False, None, ())
    named = tc.validate_tools(TOOLS, {"type": "function", "function": {"name": "get_time"}})
    assert (named.choice, named.name, named.forced) == ("function", "get_time", True)
    assert tc.validate_tools(TOOLS, "required").forced
    bare = tc.validate_tools([{"type": "function", "function": {"name": "ping"}}])
    assert bare.tools[0]["function"]["parameters"] == {"type": "object", "properties": {}}


@pytest.mark.parametrize("tools,choice,parallel,message", [
    (TOOLS, {"type": "function", "function": {"name": "nope"}}, None, "tool_choice: the tool 'nope' is not among"),
    (None, "required", None, "tool_choice: a call is required, but no tools are declared"),
    (None, {"type": "function", "function": {"name": "get_time"}}, None, "'get_time' is not among"),
    (TOOLS, "sometimes", None, "tool_choice: unknown value 'sometimes'"),
    (TOOLS, {"type": "function"}, None, "tool_choice: expected"),
    (TOOLS, 3, None, "tool_choice: expected a string or an object"),
    (TOOLS, None, "yes", "parallel_tool_calls: expected a boolean"),
    ({"type": "function"}, None, None, "tools: expected an array"),
    ([{"type": "code_interpreter"}], None, None, "tools[0].type: only \"function\""),
    ([{"type": "function"}], None, None, "tools[0].function: expected an object"),
    ([{"type": "function", "function": {"name": "get weather"}}], None, None, "tools[0].function.name: 'get weather'"),
    ([{"type": "function", "function": {"name": "x" * 65}}], None, None, "is not a valid function name"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}], None, None,
     "tools[0].function.parameters: a function's parameters must be an object schema"),
    ([{"type": "function", "function": {"name": "f", "parameters": []}}], None, None, "expected a JSON schema object"),
    ([TOOLS[0], TOOLS[0]], None, None, "tools[1].function.name: 'get_weather' is declared twice"),
])
def test_validate_errors(tools, choice, parallel, message):
    with pytest.raises(tc.ToolRequestError) as err:
        tc.validate_tools(tools, choice, parallel)
    assert message in str(err.value)
    assert isinstance(err.value, ValueError) and isinstance(err.value, InvalidRequestError)


def test_normalize_tool_messages():
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Lyon"}'}},
            {"id": "call_2", "function": {"name": "get_time", "arguments": ""}},
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"},
        {"role": "tool", "tool_call_id": "call_2", "name": "clock", "content": "noon"},
        {"role": "assistant", "content": "Done.", "tool_calls": []},
    ]
    out = tc.normalize_tool_messages(messages)
    assert out[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Lyon"}
    assert out[1]["content"] == ""
    assert out[1]["tool_calls"][1] == {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": {}}}
    assert out[2]["name"] == "get_weather" and out[3]["name"] == "clock"
    assert "tool_calls" not in out[4]
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Lyon"}'  # the input is untouched


@pytest.mark.parametrize("messages,message", [
    ([{"role": "tool", "tool_call_id": "call_9", "content": "x"}], "messages[0].tool_call_id: 'call_9' answers no earlier tool call"),
    ([{"role": "assistant", "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": "{}"}}]},
      {"role": "tool", "tool_call_id": "b", "content": "x"}], "messages[1].tool_call_id: 'b' answers no earlier"),
    ([{"role": "tool", "content": "x"}], "messages[0].tool_call_id: a tool message needs the id"),
    ([{"role": "assistant", "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": "{oops"}}]}],
     "messages[0].tool_calls[0].function.arguments: not valid JSON"),
    ([{"role": "assistant", "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": "[1]"}}]}],
     "must be a JSON object"),
    ([{"role": "assistant", "tool_calls": [{"id": "a"}]}], "messages[0].tool_calls[0].function: expected an object"),
    ([{"role": "user", "content": "x", "tool_calls": [{"id": "a", "function": {"name": "f"}}]}],
     "only assistant messages carry tool calls"),
])
def test_normalize_tool_messages_errors(messages, message):
    with pytest.raises(tc.ToolRequestError) as err:
        tc.normalize_tool_messages(messages)
    assert message in str(err.value)
    assert isinstance(err.value, ValueError)
