"""What the chat core's tests in several files share (tests/chat/, and
test_model.py's `Model.chat` against the chat route): a question that wants a
tool, and the tool."""

CHAT = [{"role": "user", "content": "What is the weather in Lyon?"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                   "required": ["city"], "additionalProperties": False}}}
