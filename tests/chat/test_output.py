"""The reply's text shaped into the chat core's events (`ember.chat.output`'s
ChatShaper, `ember.chat.events`), free of HTTP: content, thought and calls,
and why the reply ended."""

from __future__ import annotations

import json

import pytest

from chat_cases import WEATHER
from ember.chat import ChatShaper
from ember.chat.events import CallArguments, CallStart, End, Stop, TextDelta
from ember.chat.tools import HERMES, ToolCallStream, validate_tools
from ember.model import Completion


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
