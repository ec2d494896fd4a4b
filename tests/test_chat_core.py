"""The chat core (`ember.chat`), free of HTTP: a conversation's prompt with
its tools and call grammars, the reply's text shaped into content, thought
and calls, and what it refuses with where; and `ember.Model.chat`, which
runs it in-process and answers what the chat route answers."""

from __future__ import annotations

import json

import pytest

from ember.chat import AnswerFormat, ChatError, ChatRequest, ChatShaper, build_prompt
from ember.chat.errors import format_location, location
from ember.chat.events import CallArguments, CallStart, End, Stop, TextDelta
from ember.chat.tools import HERMES, ToolCallStream, validate_tools
from ember.model import Completion
from ember.structured import compile_grammar
from server_process import ServerProcess, post_ok
from thinking_model import STEERED, build as build_thinking

CHAT = [{"role": "user", "content": "What is the weather in Lyon?"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                   "required": ["city"], "additionalProperties": False}}}


def test_locations_are_written_as_a_client_writes_them():
    assert format_location(("messages", 3, "tool_calls", 0, "function")) == "messages[3].tool_calls[0].function"
    assert format_location(("input", 2)) == "input[2]" and format_location(()) == ""


def test_locations_read_from_a_field_prefix():
    assert location("messages[3].content: expected a string") == ("messages", 3, "content")
    assert location("tool_choice: a forced call cannot ...") == ("tool_choice",)
    assert location("tools[0].function.parameters: the schema") == ("tools", 0, "function", "parameters")
    assert location("the model's tool call is malformed: x") == ()


def test_the_prompt_presents_the_tools_and_a_forced_call_gets_its_grammar(smollm2):
    p = build_prompt(smollm2, ChatRequest(CHAT, tools=[WEATHER], tool_choice="required"))
    assert "get_weather" in p.text and p.text.endswith("<|im_start|>assistant\n")
    assert p.grammar is not None and p.grammar_trigger is None
    free = build_prompt(smollm2, ChatRequest(CHAT))
    assert "get_weather" not in free.text and free.grammar is None


JSON = AnswerFormat(compile_grammar(json_object=True))


@pytest.mark.parametrize("fields, loc", [
    (dict(tools=[WEATHER], tool_choice="required", answer=JSON), ("tool_choice",)),
    (dict(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}), ("tool_choice",)),
    (dict(tools=[{**WEATHER, "function": {**WEATHER["function"], "parameters": {"type": "object", "properties": {
        "a": {"type": 5}}}}}], tool_choice="required"), ("tools", 0, "function", "parameters")),
    (dict(tools=[WEATHER, WEATHER]), ("tools", 1, "function", "name")),
    (dict(reasoning_effort="extreme"), ("reasoning_effort",)),
])
def test_what_the_core_refuses_is_located_in_the_chat_request(smollm2, fields, loc):
    with pytest.raises(ChatError) as e:
        build_prompt(smollm2, ChatRequest(CHAT, **fields))
    assert e.value.loc == loc and str(e.value) == f"{format_location(loc)}: {e.value.detail}"
    assert e.value.detail and not e.value.detail.startswith(loc[0])


def test_a_tool_result_answering_no_call_is_refused_at_its_message(smollm2):
    msgs = CHAT + [{"role": "tool", "tool_call_id": "call_9", "content": "sunny"}]
    with pytest.raises(ChatError) as e:
        build_prompt(smollm2, ChatRequest(msgs, tools=[WEATHER]))
    assert e.value.loc[:2] == ("messages", 1), e.value.loc


def test_the_shaper_splits_a_calls_text_into_its_events():
    plan = validate_tools([WEATHER])
    shaper = ChatShaper(tools=ToolCallStream(HERMES, plan.tools))
    text = 'Let me look. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}}\n</tool_call>'
    events = [e for ch in text for e in shaper.feed(ch)] + shaper.finish(Completion(text=text))
    assert "".join(e.text for e in events if isinstance(e, TextDelta)).strip() == "Let me look."
    starts = [e for e in events if isinstance(e, CallStart)]
    assert [e.name for e in starts] == ["get_weather"]
    assert "".join(e.fragment for e in events if isinstance(e, CallArguments)) == '{"city": "Lyon"}'
    assert events[-1] == End(Stop.TOOL_CALLS) and shaper.stop is Stop.TOOL_CALLS
    msg = shaper.message()
    call = msg["tool_calls"][0]["function"]
    assert call["name"] == "get_weather" and json.loads(call["arguments"]) == {"city": "Lyon"}


@pytest.mark.parametrize("completion, stop", [
    (Completion(text="", finish_reason="stop"), Stop.END_TURN),
    (Completion(text="", finish_reason="stop", stop_string="##"), Stop.STOP_SEQUENCE),
    (Completion(text="", finish_reason="length"), Stop.LENGTH),
    (Completion(text="", finish_reason="context"), Stop.CONTEXT),
])
def test_the_reply_ends_with_why(completion, stop):
    shaper = ChatShaper()
    end = shaper.read_whole(completion)[-1]
    assert end == End(stop, completion.stop_string) and end.stop.cut == (stop in (Stop.LENGTH, Stop.CONTEXT))


def test_a_cut_is_said_before_a_call():
    """A call the token limit or a stop string cut short may be incomplete:
    the reply ends as cut, not as calls for the client to run."""
    plan = validate_tools([WEATHER])
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Ly'
    for c, stop in [(Completion(text=text, finish_reason="length"), Stop.LENGTH),
                    (Completion(text=text, finish_reason="stop", stop_string="on"), Stop.STOP_SEQUENCE)]:
        shaper = ChatShaper(tools=ToolCallStream(HERMES, plan.tools))
        assert shaper.read_whole(c)[-1].stop is stop and shaper.called


def route(server, body: dict) -> dict:
    return post_ok(server, "/v1/chat/completions", body)["choices"][0]["message"]


def test_model_chat_thinks_as_the_chat_route_does(tmp_path):
    """The thinking test model (its template opens the thought), steered
    through a thought and an answer by a grammar: in-process and over the
    chat route, the same thought and the same answer, whole and streamed."""
    from ember import Model

    path = build_thinking(tmp_path / "thinking.gguf")
    model = Model(str(path), n_ctx=512)
    mine = model.chat(CHAT, 40, grammar=STEERED, temperature=0)
    streamed = list(model.chat(CHAT, 40, grammar=STEERED, temperature=0, stream=True))
    with ServerProcess(path) as s:
        theirs = route(s, {"messages": CHAT, "grammar": STEERED, "max_tokens": 40, "temperature": 0})
    assert mine["reasoning_content"] and mine["content"].startswith("The answer")
    assert (mine["reasoning_content"], mine["content"]) == (theirs["reasoning_content"], theirs["content"])
    assert "".join(d.get("reasoning_content", "") for d in streamed) == mine["reasoning_content"]
    assert "".join(d.get("content", "") for d in streamed) == mine["content"]


def test_model_chat_makes_a_forced_call_as_the_chat_route_does(smollm2, smollm2_path):
    mine = smollm2.chat(CHAT, 60, tools=[WEATHER], tool_choice="required", temperature=0)
    with ServerProcess(smollm2_path) as s:
        theirs = route(s, {"messages": CHAT, "tools": [WEATHER], "tool_choice": "required", "max_tokens": 60,
                           "temperature": 0})
    strip = lambda calls: [(c["type"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]
    assert mine["tool_calls"] and strip(mine["tool_calls"]) == strip(theirs["tool_calls"])
    assert mine["content"] == theirs["content"]
