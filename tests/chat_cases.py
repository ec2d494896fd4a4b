"""What the chat core's tests in several files share (tests/chat/, and
test_model.py's `Model.chat` against the chat route, the families' templates
through the server): a question that wants a tool, and tools."""

CHAT = [{"role": "user", "content": "What is the weather in Lyon?"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                   "required": ["city"], "additionalProperties": False}}}
#: A tool whose argument is short enough for a tiny model's forced call.
LOOKUP = {"type": "function", "function": {
    "name": "lookup", "description": "Looks a word up.",
    "parameters": {"type": "object", "properties": {"q": {"type": "string", "maxLength": 8}},
                   "required": ["q"], "additionalProperties": False}}}
