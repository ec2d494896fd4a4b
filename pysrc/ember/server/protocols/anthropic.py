"""Anthropic's Messages API over the engine: `POST /v1/messages`, whole or
streamed as Anthropic's named events, and `POST /v1/messages/count_tokens`.

A request is read and checked in Anthropic's terms (a top-level system
prompt, content blocks, tools with an `input_schema`, `tool_choice` by type,
`thinking`), so an error names the field the client sent. It then becomes the
chat request the OpenAI route builds, through the same template, grammars and
reply shaper, and the reply goes back as content blocks: the thought, the
text, then one `tool_use` block per call, in the order the model wrote them."""

from __future__ import annotations

import json
import uuid
from typing import Any, Union

import msgspec
from aiohttp import web

from ember.chat.events import CallStart, Stop
from ember.chat.output import ChatShaper
from ember.chat.request import AnswerFormat, ChatRequest
from ember.model import Completion, Piece
from ember.sampling import SamplingParams
from ember.server import wire
from ember.server.chat_prompt import Locate, Origin, chat_prompt, located, message_locator
from ember.server.errors import ApiError
from ember.server.generation import Generation
from ember.server.http import Envelope, json_response, read_body, reads, sse_send
from ember.server.segments import Segments
from ember.server.state import ServerState

__all__ = ["ENVELOPES", "add_routes"]

PREFIX = "/v1/messages"

# Anthropic's error types by status (it answers overload with 529; ember keeps
# 503 and its Retry-After, under Anthropic's name for it).
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def error_body(err: ApiError) -> dict:
    kind = _ERROR_TYPES.get(err.status, "api_error" if err.status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": err.message}}


#: Errors on the Messages routes, whole or as a stream's `error` event.
ENVELOPES = {PREFIX: Envelope(error_body, stream_event="error")}


# -- the request, as Anthropic spells it ----------------------------------------

class _Block(msgspec.Struct, tag_field="type", forbid_unknown_fields=False):
    pass


class TextBlock(_Block, tag="text"):
    text: str


class ImageBlock(_Block, tag="image"):
    source: Any = None


class DocumentBlock(_Block, tag="document"):
    source: Any = None


class ThinkingBlock(_Block, tag="thinking"):
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(_Block, tag="redacted_thinking"):
    data: str | None = None


class ToolUseBlock(_Block, tag="tool_use"):
    id: str
    name: str
    input: dict[str, Any] = {}


class ToolResultBlock(_Block, tag="tool_result"):
    tool_use_id: str
    content: Union[str, list[Union[TextBlock, ImageBlock, DocumentBlock]], None] = None
    is_error: bool = False


ContentBlock = Union[TextBlock, ImageBlock, DocumentBlock, ThinkingBlock, RedactedThinkingBlock, ToolUseBlock,
                     ToolResultBlock]


class Message(msgspec.Struct, forbid_unknown_fields=False):
    role: str
    content: Union[str, list[ContentBlock]]


class Tool(msgspec.Struct, forbid_unknown_fields=False):
    name: str
    input_schema: dict[str, Any] | None = None
    description: str | None = None
    # Absent or "custom" for a client's own tool; Anthropic's server tools
    # (web search, code execution...) name a versioned type instead.
    type: str | None = None
    # The structured outputs' promise that calls fit input_schema (refused where none can be held to it)
    strict: bool | None = None


class ToolChoice(msgspec.Struct, forbid_unknown_fields=False):
    type: str
    name: str | None = None
    disable_parallel_tool_use: bool = False


class Thinking(msgspec.Struct, forbid_unknown_fields=False):
    type: str
    budget_tokens: int | None = None
    # "omitted": the thought is written but not shown
    display: str | None = None


class OutputFormat(msgspec.Struct, forbid_unknown_fields=False):
    type: str
    schema: dict[str, Any] | None = None


class OutputConfig(msgspec.Struct, forbid_unknown_fields=False):
    format: OutputFormat | None = None
    effort: str | None = None


class MessagesRequest(wire.CoreSampling):
    """A Messages request; count_tokens reads the same body (its max_tokens
    not required, its sampling fields unread)."""

    messages: list[Message] = []
    model: str | None = None
    system: Union[str, list[TextBlock], None] = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    # The structured outputs' beta spelling of output_config.format, which clients still send
    output_format: OutputFormat | None = None
    # Read so that a request setting them is refused by name (see `_refuse_unserved`)
    mcp_servers: Any = None
    context_management: Any = None
    # llama-server's extension, passed on to the template as on its chat route
    chat_template_kwargs: Any = None
    max_tokens: int | None = None
    stop_sequences: list[str] | None = None
    stream: bool = False


# -- into the chat request every chat route builds ---------------------------------

def _unsupported(where: str, kind: str) -> ApiError:
    return ApiError(400, f"{where}.type: {kind} blocks are not supported (this server reads text only)", param=where)


def _text_of(where: str, parts) -> str:
    if parts is None:
        return ""
    if isinstance(parts, str):
        return parts
    out = []
    for k, p in enumerate(parts):
        if not isinstance(p, TextBlock):
            raise _unsupported(f"{where}[{k}]", p.__struct_config__.tag)
        out.append(p.text)
    return "\n".join(out)


def _chat_messages(req: MessagesRequest) -> tuple[list[dict], list[Origin]]:
    """The conversation as the chat template reads it, and where each of its
    messages came from: the system prompt first, a tool result as a `tool`
    message right after the call it answers, an assistant's thought as its
    `reasoning_content`."""
    out: list[dict] = []
    origins: list[Origin] = []
    if req.system:
        out.append({"role": "system", "content": _text_of("system", req.system)})
        origins.append(Origin(("system",)))
    if not req.messages:
        raise ApiError(400, "messages: at least one message is required", param="messages")
    for i, m in enumerate(req.messages):
        where = f"messages[{i}]"
        if m.role not in ("user", "assistant"):
            hint = " (the system prompt is the top-level system field)" if m.role == "system" else ""
            raise ApiError(400, f"{where}.role: expected \"user\" or \"assistant\", got {m.role!r}{hint}",
                           param=f"{where}.role")
        final_assistant = m.role == "assistant" and i == len(req.messages) - 1
        if not m.content and not final_assistant:
            # As Anthropic's API: only a final assistant turn (a prefill) may be empty.
            raise ApiError(400, f"{where}.content: must be non-empty (only a final assistant message may be empty)",
                           param=f"{where}.content")
        if isinstance(m.content, str):
            out.append({"role": m.role, "content": m.content})
            origins.append(Origin(("messages", i)))
            continue
        texts: list[str] = []
        thought: list[str] = []
        calls: list[dict] = []
        results: list[dict] = []
        call_at: list[tuple] = []
        result_at: list[tuple] = []
        for j, b in enumerate(m.content):
            at = f"{where}.content[{j}]"
            if isinstance(b, TextBlock):
                if not b.text:
                    raise ApiError(400, f"{at}.text: text blocks must be non-empty", param=f"{at}.text")
                texts.append(b.text)
            elif isinstance(b, (ThinkingBlock, RedactedThinkingBlock, ToolUseBlock)) and m.role != "assistant":
                raise ApiError(400, f"{at}.type: a {b.__struct_config__.tag} block belongs to an assistant message",
                               param=f"{at}.type")
            elif isinstance(b, ThinkingBlock):
                thought.append(b.thinking)
            elif isinstance(b, RedactedThinkingBlock):
                pass  # encrypted for Anthropic's own models: nothing a template could show
            elif isinstance(b, ToolUseBlock):
                calls.append({"id": b.id, "type": "function",
                              "function": {"name": b.name, "arguments": json.dumps(b.input, ensure_ascii=False)}})
                call_at.append(("messages", i, "content", j))
            elif isinstance(b, ToolResultBlock):
                if m.role != "user":
                    raise ApiError(400, f"{at}.type: a tool_result block belongs to a user message", param=f"{at}.type")
                text = _text_of(f"{at}.content", b.content)
                # A failed tool's result says so: templates have no field for it.
                results.append({"role": "tool", "tool_call_id": b.tool_use_id,
                                "content": f"Error: {text}" if b.is_error else text})
                result_at.append(("messages", i, "content", j))
            else:
                raise _unsupported(at, b.__struct_config__.tag)
        # The results answer the calls of the message before: they come
        # first, and the user's own words after them.
        out += results
        origins += [Origin(at, id_field="tool_use_id") for at in result_at]
        if texts or calls or thought or not results:
            msg: dict = {"role": m.role, "content": "\n".join(texts)}
            if calls:
                msg["tool_calls"] = calls
            if thought:
                msg["reasoning_content"] = "".join(thought)
            out.append(msg)
            origins.append(Origin(("messages", i), calls=call_at, args_field=("input",)))
    return out, origins


def _tools(req: MessagesRequest) -> tuple[list[dict] | None, Any, bool | None]:
    """(OpenAI tools, tool_choice, parallel_tool_calls) for the request's."""
    tools = None
    if req.tools is not None:
        tools = []
        for i, t in enumerate(req.tools):
            if t.type not in (None, "custom"):
                raise ApiError(400, f"tools[{i}].type: {t.type!r} is one of Anthropic's server tools, which this "
                               "server does not run; declare the tool with an input_schema instead",
                               param=f"tools[{i}].type")
            if t.input_schema is None:
                raise ApiError(400, f"tools[{i}].input_schema: required", param=f"tools[{i}].input_schema")
            # In OpenAI's order: a template that writes the tools as JSON writes the keys as given.
            fn: dict = {"name": t.name}
            if t.description is not None:
                fn["description"] = t.description
            fn["parameters"] = t.input_schema
            if t.strict is not None:
                fn["strict"] = t.strict
            tools.append({"type": "function", "function": fn})
    tc = req.tool_choice
    if tc is None:
        return tools, None, None
    parallel = not tc.disable_parallel_tool_use
    if tc.type in ("auto", "none"):
        return tools, tc.type, parallel
    if tc.type == "any":
        return tools, "required", parallel
    if tc.type == "tool":
        if tc.name is None:
            raise ApiError(400, "tool_choice.name: required when tool_choice.type is \"tool\"", param="tool_choice.name")
        return tools, {"type": "function", "function": {"name": tc.name}}, parallel
    raise ApiError(400, f"tool_choice.type: expected auto, any, tool or none, got {tc.type!r}", param="tool_choice.type")


_EFFORTS = {"low": "low", "medium": "medium", "high": "high", "xhigh": "high", "max": "high"}


def _thinking(req: MessagesRequest) -> dict:
    """The chat request's reasoning fields for `thinking` and `output_config.effort`."""
    kwargs, th = req.chat_template_kwargs, req.thinking
    out: dict = {"chat_template_kwargs": kwargs}
    effort = req.output_config.effort if req.output_config is not None else None
    if effort is not None:
        if effort not in _EFFORTS:
            raise ApiError(400, f"output_config.effort: expected one of {', '.join(_EFFORTS)}, got {effort!r}",
                           param="output_config.effort")
        out["reasoning_effort"] = _EFFORTS[effort]
    if th is None:
        return out
    if th.display not in (None, "summarized", "omitted"):
        raise ApiError(400, f"thinking.display: expected summarized or omitted, got {th.display!r}",
                       param="thinking.display")
    if th.type == "enabled":
        if th.budget_tokens is None:
            raise ApiError(400, "thinking.budget_tokens: required when thinking.type is \"enabled\"",
                           param="thinking.budget_tokens")
        if not 1 <= th.budget_tokens <= wire.MAX_COUNT:
            raise ApiError(400, f"thinking.budget_tokens: must be between 1 and {wire.MAX_COUNT}, got "
                           f"{th.budget_tokens}", param="thinking.budget_tokens")
        enable, budget = True, th.budget_tokens
    elif th.type in ("adaptive", "between_tools"):
        enable, budget = True, -1
    elif th.type == "disabled":
        enable, budget = False, 0
    else:
        raise ApiError(400, f"thinking.type: expected enabled, adaptive, between_tools or disabled, got {th.type!r}",
                       param="thinking.type")
    if isinstance(kwargs, dict):
        kwargs = {"enable_thinking": enable, **kwargs}  # an explicit template switch wins, as on the chat route
    elif kwargs is None:
        kwargs = {"enable_thinking": enable}
    out.update(chat_template_kwargs=kwargs, reasoning_budget=budget)
    return out


def _answer(req: MessagesRequest) -> AnswerFormat | None:
    fmt, where = req.output_config.format if req.output_config is not None else None, "output_config.format"
    if req.output_format is not None:
        if fmt is not None:
            raise ApiError(400, "output_format: the beta's name for output_config.format, and both are set",
                           param="output_format")
        fmt, where = req.output_format, "output_format"
    asked = []
    if fmt is not None:
        if fmt.type != "json_schema":
            raise ApiError(400, f"{where}.type: expected json_schema, got {fmt.type!r}", param=f"{where}.type")
        if fmt.schema is None:
            raise ApiError(400, f"{where}.schema: required", param=f"{where}.schema")
        asked.append((where, {"json_schema": fmt.schema}))
    return wire.answer_format(asked + wire.extension_answers(req))


def _refuse_unserved(req: MessagesRequest) -> None:
    """Fields whose features run on Anthropic's side, refused rather than
    answered as if they were absent."""
    if req.mcp_servers:
        raise ApiError(400, "mcp_servers: this server connects to no MCP servers; give their tools as tools",
                       param="mcp_servers")
    if req.context_management:
        raise ApiError(400, "context_management: this server edits no context; the conversation is read as sent",
                       param="context_management")


def _fields(req: MessagesRequest) -> Locate:
    """The chat request's fields as this API names them."""
    named = req.tool_choice is not None and req.tool_choice.type == "tool"

    def locate(loc: tuple) -> tuple:
        match loc:
            case ("tools", int(i), "function", "parameters", *rest):
                return ("tools", i, "input_schema", *rest)
            case ("tools", int(i), "function", *rest):
                return ("tools", i, *rest)
            case ("stop", *rest):
                return ("stop_sequences", *rest)
            case ("tool_choice",):
                return ("tool_choice", "name" if named else "type")
        return loc

    return locate


def _sampling(state: ServerState, req: MessagesRequest) -> SamplingParams:
    fields = {**req.sampling(), "stop": req.stop_sequences}
    try:
        return wire.sampling_options(wire.Sampling(**fields), state.model.n_vocab, state.opts.sampling,
                                     wire.text_tokens(state.model))
    except ApiError as e:
        raise located(e, _fields(req)) from None


async def _prompt(state: ServerState, req: MessagesRequest, params: SamplingParams) -> tuple[list[int], ChatShaper]:
    """The prompt's ids and the reply's shaper (the call's grammar, the
    thought's budget added to `params`)."""
    messages, origins = _chat_messages(req)
    tools, tool_choice, parallel = _tools(req)
    chat = ChatRequest(messages=messages, tools=tools, tool_choice=tool_choice, parallel_tool_calls=parallel,
                       answer=_answer(req), **_thinking(req))
    return await chat_prompt(state, chat, params, locate=message_locator(origins, _fields(req)))


# -- the reply, as Anthropic shapes it --------------------------------------------

#: Anthropic's stop_reason for each way a reply ends
STOP_REASON = {Stop.END_TURN: "end_turn", Stop.STOP_SEQUENCE: "stop_sequence", Stop.LENGTH: "max_tokens",
               Stop.CONTEXT: "max_tokens", Stop.TOOL_CALLS: "tool_use"}


def _usage(g: Generation, n_cached: int, n_output: int) -> dict:
    # Anthropic counts the prompt tokens read apart from those the cache held.
    return {"input_tokens": len(g.prompt) - n_cached, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": n_cached, "output_tokens": n_output}


def _tool_input(call) -> dict:
    try:
        value = json.loads(call.arguments) if call.arguments.strip() else {}
    except ValueError as e:
        raise ApiError(500, f"the model's tool call {call.name} has arguments that are not JSON: {e}") from None
    if not isinstance(value, dict):
        raise ApiError(500, f"the model's tool call {call.name} has arguments that are not a JSON object")
    return value


def _content(shaper: ChatShaper, show_thought: bool) -> list[dict]:
    blocks: list[dict] = []
    thought = "".join(shaper.thought or [])
    if thought:
        # Anthropic signs its own models' thoughts; a local model's has nothing to sign.
        blocks.append({"type": "thinking", "thinking": thought if show_thought else "", "signature": ""})
    text = "".join(shaper.content)
    if text:
        blocks.append({"type": "text", "text": text})
    if shaper.called:
        for call in shaper.tools.calls:
            blocks.append({"type": "tool_use", "id": call.id, "name": call.name, "input": _tool_input(call)})
    return blocks


class _BlockStream(Segments):
    """The chat shaper's deltas as Anthropic's content-block events."""

    def __init__(self, show_thought: bool) -> None:
        super().__init__()
        self.index = -1
        self.show_thought = show_thought

    def _event(self, kind: str, **fields) -> tuple[str, dict]:
        return kind, {"type": kind, "index": self.index, **fields}

    def _block(self, block: dict) -> list[tuple[str, dict]]:
        self.index += 1
        return [self._event("content_block_start", content_block=block)]

    def start_thought(self):
        return self._block({"type": "thinking", "thinking": "", "signature": ""})

    def thought(self, piece: str):
        if not self.show_thought:
            return []
        return [self._event("content_block_delta", delta={"type": "thinking_delta", "thinking": piece})]

    def start_text(self):
        return self._block({"type": "text", "text": ""})

    def text(self, piece: str):
        return [self._event("content_block_delta", delta={"type": "text_delta", "text": piece})]

    def start_call(self, call: CallStart):
        return self._block({"type": "tool_use", "id": call.id, "name": call.name, "input": {}})

    def arguments(self, fragment: str):
        return [self._event("content_block_delta", delta={"type": "input_json_delta", "partial_json": fragment})]

    def end(self, kind: str):
        out = []
        if kind == "thought":
            out.append(self._event("content_block_delta", delta={"type": "signature_delta", "signature": ""}))
        out.append(self._event("content_block_stop"))
        return out


# -- the routes -------------------------------------------------------------------

@reads(MessagesRequest)
async def messages(request: web.Request) -> web.StreamResponse:
    state: ServerState = request.app["state"]
    req = wire.decode(await read_body(request), MessagesRequest)
    _refuse_unserved(req)
    if req.max_tokens is None:
        raise ApiError(400, "max_tokens: required", param="max_tokens")
    if req.temperature is not None and req.temperature > 1:
        raise ApiError(400, f"temperature: must be between 0 and 1, got {req.temperature}", param="temperature")
    if not 1 <= req.max_tokens <= wire.MAX_COUNT:
        raise ApiError(400, f"max_tokens: must be between 1 and {wire.MAX_COUNT}, got {req.max_tokens}",
                       param="max_tokens")
    budget = req.thinking.budget_tokens if req.thinking is not None and req.thinking.type == "enabled" else None
    if budget is not None and budget >= req.max_tokens:
        # As Anthropic's API: the thought's budget is part of the reply's.
        raise ApiError(400, f"thinking.budget_tokens: must be less than max_tokens ({req.max_tokens}), got {budget}",
                       param="thinking.budget_tokens")
    params = _sampling(state, req)
    prompt, shaper = await _prompt(state, req, params)
    gen = Generation(request, prompt, req.max_tokens, params)
    mid = f"msg_{uuid.uuid4().hex}"
    head = {"id": mid, "type": "message", "role": "assistant", "model": state.model_id()}
    show_thought = req.thinking is None or req.thinking.display != "omitted"

    if not req.stream:
        c = await gen.whole()
        end = shaper.read_whole(c)[-1]
        return json_response({**head, "content": _content(shaper, show_thought), "stop_reason": STOP_REASON[end.stop],
                              "stop_sequence": end.stop_sequence,
                              "usage": _usage(gen, gen.n_cached, len(c.tokens))})

    async def write(resp) -> None:
        blocks = _BlockStream(show_thought)

        async def send(items) -> None:
            for kind, data in items:
                await sse_send(resp, data, event=kind)

        n_cached = gen.job.n_cached or 0
        await send([("message_start", {"type": "message_start", "message": {
            **head, "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": _usage(gen, n_cached, 0)}}), ("ping", {"type": "ping"})])
        async for ev in gen.events():
            if isinstance(ev, Piece):
                await send(blocks.feed(shaper.feed(ev.text)))
            elif isinstance(ev, Completion):
                events = shaper.finish(ev)
                await send(blocks.feed(events))
                await send(blocks.close())
                end = events[-1]
                await send([("message_delta", {
                    "type": "message_delta",
                    "delta": {"stop_reason": STOP_REASON[end.stop], "stop_sequence": end.stop_sequence},
                    "usage": _usage(gen, ev.n_cached, len(ev.tokens))}),
                    ("message_stop", {"type": "message_stop"})])
    return await gen.stream(request, write)


@reads(MessagesRequest)
async def count_tokens(request: web.Request) -> web.Response:
    state: ServerState = request.app["state"]
    req = wire.decode(await read_body(request), MessagesRequest)
    prompt, _ = await _prompt(state, req, SamplingParams())
    return json_response({"input_tokens": len(prompt)})


def add_routes(app: web.Application) -> None:
    app.router.add_post(PREFIX, messages)
    app.router.add_post(f"{PREFIX}/count_tokens", count_tokens)
