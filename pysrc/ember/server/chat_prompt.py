"""A chat request's prompt, as every chat-shaped route asks the chat core
(`ember.chat`) for it: the route's request in the core's terms, the core's
refusals as 400s naming the field, and errors put back where a client of
another API sent them."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ember.chat import ChatError, ChatSettings, ChatShaper, build_prompt
from ember.sampling import SamplingParams
from ember.server.errors import ApiError
from ember.server.state import ServerState
from ember.server.wire import ChatRequest, sampling_options

__all__ = ["Origin", "chat_prompt", "chat_text", "relocated", "translated_prompt"]


@dataclass
class Origin:
    """Where a chat message came from in a request of another API's shape,
    so an error the chat pipeline finds names the field the client sent."""

    #: the message, item or block it was made from
    at: str
    #: for a tool result: the field naming its call ("tool_use_id", "call_id")
    id_field: str = ""
    #: for an assistant turn: the block or item of each of its calls
    calls: list[str] = field(default_factory=list)
    #: the field holding a call's arguments ("input", "arguments")
    args_field: str = ""


_MESSAGE_PATH = re.compile(r"^messages\[(\d+)\](?:\.tool_calls\[(\d+)\](\.function\.arguments)?|(\.tool_call_id))?")


def relocated(e: ApiError, origins: list[Origin], renames: list[tuple[re.Pattern, str]]) -> ApiError:
    """`e` with the chat message it names put back where the client sent it,
    and the chat fields it names (`renames`) under the client's API's names."""
    msg = e.message
    m = _MESSAGE_PATH.match(msg)
    if m and int(m.group(1)) < len(origins):
        o = origins[int(m.group(1))]
        if m.group(2) is not None and int(m.group(2)) < len(o.calls):
            where = o.calls[int(m.group(2))] + (f".{o.args_field}" if m.group(3) else "")
        elif m.group(4):
            where = f"{o.at}.{o.id_field}"
        else:
            where = o.at
        msg = where + msg[m.end():]
    for pattern, repl in renames:
        msg = pattern.sub(repl, msg)
    if msg == e.message:
        return e
    name = msg.split(":", 1)[0]
    return ApiError(e.status, msg, type=e.type, param=name if " " not in name else e.param, extra=e.extra,
                    headers=e.headers)


def translated_prompt(state: ServerState, chat: ChatRequest, messages: list[dict], origins: list[Origin],
                      renames: list[tuple[re.Pattern, str]], after: list[int] | None = None
                      ) -> tuple[list[int], ChatShaper, SamplingParams]:
    """For a route whose API is not OpenAI's chat but becomes it: the
    prompt's ids, the reply's shaper and the engine's options, with every
    error put back in the route's terms (`relocated`). `after`, an earlier
    reply's tokens (Ollama's context), comes first: the new turn follows it
    without a BOS of its own."""
    try:
        params = sampling_options(chat, state.model.n_vocab)
        text, shaper = chat_text(state, chat, messages, params)
    except ApiError as e:
        raise relocated(e, origins, renames) from None
    if not after:
        return state.model.chat_text_ids(text), shaper, params
    ids = state.model.tokenize(text, add_special=False, parse_special=True)
    bos = state.model._native.bos_id
    return list(after) + (ids[1:] if ids and bos is not None and ids[0] == bos else ids), shaper, params


def chat_prompt(state: ServerState, req: ChatRequest, messages: list[dict], params: SamplingParams) -> tuple[list[int], ChatShaper]:
    """The prompt's ids and the shaper its reply goes through (see `chat_text`)."""
    text, shaper = chat_text(state, req, messages, params)
    return state.model.chat_text_ids(text), shaper


def chat_text(state: ServerState, req: ChatRequest, messages: list[dict], params: SamplingParams,
              add_generation_prompt: bool = True) -> tuple[str, ChatShaper]:
    """The prompt's text and the shaper its reply goes through, built by the
    chat core (`ember.chat.build_prompt`); what the generation needs beyond
    the request's own options goes into `params`, and what the core refuses is
    a 400 naming the field."""
    settings = ChatSettings(
        tools=req.tools, tool_choice=req.tool_choice, parallel_tool_calls=req.parallel_tool_calls,
        chat_template_kwargs=req.chat_template_kwargs, reasoning_effort=req.reasoning_effort,
        reasoning_budget=req.reasoning_budget, reasoning_format=req.reasoning_format,
        constrained=params.grammar is not None, client_grammar=bool(req.grammar))
    try:
        p = build_prompt(state.model, messages, settings, template=state.template, framings=state.framings,
                         add_generation_prompt=add_generation_prompt, next_turn=_checkpointing(state))
    except ChatError as e:
        raise ApiError(400, str(e), param=e.param) from None
    p.apply(params)
    return p.text, p.shaper


def _checkpointing(state: ServerState) -> bool:
    engine = state.engine
    return engine is not None and engine.checkpoints.count > 0 and engine.checkpoint_bytes > 0
