"""A chat request's prompt, as every chat-shaped route builds it: the
messages through the chat template with the tools the template (or the
generic framing) presents, the structured-output and tool-call grammars, and
the thought the template may leave open; and the shaper its reply goes
through. OpenAI's chat completions and Anthropic's messages both end here."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ember.errors import TemplateError
from ember.server.state import ServerState
from ember.server.chat_output import ChatShaper
from ember.server.errors import ApiError
from ember.server.wire import ChatRequest, sampling_options

__all__ = ["Origin", "chat_prompt", "chat_text", "field_error", "relocated", "translated_prompt"]


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


def _reasoning(req: ChatRequest):
    from ember.errors import InvalidRequestError
    from ember.reasoning import resolve_reasoning_request

    try:
        return resolve_reasoning_request({
            "chat_template_kwargs": req.chat_template_kwargs, "reasoning_effort": req.reasoning_effort,
            "reasoning_budget": req.reasoning_budget, "reasoning_format": req.reasoning_format})
    except InvalidRequestError as e:
        raise field_error(e)


def field_error(e: Exception) -> ApiError:
    """A 400 for an error whose message starts with the field it is about."""
    field = str(e).split(":", 1)[0].split(".", 1)[0].split("[", 1)[0]
    return ApiError(400, str(e), param=field)


def _framing(state: ServerState, render):
    """The tool-call framing of the template in use, found once per template."""
    from ember.tool_calls import detect_framing

    key = state.template if state.template is not None else state.model.chat_template
    if key not in state.framings:
        state.framings[key] = detect_framing(render)
    return state.framings[key]


def translated_prompt(state: ServerState, chat: ChatRequest, messages: list[dict], origins: list[Origin],
                      renames: list[tuple[re.Pattern, str]], after: list[int] | None = None
                      ) -> tuple[list[int], ChatShaper, dict]:
    """For a route whose API is not OpenAI's chat but becomes it: the
    prompt's ids, the reply's shaper and the engine's options, with every
    error put back in the route's terms (`relocated`). `after`, an earlier
    reply's tokens (Ollama's context), comes first: the new turn follows it
    without a BOS of its own."""
    try:
        opts = sampling_options(chat, state.model.n_vocab)
        text, shaper = chat_text(state, chat, messages, opts)
    except ApiError as e:
        raise relocated(e, origins, renames) from None
    if not after:
        return state.model.chat_text_ids(text), shaper, opts
    ids = state.model.tokenize(text, add_special=False, parse_special=True)
    bos = state.model._native.bos_id
    return list(after) + (ids[1:] if ids and bos is not None and ids[0] == bos else ids), shaper, opts


def _schema_error(tools, e: Exception) -> ApiError:
    """A 400 naming the tool whose parameters schema the call grammar could
    not use (each compiled alone to find it), or all of them."""
    from ember.errors import InvalidRequestError
    from ember.structured import compile_grammar

    for i, t in enumerate(tools):
        try:
            compile_grammar(json_schema=t["function"].get("parameters") or {})
        except InvalidRequestError as own:
            where = f"tools[{i}].function.parameters"
            return ApiError(400, f"{where}: the schema cannot be used: {own}", param=where)
    return ApiError(400, f"tools: a parameters schema cannot be used: {e}", param="tools")


def chat_prompt(state: ServerState, req: ChatRequest, messages: list[dict], opts: dict) -> tuple[list[int], ChatShaper]:
    """The prompt's ids and the shaper its reply goes through (see `chat_text`)."""
    text, shaper = chat_text(state, req, messages, opts)
    return state.model.chat_text_ids(text), shaper


def chat_text(state: ServerState, req: ChatRequest, messages: list[dict], opts: dict,
              add_generation_prompt: bool = True) -> tuple[str, ChatShaper]:
    """The prompt's text and the shaper its reply goes through: the tools as
    the template (or the generic framing) presents them, a forced call's
    grammar, the thought markers the template uses, whether the prompt
    leaves a thought open, and what the request asked of thinking (a budget
    of 0, or a JSON answer, closes an open thought in the prompt itself)."""
    from ember.errors import InvalidRequestError
    from ember.reasoning import detect_reasoning, starts_in_thought
    from ember.structured import compile_grammar, json_schema_rules
    from ember.tool_calls import (GENERIC, ToolCallStream, apply_generic_tools, call_grammar, call_trigger,
                                  normalize_tool_messages, validate_tools)

    model = state.model
    rr = _reasoning(req)
    try:
        plan = validate_tools(req.tools, req.tool_choice, req.parallel_tool_calls)
        messages = normalize_tool_messages(messages)
    except InvalidRequestError as e:
        raise field_error(e)

    def render(msgs, tools, generation_prompt=add_generation_prompt):
        try:
            return model.render_chat(msgs, tools=tools, chat_template_kwargs=rr.template_kwargs,
                                     template=state.template, add_generation_prompt=generation_prompt)
        except InvalidRequestError as e:  # a template variable the request may not set
            raise field_error(e) from None

    # A JSON answer cannot hold a thought: one the prompt opened is closed
    # first. A GBNF grammar is the client's own and may write the thought.
    json_answer = "grammar" in opts and not req.grammar
    tools, stream = plan.template_tools, None
    if tools:
        framing = _framing(state, render)
        if framing is GENERIC:
            messages, tools = apply_generic_tools(messages, plan.tools, parallel=plan.parallel), None
        if plan.parse:
            stream = ToolCallStream(framing, plan.tools)
        if plan.forced:
            if "grammar" in opts:
                raise ApiError(400, "tool_choice: a forced call cannot be combined with response_format, "
                               "json_schema or grammar", param="tool_choice")
            try:
                opts["grammar"] = compile_grammar(grammar=plan.grammar(framing, json_schema_rules))
            except InvalidRequestError as e:
                raise _schema_error(plan.tools, e) from None
            json_answer = True  # the call starts at once: an open thought is closed first
        elif plan.parse and "grammar" not in opts and (trigger := call_trigger(framing)):
            # A watched call: the reply is free until the model writes the
            # call's opener, and from there the call is held to the tools'
            # schemas, so it is always whole. A schema outside the subset
            # leaves the calls parsed but unwatched.
            try:
                g = compile_grammar(grammar=call_grammar(framing, plan.tools, None, plan.parallel, json_schema_rules))
            except InvalidRequestError:
                g = None
            # Llama 3's calls may also open bare, so its grammar does not start at the tag.
            if g is not None and g.accepts_prefix(trigger.encode()):
                opts["grammar"], opts["grammar_trigger"] = g, trigger
    # A conversation ending in the assistant's own words asks for them to be
    # continued (llama-server's assistant prefill, Anthropic's too): the turn
    # is opened as for a reply and those words written into it.
    prefill = None
    last = messages[-1] if messages and isinstance(messages[-1], dict) else {}
    if add_generation_prompt and len(messages) > 1 and last.get("role") == "assistant" and not last.get("tool_calls"):
        prefill, messages = last.get("content") or "", messages[:-1]
    try:
        text = render(messages, tools)
    except TemplateError as e:
        raise ApiError(400, f"messages: the chat template failed: {e}", param="messages")
    source = state.template if state.template is not None else (model.chat_template or "")
    fmt = detect_reasoning(source, text) if rr.split else None
    in_thought = starts_in_thought(fmt, text)
    if prefill:
        if fmt is not None and in_thought:
            text += fmt.close  # the words are the answer: the thought the prompt opened is over
            in_thought = False
        text += prefill
    if fmt is not None and in_thought and (rr.budget == 0 or json_answer):
        text += fmt.close
        in_thought = False
    elif fmt is not None and rr.budget >= 0:
        close_ids = model.tokenize(fmt.close, add_special=False, parse_special=True)
        opts["thought_budget"] = (rr.budget, fmt.opener, fmt.closer, close_ids, in_thought)
    if add_generation_prompt and prefill is None and _checkpointing(state):
        # Where the next turn will part from this prompt: templates rewrite
        # the reply's turn once it is history (Qwen3.5 drops its thought),
        # so a hybrid's slot is checkpointed there (see the engine's hints).
        try:
            opts["checkpoint_next_text"] = render(messages + _NEXT_TURN, tools, generation_prompt=False)
        except (TemplateError, ApiError):
            pass  # a template that cannot render the next turn gives no hint
    shaper = ChatShaper(reasoning=fmt, in_thought=in_thought, tools=stream, raw_content=rr.raw_content)
    return text, shaper


#: A stand-in for the reply and the user's next message, rendered after the
#: conversation to find where the next turn's prompt parts from this one's.
_NEXT_TURN = [{"role": "assistant", "content": "Next"}, {"role": "user", "content": "Next"}]


def _checkpointing(state: ServerState) -> bool:
    engine = state.engine
    return engine is not None and engine.checkpoints.count > 0 and engine.checkpoint_bytes > 0
