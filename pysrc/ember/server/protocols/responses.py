"""OpenAI's Responses API over the engine: `POST /v1/responses`, whole or
streamed as its typed events.

The request's `input` (a string, or items: messages, earlier function calls
and their outputs, earlier reasoning) and `instructions` become the chat
conversation the chat route builds; `tools` (flat function tools),
`tool_choice`, `text.format` and `reasoning.effort` map onto that route's
fields, so the same template, grammars and reply shaper serve it. The reply
is output items in the order the model wrote them: a `reasoning` item, a
`message` with one `output_text` part, then one `function_call` per call.
Responses are not stored: `previous_response_id` is refused, and a client
sends the conversation it holds, which the slot's cache spares it from paying
for twice."""

from __future__ import annotations

import copy
import time
import uuid
from typing import Any, Union

import msgspec
from aiohttp import web

from ember.chat.events import CallStart
from ember.chat.output import ChatShaper
from ember.chat.request import AnswerFormat, ChatRequest
from ember.model import Completion, Piece
from ember.sampling import SamplingParams
from ember.server import wire
from ember.server.chat_prompt import Origin, chat_prompt, located, message_locator
from ember.server.errors import ApiError
from ember.server.generation import Generation
from ember.server.http import json_response, read_body, reads, sse_send
from ember.server.segments import Segments
from ember.server.state import ServerState

__all__ = ["add_routes"]


# -- the request ----------------------------------------------------------------

class _Part(msgspec.Struct, tag_field="type", forbid_unknown_fields=False):
    pass


class InputText(_Part, tag="input_text"):
    text: str


class OutputText(_Part, tag="output_text"):
    text: str


class Refusal(_Part, tag="refusal"):
    refusal: str


class InputImage(_Part, tag="input_image"):
    pass


class InputFile(_Part, tag="input_file"):
    pass


class InputAudio(_Part, tag="input_audio"):
    pass


class ReasoningText(_Part, tag="reasoning_text"):
    text: str


class SummaryText(_Part, tag="summary_text"):
    text: str


Part = Union[InputText, OutputText, Refusal, InputImage, InputFile, InputAudio]


class _Item(msgspec.Struct, tag_field="type", forbid_unknown_fields=False):
    pass


class MessageItem(_Item, tag="message"):
    role: str
    content: Union[str, list[Part]]


class FunctionCallItem(_Item, tag="function_call"):
    call_id: str
    name: str
    arguments: str


class FunctionCallOutputItem(_Item, tag="function_call_output"):
    call_id: str
    output: Union[str, list[Part]]


class ReasoningItem(_Item, tag="reasoning"):
    summary: list[SummaryText] = []
    content: list[ReasoningText] | None = None


class ItemReference(_Item, tag="item_reference"):
    id: str = ""


InputItem = Union[MessageItem, FunctionCallItem, FunctionCallOutputItem, ReasoningItem, ItemReference]


class FunctionTool(msgspec.Struct, forbid_unknown_fields=False):
    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class TextFormat(msgspec.Struct, forbid_unknown_fields=False):
    type: str
    schema: dict[str, Any] | None = None
    name: str | None = None


class TextConfig(msgspec.Struct, forbid_unknown_fields=False):
    format: TextFormat | None = None


class ReasoningConfig(msgspec.Struct, forbid_unknown_fields=False):
    effort: str | None = None


class ResponsesRequest(wire.CoreSampling):
    # Items without a `type` are messages (the API's "easy" form): typed before decoding.
    input: Union[str, list[dict[str, Any]], None] = None
    instructions: str | None = None
    model: str | None = None
    max_output_tokens: int | None = None
    stream: bool = False
    tools: list[FunctionTool] | None = None
    tool_choice: Union[str, dict[str, Any], None] = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    top_logprobs: int | None = None
    background: bool = False
    truncation: str | None = None


def _items(raw: list[dict[str, Any]]) -> list[Any]:
    typed = [{"type": "message", **x} if isinstance(x, dict) and "type" not in x and "role" in x else x for x in raw]
    try:
        return msgspec.convert(typed, list[InputItem])
    except msgspec.ValidationError as e:
        # msgspec says where as `$[i]...`: the client sent it as input[i]...
        msg = str(e)
        where = "input"
        if " - at `$" in msg:
            msg, _, path = msg.partition(" - at `$")
            where = "input" + path.rstrip("`")
        raise ApiError(400, f"{where}: {msg[0].lower() + msg[1:]}", param=where) from None


# -- into the chat request --------------------------------------------------------

def _text(where: str, content, allowed: tuple[type, ...]) -> str:
    if isinstance(content, str):
        return content
    out = []
    for k, p in enumerate(content):
        if not isinstance(p, allowed):
            raise ApiError(400, f"{where}[{k}].type: {p.__struct_config__.tag} parts are not supported here "
                           "(this server reads text only)", param=f"{where}[{k}].type")
        out.append(p.refusal if isinstance(p, Refusal) else p.text)
    return "\n".join(out)  # as llama.cpp joins a message's text parts


def _chat_messages(req: ResponsesRequest) -> tuple[list[dict], list[Origin]]:
    """The conversation as the chat template reads it, and where each of its
    messages came from. What one assistant turn wrote (its reasoning, its
    message, its calls) arrives as separate items and becomes one assistant
    message again."""
    out: list[dict] = []
    origins: list[Origin] = []
    if req.instructions:
        out.append({"role": "system", "content": req.instructions})
        origins.append(Origin(("instructions",)))
    if req.input is None:
        raise ApiError(400, "input: required", param="input")
    if req.input == "":
        raise ApiError(400, "input: empty; a response answers an input", param="input")
    if isinstance(req.input, str):
        return out + [{"role": "user", "content": req.input}], origins + [Origin(("input",))]
    items = _items(req.input)
    if not items:
        raise ApiError(400, "input: at least one item is required", param="input")

    def assistant_turn(at: tuple) -> dict:
        if out and out[-1]["role"] == "assistant":
            return out[-1]
        out.append({"role": "assistant", "content": ""})
        origins.append(Origin(at, args_field=("arguments",)))
        return out[-1]

    for i, it in enumerate(items):
        where, at = f"input[{i}]", ("input", i)
        if isinstance(it, MessageItem):
            if it.role not in ("user", "system", "developer", "assistant"):
                raise ApiError(400, f"{where}.role: expected user, system, developer or assistant, got {it.role!r}",
                               param=f"{where}.role")
            if it.role == "assistant":
                turn = assistant_turn(at)
                turn["content"] += _text(f"{where}.content", it.content, (OutputText, InputText, Refusal))
            else:
                out.append({"role": it.role, "content": _text(f"{where}.content", it.content, (InputText,))})
                origins.append(Origin(at))
        elif isinstance(it, FunctionCallItem):
            turn = assistant_turn(at)
            turn.setdefault("tool_calls", []).append(
                {"id": it.call_id, "type": "function", "function": {"name": it.name, "arguments": it.arguments}})
            origins[-1].calls.append(at)
        elif isinstance(it, FunctionCallOutputItem):
            out.append({"role": "tool", "tool_call_id": it.call_id,
                        "content": _text(f"{where}.output", it.output, (InputText,))})
            origins.append(Origin(at, id_field="call_id"))
        elif isinstance(it, ReasoningItem):
            parts = it.content or it.summary
            turn = assistant_turn(at)
            turn["reasoning_content"] = turn.get("reasoning_content", "") + "".join(p.text for p in parts)
        else:
            raise ApiError(400, f"{where}.type: item references need stored responses, which this server does not "
                           "keep; send the item itself", param=f"{where}.type")
    return out, origins


def _tools(req: ResponsesRequest) -> tuple[list[dict] | None, Any]:
    tools = None
    if req.tools is not None:
        tools = []
        for i, t in enumerate(req.tools):
            if t.type != "function":
                raise ApiError(400, f"tools[{i}].type: {t.type!r} tools are hosted by OpenAI and not run here; "
                               "declare a function tool instead", param=f"tools[{i}].type")
            if t.name is None:
                raise ApiError(400, f"tools[{i}].name: required", param=f"tools[{i}].name")
            fn: dict = {"name": t.name}
            if t.description is not None:
                fn["description"] = t.description
            fn["parameters"] = t.parameters if t.parameters is not None else {"type": "object", "properties": {}}
            tools.append({"type": "function", "function": fn})
    tc = req.tool_choice
    if isinstance(tc, str) and tc not in ("auto", "none", "required"):
        raise ApiError(400, f'tool_choice: expected "auto", "none", "required" or {{"type": "function", "name": ...}}, '
                       f"got {tc!r}", param="tool_choice")
    if isinstance(tc, dict):
        if tc.get("type") != "function" or not isinstance(tc.get("name"), str):
            raise ApiError(400, 'tool_choice: expected "auto", "none", "required" or {"type": "function", "name": ...}',
                           param="tool_choice")
        tc = {"type": "function", "function": {"name": tc["name"]}}
    return tools, tc


def _answer(req: ResponsesRequest) -> AnswerFormat | None:
    fmt = req.text.format if req.text is not None else None
    asked = []
    if fmt is not None and fmt.type != "text":
        if fmt.type == "json_object":
            asked.append(("text.format", {"json_object": True}))
        elif fmt.type == "json_schema":
            if fmt.schema is None:
                raise ApiError(400, "text.format.schema: required for json_schema", param="text.format.schema")
            asked.append(("text.format", {"json_schema": fmt.schema}))
        else:
            raise ApiError(400, f"text.format.type: expected text, json_object or json_schema, got {fmt.type!r}",
                           param="text.format.type")
    return wire.answer_format(asked + wire.extension_answers(req))


def _fields(loc: tuple) -> tuple:
    """The chat request's fields as this API names them."""
    match loc:
        case ("reasoning_effort", *rest):
            return ("reasoning", "effort", *rest)
        case ("tools", int(i), "function", *rest):
            return ("tools", i, *rest)
    return loc


async def _prompt(state: ServerState, req: ResponsesRequest) -> tuple[list[int], ChatShaper, SamplingParams]:
    if req.previous_response_id is not None:
        raise ApiError(400, "previous_response_id: responses are not stored here; send the whole conversation "
                       "in input (the slot's cache reuses what it has already read)", param="previous_response_id")
    if req.top_logprobs:
        raise ApiError(400, "top_logprobs: log-probabilities are not returned on this route; use chat completions",
                       param="top_logprobs")
    if req.background:
        raise ApiError(400, "background: responses are answered within their request here, not stored to poll",
                       param="background")
    if req.truncation not in (None, "disabled"):
        raise ApiError(400, f"truncation: only \"disabled\" (a conversation longer than the context is refused, "
                       f"not cut), got {req.truncation!r}", param="truncation")
    if req.temperature is not None and req.temperature > 2:
        raise ApiError(400, f"temperature: must be between 0 and 2, got {req.temperature}", param="temperature")
    messages, origins = _chat_messages(req)
    tools, tool_choice = _tools(req)
    chat = ChatRequest(messages=messages, tools=tools, tool_choice=tool_choice,
                       parallel_tool_calls=True if req.parallel_tool_calls is None else req.parallel_tool_calls,
                       answer=_answer(req), reasoning_effort=req.reasoning.effort if req.reasoning else None)
    try:
        params = wire.sampling_options(wire.Sampling(**req.sampling()), state.model.n_vocab, state.opts.sampling)
    except ApiError as e:
        raise located(e, _fields) from None
    prompt, shaper = await chat_prompt(state, chat, params, locate=message_locator(origins, _fields))
    return prompt, shaper, params


# -- the reply ----------------------------------------------------------------------

def _hex() -> str:
    return uuid.uuid4().hex


class _Items(Segments):
    """The chat shaper's deltas as output items and the events that build them."""

    def __init__(self) -> None:
        super().__init__()
        self.items: list[dict] = []

    def _index(self) -> int:
        return len(self.items) - 1

    def _item(self, item: dict) -> list[tuple[str, dict]]:
        self.items.append(item)
        out = [("response.output_item.added", {"output_index": self._index(), "item": copy.deepcopy(item)})]
        if item["type"] == "message":
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            item["content"].append(part)
            out.append(("response.content_part.added", {"item_id": item["id"], "output_index": self._index(),
                                                         "content_index": 0, "part": copy.deepcopy(part)}))
        elif item["type"] == "reasoning":
            item["content"].append({"type": "reasoning_text", "text": ""})
        return out

    def start_thought(self):
        return self._item({"id": f"rs_{_hex()}", "type": "reasoning", "summary": [], "content": [],
                           "status": "in_progress"})

    def thought(self, piece: str):
        item = self.items[-1]
        item["content"][0]["text"] += piece
        return [("response.reasoning_text.delta", {"item_id": item["id"], "output_index": self._index(),
                                                   "content_index": 0, "delta": piece})]

    def start_text(self):
        return self._item({"id": f"msg_{_hex()}", "type": "message", "role": "assistant", "status": "in_progress",
                           "content": []})

    def text(self, piece: str):
        item = self.items[-1]
        item["content"][0]["text"] += piece
        return [("response.output_text.delta", {"item_id": item["id"], "output_index": self._index(),
                                                "content_index": 0, "delta": piece, "logprobs": []})]

    def start_call(self, call: CallStart):
        return self._item({"id": f"fc_{_hex()}", "type": "function_call", "call_id": call.id,
                           "name": call.name, "arguments": "", "status": "in_progress"})

    def arguments(self, fragment: str):
        item = self.items[-1]
        item["arguments"] += fragment
        return [("response.function_call_arguments.delta", {"item_id": item["id"], "output_index": self._index(),
                                                            "delta": fragment})]

    def end(self, kind: str, status: str = "completed"):
        item, at = self.items[-1], {"output_index": self._index()}
        item["status"] = status
        out: list[tuple[str, dict]] = []
        if kind == "text":
            part = item["content"][0]
            out.append(("response.output_text.done", {"item_id": item["id"], **at, "content_index": 0,
                                                       "text": part["text"], "logprobs": []}))
            out.append(("response.content_part.done", {"item_id": item["id"], **at, "content_index": 0,
                                                        "part": copy.deepcopy(part)}))
        elif kind == "thought":
            out.append(("response.reasoning_text.done", {"item_id": item["id"], **at, "content_index": 0,
                                                          "text": item["content"][0]["text"]}))
        else:
            out.append(("response.function_call_arguments.done", {"item_id": item["id"], **at, "name": item["name"],
                                                                   "arguments": item["arguments"]}))
        out.append(("response.output_item.done", {**at, "item": copy.deepcopy(item)}))
        return out


def _usage(g: Generation, n_cached: int, n_output: int, n_reasoning: int) -> dict:
    n_input = len(g.prompt)
    return {"input_tokens": n_input, "input_tokens_details": {"cached_tokens": n_cached},
            "output_tokens": n_output, "output_tokens_details": {"reasoning_tokens": n_reasoning},
            "total_tokens": n_input + n_output}


# -- the route ----------------------------------------------------------------------

@reads(ResponsesRequest)
async def responses(request: web.Request) -> web.StreamResponse:
    state: ServerState = request.app["state"]
    req = wire.decode(await read_body(request), ResponsesRequest)
    if req.max_output_tokens is not None and not 1 <= req.max_output_tokens <= wire.MAX_COUNT:
        raise ApiError(400, f"max_output_tokens: must be between 1 and {wire.MAX_COUNT}, got {req.max_output_tokens}",
                       param="max_output_tokens")
    max_tokens = wire.max_tokens("max_output_tokens", req.max_output_tokens, state.opts.n_predict)
    prompt, shaper, params = await _prompt(state, req)
    gen = Generation(request, prompt, max_tokens, params)
    created = int(time.time())
    head = {
        "id": f"resp_{_hex()}", "object": "response", "created_at": created, "model": state.model_id(),
        "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
        "parallel_tool_calls": True if req.parallel_tool_calls is None else req.parallel_tool_calls,
        "temperature": req.temperature, "top_p": req.top_p, "tool_choice": req.tool_choice or "auto",
        "tools": [msgspec.to_builtins(t) for t in req.tools or []], "metadata": req.metadata or {},
        "text": {"format": msgspec.to_builtins(req.text.format) if req.text and req.text.format else {"type": "text"}},
        "reasoning": {"effort": req.reasoning.effort if req.reasoning else None, "summary": None},
        "store": False, "background": False, "error": None, "previous_response_id": None,
    }
    items = _Items()

    def finished(c: Completion) -> tuple[str, dict]:
        """The event that ends the response, and the response it carries."""
        cut = shaper.stop.cut
        # The thought's tokens, counted as the tokenizer reads its text back.
        thought = "".join(shaper.thought or [])
        n_thought = len(state.model.tokenize(thought, add_special=False)) if thought else 0
        body = {**head, "status": "incomplete" if cut else "completed", "completed_at": int(time.time()),
                "incomplete_details": {"reason": "max_output_tokens"} if cut else None, "output": items.items,
                "usage": _usage(gen, c.n_cached, len(c.tokens), min(n_thought, len(c.tokens)))}
        return ("response.incomplete" if cut else "response.completed"), {"response": body}

    def item_status() -> str:
        return "incomplete" if shaper.stop.cut else "completed"

    if not req.stream:
        c = await gen.whole()
        items.feed(shaper.read_whole(c))
        items.close(item_status())
        return json_response(finished(c)[1]["response"])

    async def write(resp) -> None:
        seq = 0

        async def send(events) -> None:
            nonlocal seq
            for kind, data in events:
                await sse_send(resp, {"type": kind, "sequence_number": seq, **data}, event=kind)
                seq += 1

        start = {**head, "status": "in_progress", "output": [], "incomplete_details": None, "usage": None}
        await send([("response.created", {"response": start}), ("response.in_progress", {"response": start})])
        async for ev in gen.events():
            if isinstance(ev, Piece):
                await send(items.feed(shaper.feed(ev.text)))
            elif isinstance(ev, Completion):
                await send(items.feed(shaper.finish(ev)))
                await send(items.close(item_status()))
                await send([finished(ev)])
    return await gen.stream(request, write)


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/responses", responses)
    app.router.add_post("/responses", responses)
