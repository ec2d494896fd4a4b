"""A chat request's prompt, as every chat-shaped route asks the chat core
(`ember.chat`) for it: the core's refusals as 400s naming the field the
client sent. An API whose request is not the chat request's shape gives a
`Locate`, mapping a path into the chat request to a path into its own."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass, field

from ember.chat import ChatError, ChatPrompt, ChatRequest, ChatShaper, build_prompt
from ember.chat.errors import format_location, location
from ember.sampling import SamplingParams
from ember.server.errors import ApiError
from ember.server.state import ServerState

__all__ = ["Locate", "Origin", "chat_prompt", "chat_text", "located", "message_locator"]

#: A path into the chat request (or its sampling fields) -> the same field's path in the client's request.
Locate = Callable[[tuple], tuple]


def located(e: ApiError | ChatError, locate: Locate | None) -> ApiError:
    """`e` as a 400 naming the field the client sent (`locate` maps the
    chat request's path to it; without one the paths are the same)."""
    if isinstance(e, ChatError):
        loc, detail, param = e.loc, e.detail, e.param
    else:
        loc = location(e.message)
        detail = e.message[len(format_location(loc)) + 1:].lstrip() if loc else e.message
        param = e.param
    there = locate(loc) if locate is not None and loc else loc
    if isinstance(e, ApiError) and there == loc:
        return e
    if there != loc:
        param = format_location(there)
    message = f"{format_location(there)}: {detail}" if there else detail
    if isinstance(e, ApiError):
        return ApiError(e.status, message, type=e.type, param=param, extra=e.extra, headers=e.headers)
    return ApiError(400, message, param=param)


@dataclass
class Origin:
    """Where a chat message came from in the client's request."""

    #: the message, item or block it was made from
    at: tuple
    #: for a tool result: the field naming its call ("tool_use_id", "call_id")
    id_field: str = ""
    #: for an assistant turn: the block or item of each of its calls
    calls: list[tuple] = field(default_factory=list)
    #: the path from a call's block to its arguments (("input",), ("arguments",))
    args_field: tuple = ()


def message_locator(origins: list[Origin], then: Locate | None = None) -> Locate:
    """The `Locate` of a request whose messages became the chat messages as
    `origins` say; paths outside the messages go through `then`."""

    def locate(loc: tuple) -> tuple:
        match loc:
            case ("messages", int(i), *rest) if i < len(origins):
                o = origins[i]
                match rest:
                    case ("tool_calls", int(k), "function", "arguments", *more) if k < len(o.calls):
                        return (*o.calls[k], *o.args_field, *more)
                    case ("tool_calls", int(k), *more) if k < len(o.calls):
                        return (*o.calls[k], *more)
                    case ("tool_call_id", *more):
                        return (*o.at, o.id_field, *more)
                return (*o.at, *rest)
        return then(loc) if then is not None else loc

    return locate


async def chat_prompt(state: ServerState, request: ChatRequest, params: SamplingParams, *,
                      locate: Locate | None = None, after: list[int] | None = None,
                      add_generation_prompt: bool = True,
                      prefill: bool | None = None) -> tuple[list[int], ChatShaper]:
    """The prompt's ids and the shaper its reply goes through; what the
    generation needs beyond the request's own options goes into `params`.
    `after`, an earlier reply's tokens (Ollama's context), comes first: the
    new turn follows it without a BOS of its own. Without
    `add_generation_prompt` the last turn is left open as the template
    writes it (no reply's turn is opened, no assistant's words continued).
    `prefill`: whether the assistant's last words are continued (None: as
    the server does, --no-prefill-assistant)."""
    p = await _built(state, request, locate, add_generation_prompt, prefill)
    p.apply(params)
    if not after:
        return state.model.chat_text_ids(p.text, p.literal), p.shaper
    ids = state.model.tokenize(p.text, add_special=False, parse_special=True, literal=p.literal)
    bos = state.model._native.bos_id
    return list(after) + (ids[1:] if ids and bos is not None and ids[0] == bos else ids), p.shaper


async def chat_text(state: ServerState, request: ChatRequest, add_generation_prompt: bool = True,
                    prefill: bool | None = None) -> str:
    """The prompt's text (llama-server's /apply-template)."""
    return (await _built(state, request, None, add_generation_prompt, prefill)).text


async def _built(state: ServerState, request: ChatRequest, locate: Locate | None,
                 add_generation_prompt: bool = True, prefill: bool | None = None) -> ChatPrompt:
    request, locate = _with_system_prompt(state, request, locate)
    request = _with_reasoning_defaults(state, request)
    # Off the event loop: a template is the client's to trigger and may take
    # its bounded while (`ember.chat_template.MAX_RENDER_SECONDS`); /health
    # and the streams under way go on meanwhile.
    build = functools.partial(build_prompt, state.model, request, template=state.template, framings=state.framings,
                              add_generation_prompt=add_generation_prompt,
                              next_turn=add_generation_prompt and _checkpointing(state),
                              prefill=state.opts.prefill_assistant if prefill is None else prefill)
    try:
        return await asyncio.get_running_loop().run_in_executor(None, build)
    except ChatError as e:
        raise located(e, locate) from None


def _with_system_prompt(state: ServerState, request: ChatRequest,
                        locate: Locate | None) -> tuple[ChatRequest, Locate | None]:
    """The request with the server's system message first when it sends none
    of its own (--system-prompt-file); the core's paths into the messages
    then count from the client's first."""
    system = state.opts.system_prompt
    if system is None or any(m.get("role") in ("system", "developer") for m in request.messages):
        return request, locate
    request = dataclasses.replace(request, messages=[{"role": "system", "content": system}, *request.messages])

    def shifted(loc: tuple) -> tuple:
        match loc:
            case ("messages", 0, *rest):
                return ("--system-prompt-file", *rest)
            case ("messages", int(i), *rest):
                loc = ("messages", i - 1, *rest)
        return locate(loc) if locate is not None else loc

    return request, shifted


def _with_reasoning_defaults(state: ServerState, request: ChatRequest) -> ChatRequest:
    """The request with the server's thinking defaults where it does not
    say (a budget of -1 says nothing, as on llama-server): its template
    switches over the server's, key by key, and its own effort over a
    default enable_thinking (as its effort wins over the template's)."""
    d = state.opts.reasoning
    changes: dict = {}
    kwargs = request.chat_template_kwargs
    if d.template_kwargs and (kwargs is None or isinstance(kwargs, dict)):
        base = dict(d.template_kwargs)
        if request.reasoning_effort is not None:
            base.pop("enable_thinking", None)
        changes["chat_template_kwargs"] = {**base, **(kwargs or {})}
    for name in ("reasoning_format", "reasoning_budget_message", "reasoning_effort"):
        if getattr(request, name) is None and getattr(d, name) is not None:
            changes[name] = getattr(d, name)
    if isinstance(kwargs, dict) and ("reasoning_effort" in kwargs or "enable_thinking" in kwargs):
        changes.pop("reasoning_effort", None)  # the request's own template switches say it
    if request.reasoning_budget in (None, -1) and d.reasoning_budget is not None:
        changes["reasoning_budget"] = d.reasoning_budget
    return dataclasses.replace(request, **changes) if changes else request


def _checkpointing(state: ServerState) -> bool:
    engine = state.engine
    return engine is not None and engine.checkpoints.count > 0 and engine.checkpoint_bytes > 0
