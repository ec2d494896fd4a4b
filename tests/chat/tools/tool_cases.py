"""What the tests of the tool calls (tests/chat/tools/) share: the tools a
request declares, SmolLM2's own template, and a whole output parsed into
content and (name, arguments) pairs, with call ids counted up from id0."""

from __future__ import annotations

import itertools
import json

from ember.chat import tools as tc
from paths import FIXTURES

SMOLLM2_TEMPLATE = (FIXTURES / "smollm2-135m-instruct.chat_template.jinja").read_text(encoding="utf-8")

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
        }, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "write_file", "description": "Writes a file.",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string"}, "content": {"type": "string"}, "meta": {"type": "object"},
        }, "required": ["path", "content"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
]


def counter_ids():
    n = itertools.count()
    return lambda: f"id{next(n)}"


def parse(framing, text, reason="stop", tools=TOOLS):
    content, calls = tc.parse_tool_calls(framing, text, tools=tools, finish_reason=reason, ids=counter_ids())
    return content, [(c.name, json.loads(c.arguments)) for c in calls]
