"""OpenAI's Responses API over the engine: `POST /v1/responses`, whole or
streamed as its typed events.

The request's `input` (a string, or items: messages, earlier function calls
and their outputs, earlier reasoning) and `instructions` become the chat
conversation the chat route builds; `tools` (flat function tools),
`tool_choice`, `text.format` and `reasoning.effort` map onto that route's
fields, so the same template, grammars and reply shaper serve it. The reply
is output items in the order the model wrote them: a `reasoning` item, a
`message` with one `output_text` part, then one `function_call` per call.

What it answers is stored (`ember.server.response_store`, unless `store` is
false): `previous_response_id` continues a stored conversation (its prompt
renders as before, so the slot's cache reuses what it read), `GET` and
`DELETE /v1/responses/{id}` read and drop one, `.../input_items` lists what
it was asked, and `background: true` answers at once with a queued response
to poll, or to stop with `POST .../cancel`."""

from __future__ import annotations

import asyncio
import copy
import time
import uuid
from typing import Any, Union

import msgspec
from aiohttp import web

from ember.chat.events import CallStart
from ember.chat.output import ChatShaper
from ember.chat.request import AnswerFormat, ChatRequest
from ember.model import Completion, Piece, PromptProgress
from ember.sampling import SamplingParams
from ember.server import wire
from ember.server.chat_prompt import Origin, chat_prompt, located, message_locator
from ember.server.errors import ApiError
from ember.server.generation import Generation
from ember.server.http import json_response, read_body, reads, sse_send
from ember.server.protocols.llama_server import progress_body
from ember.server.response_store import Stored, as_message
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
    verbosity: Any = None


class ReasoningConfig(msgspec.Struct, forbid_unknown_fields=False):
    effort: str | None = None


class ResponsesRequest(wire.CoreSampling):
    # Items without a `type` are messages (the API's "easy" form): typed before decoding.
    input: Union[str, list[dict[str, Any]], None] = None
    instructions: str | None = None
    model: str | None = None
    max_output_tokens: int | None = None
    # llama-server's, which reads a responses body as its chat route reads one: n_predict (before
    # max_output_tokens) and stop strings
    n_predict: int | None = None
    stop: Union[str, list[str], None] = None
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
    #: None: stored when the server keeps a store (OpenAI's default, true)
    store: bool | None = None
    # llama-server's, in a stream: `timings` on each text delta and on the last event, and the
    # prompt's reading reported in response.in_progress events
    timings_per_token: bool = False
    return_progress: bool = False
    # Read so that a request setting them is refused by name (`_refuse_unserved`).
    include: Any = None
    conversation: Any = None
    prompt: Any = None


#: What `include` may ask for with nothing to add here: a reasoning item carries its text as it
#: is, and the others belong to hosted tools and image inputs, which are refused where they appear.
_INCLUDED = {"reasoning.encrypted_content", "web_search_call.results", "web_search_call.action.sources",
             "file_search_call.results", "code_interpreter_call.outputs", "computer_call_output.output.image_url",
             "message.input_image.image_url"}


def _refuse_unserved(req: ResponsesRequest) -> None:
    """OpenAI's fields for what this server does not do, refused rather than
    answered as if they were absent."""
    if req.conversation is not None:
        raise ApiError(400, "conversation: this server keeps no conversation objects; chain responses with "
                       "previous_response_id", param="conversation")
    if req.prompt is not None:
        raise ApiError(400, "prompt: this server keeps no prompt templates; send the instructions and input",
                       param="prompt")
    if req.include is not None:
        if not isinstance(req.include, list) or not all(isinstance(x, str) for x in req.include):
            raise ApiError(400, "include: expected a list of strings", param="include")
        for i, x in enumerate(req.include):
            if x == "message.output_text.logprobs":
                raise ApiError(400, f"include[{i}]: log-probabilities are not returned on this route; use chat "
                               "completions", param=f"include[{i}]")
            if x not in _INCLUDED:
                raise ApiError(400, f"include[{i}]: expected one of {', '.join(sorted(_INCLUDED))} or "
                               f"message.output_text.logprobs, got {x!r}", param=f"include[{i}]")
    if req.text is not None and req.text.verbosity not in (None, "medium"):
        raise ApiError(400, "text.verbosity: this server does not steer an answer's length (medium only); "
                       "max_output_tokens bounds it", param="text.verbosity")


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


def _chat_messages(req: ResponsesRequest, earlier: list[dict],
                   resolve) -> tuple[list[dict], list[Origin]]:
    """The conversation as the chat template reads it, and where each of its
    messages came from: the instructions, the `earlier` turns of a stored
    conversation, then the input. What one assistant turn wrote (its
    reasoning, its message, its calls) arrives as separate items and becomes
    one assistant message again; `resolve(i, id)` is the stored item an
    `item_reference` names."""
    out: list[dict] = []
    origins: list[Origin] = []
    if req.instructions:
        out.append({"role": "system", "content": req.instructions})
        origins.append(Origin(("instructions",)))
    for m in earlier:
        out.append(copy.deepcopy(m))
        origins.append(Origin(("previous_response_id",)))
    if req.input is None:
        raise ApiError(400, "input: required", param="input")
    if req.input == "":
        raise ApiError(400, "input: empty; a response answers an input", param="input")
    if isinstance(req.input, str):
        return out + [{"role": "user", "content": req.input}], origins + [Origin(("input",))]
    items = _items([resolve(i, x["id"]) if isinstance(x, dict) and x.get("type") == "item_reference" else x
                    for i, x in enumerate(req.input)])
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
            raise ApiError(400, f"{where}.type: an item reference is read before the conversation is built; this "
                           "one names no stored item", param=f"{where}.type")
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
            if t.strict is not None:
                fn["strict"] = t.strict
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


async def _prompt(state: ServerState, req: ResponsesRequest, owner: int
                  ) -> tuple[list[int], ChatShaper, SamplingParams, list[dict]]:
    """The prompt, its shaper and options, and the conversation it renders
    (without the instructions: what a reply chained to this one continues)."""
    store = state.responses
    earlier: list[dict] = []
    if req.previous_response_id is not None:
        before = store.get(req.previous_response_id, owner, param="previous_response_id")
        if not before.finished:
            raise ApiError(400, f"previous_response_id: {before.id} is still {before.response['status']}; chain "
                           "to it once it has finished", param="previous_response_id")
        earlier = before.conversation

    def resolve(i: int, item_id) -> dict:
        found = store.item(item_id, owner) if isinstance(item_id, str) else None
        if found is None:
            raise ApiError(400, f"input[{i}].id: no stored item {item_id!r} (items are kept with their responses)",
                           param=f"input[{i}].id")
        return found

    _refuse_unserved(req)
    if req.top_logprobs:
        raise ApiError(400, "top_logprobs: log-probabilities are not returned on this route; use chat completions",
                       param="top_logprobs")
    if req.truncation not in (None, "disabled"):
        raise ApiError(400, f"truncation: only \"disabled\" (a conversation longer than the context is refused, "
                       f"not cut), got {req.truncation!r}", param="truncation")
    if req.temperature is not None and req.temperature > 2:
        raise ApiError(400, f"temperature: must be between 0 and 2, got {req.temperature}", param="temperature")
    messages, origins = _chat_messages(req, earlier, resolve)
    tools, tool_choice = _tools(req)
    chat = ChatRequest(messages=messages, tools=tools, tool_choice=tool_choice,
                       parallel_tool_calls=True if req.parallel_tool_calls is None else req.parallel_tool_calls,
                       answer=_answer(req), reasoning_effort=req.reasoning.effort if req.reasoning else None)
    try:
        params = wire.sampling_options(wire.Sampling(**req.sampling(), stop=req.stop), state.model.n_vocab,
                                       state.opts.sampling,
                                       wire.text_tokens(state.model))
    except ApiError as e:
        raise located(e, _fields) from None
    prompt, shaper = await chat_prompt(state, chat, params, locate=message_locator(origins, _fields))
    return prompt, shaper, params, messages[1:] if req.instructions else messages


def _input_items(req: ResponsesRequest) -> list[dict]:
    """The request's input as the items GET .../input_items lists, each with an id."""
    if isinstance(req.input, str):
        return [{"id": f"msg_{_hex()}", "type": "message", "role": "user", "status": "completed",
                 "content": [{"type": "input_text", "text": req.input}]}]
    out = []
    for raw in req.input or []:
        it = {"type": "message", **raw} if "type" not in raw else dict(raw)
        if it["type"] == "message" and isinstance(it.get("content"), str):
            kind = "output_text" if it.get("role") == "assistant" else "input_text"
            it["content"] = [{"type": kind, "text": it["content"]}]
        it.setdefault("id", f"{'msg' if it['type'] == 'message' else 'item'}_{_hex()}")
        out.append(it)
    return out


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
    store = state.responses
    keep = store.enabled if req.store is None else req.store
    if keep and not store.enabled:
        raise ApiError(400, "store: this server keeps no responses (--responses-max 0)", param="store")
    if req.background and not keep:
        raise ApiError(400, "background: a background response is polled from the store, so it needs store",
                       param="background")
    if req.background and req.stream:
        raise ApiError(400, "background: not with stream here; poll GET /v1/responses/{id} instead",
                       param="background")
    owner = request.get("owner", 0)
    max_tokens = wire.max_tokens(*wire.first_set(req, "n_predict", "max_output_tokens"), state.opts.n_predict)
    prompt, shaper, params, conversation = await _prompt(state, req, owner)
    gen = Generation(request, prompt, max_tokens, params, watch_client=not req.background,
                     progress=req.stream and req.return_progress)
    created = int(time.time())
    head = {
        "id": f"resp_{_hex()}", "object": "response", "created_at": created, "model": state.model_id(),
        "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
        "parallel_tool_calls": True if req.parallel_tool_calls is None else req.parallel_tool_calls,
        "temperature": req.temperature, "top_p": req.top_p, "tool_choice": req.tool_choice or "auto",
        "tools": [msgspec.to_builtins(t) for t in req.tools or []], "metadata": req.metadata or {},
        "text": {"format": msgspec.to_builtins(req.text.format) if req.text and req.text.format else {"type": "text"}},
        "reasoning": {"effort": req.reasoning.effort if req.reasoning else None, "summary": None},
        "store": keep, "background": req.background, "error": None,
        "previous_response_id": req.previous_response_id,
    }
    items = _Items()
    entry = Stored(id=head["id"], response={}, input_items=_input_items(req), owner=owner) if keep else None

    def finished(c: Completion) -> tuple[str, dict]:
        """The event that ends the response, and the response it carries
        (stored, when it is kept)."""
        cut = shaper.stop.cut
        # The thought's tokens, counted as the tokenizer reads its text back.
        thought = "".join(shaper.thought or [])
        n_thought = len(state.model.tokenize(thought, add_special=False)) if thought else 0
        body = {**head, "status": "incomplete" if cut else "completed", "completed_at": int(time.time()),
                "incomplete_details": {"reason": "max_output_tokens"} if cut else None, "output": items.items,
                "usage": _usage(gen, c.n_cached, len(c.tokens), min(n_thought, len(c.tokens)))}
        if entry is not None:
            entry.response, entry.task = copy.deepcopy(body), None
            entry.conversation = [*conversation, as_message(items.items)]
            try:
                store.put(entry)
            except ApiError as e:
                # The answer is the client's all the same; it says it was not kept.
                body["store"] = False
                state.log(f"response {entry.id} answered but not stored: {e.message}")
        return ("response.incomplete" if cut else "response.completed"), {"response": body}

    def item_status() -> str:
        return "incomplete" if shaper.stop.cut else "completed"

    async def answer_whole() -> dict:
        c = await gen.whole()
        items.feed(shaper.read_whole(c))
        items.close(item_status())
        return finished(c)[1]["response"]

    if req.background:
        entry.response = {**head, "status": "queued", "output": [], "incomplete_details": None, "usage": None}
        store.put(entry)
        entry.task = asyncio.get_running_loop().create_task(_in_background(entry, answer_whole))
        return json_response(entry.response)
    if not req.stream:
        return json_response(await answer_whole())

    async def write(resp) -> None:
        seq = 0

        async def send(events) -> None:
            nonlocal seq
            for kind, data in events:
                if req.timings_per_token and kind in ("response.output_text.delta", "response.completed",
                                                      "response.incomplete"):
                    data = {**data, "timings": gen.timings()}
                await sse_send(resp, {"type": kind, "sequence_number": seq, **data}, event=kind)
                seq += 1

        start = {**head, "status": "in_progress", "output": [], "incomplete_details": None, "usage": None}
        await send([("response.created", {"response": start}), ("response.in_progress", {"response": start})])
        async for ev in gen.events():
            if isinstance(ev, PromptProgress):
                await send([("response.in_progress", {"response": start, "prompt_progress": progress_body(ev)})])
            elif isinstance(ev, Piece):
                await send(items.feed(shaper.feed(ev.text)))
            elif isinstance(ev, Completion):
                await send(items.feed(shaper.finish(ev)))
                await send(items.close(item_status()))
                await send([finished(ev)])
    return await gen.stream(request, write)


@reads(ResponsesRequest)
async def input_tokens(request: web.Request) -> web.Response:
    """OpenAI's token count of a Responses request: the prompt it would read,
    the chained conversation and the instructions included."""
    state: ServerState = request.app["state"]
    req = wire.decode(await read_body(request), ResponsesRequest)
    prompt, *_ = await _prompt(state, req, request.get("owner", 0))
    return json_response({"object": "response.input_tokens", "input_tokens": len(prompt)})


async def _in_background(entry: Stored, answer_whole) -> None:
    """A background response's run: its stored state follows it, from queued
    to its end (completed, incomplete, cancelled or failed)."""
    entry.response["status"] = "in_progress"
    try:
        await answer_whole()
    except asyncio.CancelledError:
        entry.response.update(status="cancelled", completed_at=int(time.time()))
    except Exception as e:  # the engine's refusal or a cut: the response says so, the server goes on
        message = e.message if isinstance(e, ApiError) else str(e) or type(e).__name__
        entry.response.update(status="failed", completed_at=int(time.time()),
                              error={"code": "server_error", "message": message})
    finally:
        entry.task = None
        entry.measure()


async def get_response(request: web.Request) -> web.Response:
    state: ServerState = request.app["state"]
    if request.query.get("stream", "false").lower() not in ("false", "0"):
        raise ApiError(400, "stream: a stored response is read whole here", param="stream")
    return json_response(state.responses.get(request.match_info["id"], request.get("owner", 0)).response)


async def delete_response(request: web.Request) -> web.Response:
    state: ServerState = request.app["state"]
    entry = state.responses.delete(request.match_info["id"], request.get("owner", 0))
    return json_response({"id": entry.id, "object": "response", "deleted": True})


async def cancel_response(request: web.Request) -> web.Response:
    state: ServerState = request.app["state"]
    entry = state.responses.get(request.match_info["id"], request.get("owner", 0))
    if not entry.response.get("background"):
        raise ApiError(400, f"{entry.id} was not a background response; only those can be cancelled",
                       param="response_id")
    task = entry.task
    if task is not None and not task.done():
        task.cancel()
        await asyncio.wait([task])
    elif entry.response["status"] != "cancelled":
        raise ApiError(400, f"{entry.id} has already {entry.response['status']}; only a running one can be "
                       "cancelled", param="response_id")
    return json_response(entry.response)


async def input_items(request: web.Request) -> web.Response:
    """The stored request's input items, as OpenAI lists them (newest first
    by default; `order`, `limit`, `after`)."""
    state: ServerState = request.app["state"]
    entry = state.responses.get(request.match_info["id"], request.get("owner", 0))
    q = request.query
    order = q.get("order", "desc")
    if order not in ("asc", "desc"):
        raise ApiError(400, f"order: expected asc or desc, got {order!r}", param="order")
    try:
        limit = int(q.get("limit", "20"))
    except ValueError:
        raise ApiError(400, f"limit: expected a whole number, got {q.get('limit')!r}", param="limit") from None
    if not 1 <= limit <= 100:
        raise ApiError(400, f"limit: must be between 1 and 100, got {limit}", param="limit")
    rows = entry.input_items if order == "asc" else entry.input_items[::-1]
    if "after" in q:
        at = next((k for k, it in enumerate(rows) if it.get("id") == q["after"]), None)
        if at is None:
            raise ApiError(400, f"after: no input item {q['after']!r} in {entry.id}", param="after")
        rows = rows[at + 1:]
    page = rows[:limit]
    return json_response({"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                          "last_id": page[-1]["id"] if page else None, "has_more": len(rows) > limit})


def add_routes(app: web.Application) -> None:
    for prefix in ("/v1", ""):
        app.router.add_post(f"{prefix}/responses", responses)
        app.router.add_post(f"{prefix}/responses/input_tokens", input_tokens)
        app.router.add_get(f"{prefix}/responses/{{id}}", get_response)
        app.router.add_delete(f"{prefix}/responses/{{id}}", delete_response)
        app.router.add_post(f"{prefix}/responses/{{id}}/cancel", cancel_response)
        app.router.add_get(f"{prefix}/responses/{{id}}/input_items", input_items)
