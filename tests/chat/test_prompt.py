"""A conversation's prompt as the chat core builds it (`ember.chat.prompt`,
from `ember.chat.request`'s ChatRequest), free of HTTP: its tools and call
grammars, and what it refuses with where."""

from __future__ import annotations

from pathlib import Path

import pytest

from chat_cases import CHAT, WEATHER
from ember.chat import AnswerFormat, ChatError, ChatRequest, build_prompt
from ember.chat.errors import format_location
from ember.structured import compile_grammar


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


QWEN35 = (Path(__file__).parents[1] / "fixtures" / "Qwen3.5-4B.chat_template.jinja").read_text(encoding="utf-8")
STRICT = {**WEATHER, "function": {**WEATHER["function"], "strict": True}}


def test_a_strict_tool_is_served_only_where_its_calls_are_held_to_its_schema(smollm2):
    """`strict` promises calls that fit the schema: served where a grammar
    holds them (a forced call, or a template whose calls open with a tag to
    watch for), refused where a call would be free text."""
    watched = build_prompt(smollm2, ChatRequest(CHAT, tools=[STRICT]), template=QWEN35)
    assert watched.grammar is not None and watched.grammar_trigger
    assert build_prompt(smollm2, ChatRequest(CHAT, tools=[STRICT], tool_choice="required")).grammar is not None
    build_prompt(smollm2, ChatRequest(CHAT, tools=[STRICT], tool_choice="none"))  # no call: nothing to hold
    # Qwen3.5 writes a call's values as raw text, which a format cannot be held to.
    unholdable = {**STRICT, "function": {**STRICT["function"], "parameters": {"type": "object", "properties": {
        "day": {"type": "string", "format": "date"}}}}}
    for fields, template, loc in [
        (dict(tools=[STRICT]), None, ("tools", 0, "function", "strict")),  # SmolLM2's calls open bare
        (dict(tools=[{**WEATHER, "function": {**WEATHER["function"], "name": "w"}}, STRICT], answer=JSON), QWEN35,
         ("tools", 1, "function", "strict")),
        (dict(tools=[unholdable]), QWEN35, ("tools",)),
    ]:
        with pytest.raises(ChatError) as e:
            build_prompt(smollm2, ChatRequest(CHAT, **fields), template=template)
        assert e.value.loc == loc, e.value


@pytest.mark.parametrize("template", [None, QWEN35], ids=["calls opening bare", "calls watched"])
def test_a_malformed_tool_schema_is_refused_even_where_calls_go_unwatched(smollm2, template):
    """A schema that is not JSON Schema is a 400 at the tool's parameters
    whether or not its calls would be held to it; one merely outside the
    subset leaves the calls unwatched (unless the tool is strict)."""
    for bad in ({"type": 5}, {"$ref": "#/nope"}, {"type": "integer", "minimum": "three"}):
        tool = {**WEATHER, "function": {**WEATHER["function"], "parameters": {"type": "object", "properties": {
            "a": bad}}}}
        with pytest.raises(ChatError) as e:
            build_prompt(smollm2, ChatRequest(CHAT, tools=[tool]), template=template)
        assert e.value.loc == ("tools", 0, "function", "parameters"), e.value
    outside = {**WEATHER, "function": {**WEATHER["function"], "parameters": {"type": "object", "properties": {
        "a": {"type": "string", "not": {"const": "x"}}}}}}
    p = build_prompt(smollm2, ChatRequest(CHAT, tools=[outside]), template=template)
    assert p.grammar is None


# A template that writes the effort it is given, as gpt-oss's does ("Reasoning: medium" by default).
EFFORT_TEMPLATE = ("{%- for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor -%}"
                   "Reasoning: {{ reasoning_effort | default('medium') }} thinking={{ enable_thinking }}")


@pytest.mark.parametrize("fields, shown", [
    ({}, "Reasoning: medium thinking=True"),
    ({"reasoning_effort": "high"}, "Reasoning: high thinking=True"),
    ({"reasoning_effort": "high", "chat_template_kwargs": {"reasoning_effort": "low"}},
     "Reasoning: high thinking=True"),
    ({"chat_template_kwargs": {"reasoning_effort": "low"}}, "Reasoning: low thinking=True"),
    ({"reasoning_effort": "none", "chat_template_kwargs": {"reasoning_effort": "low"}},
     "Reasoning: medium thinking=False"),
])
def test_the_effort_reaches_the_template_as_llama_server_gives_it(smollm2, fields, shown):
    p = build_prompt(smollm2, ChatRequest(CHAT, **fields), template=EFFORT_TEMPLATE)
    assert p.text.endswith(shown), p.text


THINK = ("{%- for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor -%}"
         "{%- if add_generation_prompt %}<think>\n{% endif %}")


def test_a_budget_message_is_written_before_the_forced_close(smollm2):
    plain = build_prompt(smollm2, ChatRequest(CHAT, reasoning_budget=4), template=THINK).thought_budget
    said = build_prompt(smollm2, ChatRequest(CHAT, reasoning_budget=4, reasoning_budget_message=" Time is up."),
                        template=THINK).thought_budget
    message = smollm2.tokenize(" Time is up.", add_special=False, parse_special=True)
    assert said.close_ids == tuple(message) + plain.close_ids and said.tokens == plain.tokens == 4
    # Budget 0 with a message: the message is written as the thought's last words, so the close is
    # forced at the first draw rather than written into the prompt.
    zero = build_prompt(smollm2, ChatRequest(CHAT, reasoning_budget=0, reasoning_budget_message="Done."),
                        template=THINK)
    assert zero.text.endswith("<think>\n") and zero.thought_budget.tokens == 0
    assert build_prompt(smollm2, ChatRequest(CHAT, reasoning_budget=0), template=THINK).thought_budget is None
    with pytest.raises(ChatError) as e:
        build_prompt(smollm2, ChatRequest(CHAT, reasoning_budget=4, reasoning_budget_message="word " * 80),
                     template=THINK)
    assert e.value.loc == ("reasoning_budget_message",) and "at most 64" in e.value.detail
    with pytest.raises(ChatError) as e:
        build_prompt(smollm2, ChatRequest(CHAT, reasoning_budget=4, reasoning_budget_message=5), template=THINK)
    assert e.value.loc == ("reasoning_budget_message",)
