"""Where the chat core's refusals point (`ember.chat.errors`): a location
written as a client writes a field, and read back from a message's prefix."""

from __future__ import annotations

from ember.chat.errors import format_location, location


def test_locations_are_written_as_a_client_writes_them():
    assert format_location(("messages", 3, "tool_calls", 0, "function")) == "messages[3].tool_calls[0].function"
    assert format_location(("input", 2)) == "input[2]" and format_location(()) == ""


def test_locations_read_from_a_field_prefix():
    assert location("messages[3].content: expected a string") == ("messages", 3, "content")
    assert location("tool_choice: a forced call cannot ...") == ("tool_choice",)
    assert location("tools[0].function.parameters: the schema") == ("tools", 0, "function", "parameters")
    assert location("the model's tool call is malformed: x") == ()
