"""How a chat route names the field an error is about (`ember.server.chat_prompt`):
a path into the chat request mapped to the client's own request, for APIs
whose messages came from blocks or items, without any server process."""

from ember.chat import ChatError
from ember.server.chat_prompt import Origin, located, message_locator
from ember.server.errors import ApiError

# A conversation as Anthropic's blocks became chat messages: the system
# prompt first, then a user turn's tool result (block 1 of message 0), then
# an assistant turn whose calls were blocks 0 and 2 of message 1.
ORIGINS = [Origin(("system",)), Origin(("messages", 0, "content", 1), id_field="tool_use_id"),
           Origin(("messages", 1), calls=[("messages", 1, "content", 0), ("messages", 1, "content", 2)],
                  args_field=("input",))]


def renamed(loc):
    return ("stop_sequences", *loc[1:]) if loc[:1] == ("stop",) else loc


LOCATE = message_locator(ORIGINS, renamed)


def test_a_chat_message_path_goes_back_to_the_block_it_came_from():
    assert LOCATE(("messages", 0, "content")) == ("system", "content")
    assert LOCATE(("messages", 1, "tool_call_id")) == ("messages", 0, "content", 1, "tool_use_id")
    assert LOCATE(("messages", 2, "tool_calls", 1, "function", "arguments")) == ("messages", 1, "content", 2, "input")
    assert LOCATE(("messages", 2, "tool_calls", 0, "function", "name")) == ("messages", 1, "content", 0, "function",
                                                                            "name")
    assert LOCATE(("messages", 9)) == ("messages", 9)  # no origin: left as it is


def test_other_fields_are_renamed_by_the_api():
    assert LOCATE(("stop",)) == ("stop_sequences",) and LOCATE(("tools", 0)) == ("tools", 0)


def test_a_located_error_names_the_clients_field_in_message_and_param():
    e = located(ChatError("'c9' answers no earlier tool call", ("messages", 1, "tool_call_id")), LOCATE)
    assert e.status == 400 and e.param == "messages[0].content[1].tool_use_id"
    assert e.message == "messages[0].content[1].tool_use_id: 'c9' answers no earlier tool call"
    api = located(ApiError(400, "stop: at most 16 stop strings", param="stop"), LOCATE)
    assert (api.message, api.param) == ("stop_sequences: at most 16 stop strings", "stop_sequences")


def test_without_a_mapping_the_chat_routes_own_names_stay():
    e = located(ChatError("expected a boolean", ("parallel_tool_calls",)), None)
    assert e.message == "parallel_tool_calls: expected a boolean" and e.param == "parallel_tool_calls"
    same = ApiError(400, "temperature: must be >= 0", param="temperature")
    assert located(same, LOCATE) is same
