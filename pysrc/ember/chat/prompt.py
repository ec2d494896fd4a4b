"""A chat request's prompt, as every chat-shaped API and `ember.Model.chat`
build it: the messages through the chat template with the tools the template
(or the generic framing) presents, a forced or watched call's grammar, the
thought the template may leave open and what the request asked of it, and
the shaper the reply goes through. Free of HTTP: what it refuses is a
`ChatError` located in the chat request."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ember.chat.errors import ChatError
from ember.chat.literal import client_text, unmark
from ember.chat.output import ChatShaper
from ember.chat.request import ChatRequest
from ember.errors import InvalidRequestError, TemplateError
from ember.sampling import SamplingParams, ThoughtBudget

__all__ = ["ChatPrompt", "build_prompt"]


@dataclass
class ChatPrompt:
    """The prompt's text, the reply's shaper, and what the generation needs
    beyond the request's own sampling options."""

    text: str
    shaper: ChatShaper
    #: a forced call's grammar, a watched one's with its trigger, or the answer's
    grammar: Any = None
    grammar_trigger: str | None = None
    #: when the thought has a budget
    thought_budget: ThoughtBudget | None = None
    #: byte ranges of `text` that are the client's words: its spellings of
    #: control tokens are read as text (`ember.chat.literal`)
    literal: list = field(default_factory=list)
    #: the next turn rendered after this conversation, when asked for (where
    #: it parts from this prompt is where a hybrid's slot keeps a checkpoint)
    next_turn: str | None = None

    def apply(self, params: SamplingParams) -> None:
        """Adds to the request's own options what the prompt's generation
        needs: a call's grammar, the thought's budget, the next turn."""
        if self.grammar is not None:
            params.grammar, params.grammar_trigger = self.grammar, self.grammar_trigger
        if self.thought_budget is not None:
            params.thought_budget = self.thought_budget
        if self.next_turn is not None:
            params.next_turn = self.next_turn


#: A stand-in for the reply and the user's next message, rendered after the
#: conversation to find where the next turn's prompt parts from this one's.
_NEXT_TURN = [{"role": "assistant", "content": "Next"}, {"role": "user", "content": "Next"}]


#: The budget of a thought that only a control ends.
_UNBOUNDED = 2**31 - 1


def _reasoning(s: ChatRequest):
    from ember.reasoning import resolve_reasoning_request

    try:
        return resolve_reasoning_request({
            "chat_template_kwargs": s.chat_template_kwargs, "reasoning_effort": s.reasoning_effort,
            "reasoning_budget": s.reasoning_budget, "reasoning_budget_message": s.reasoning_budget_message,
            "reasoning_format": s.reasoning_format})
    except InvalidRequestError as e:
        raise ChatError.of(str(e)) from None


def _forced_close(model, close: str, message: str) -> list[int]:
    """The tokens a thought budget writes: the message's, then the close's
    (each read alone, as llama-server reads them), in one run of forced
    tokens."""
    ids = model.tokenize(message, add_special=False, parse_special=True) if message else []
    ids += model.tokenize(close, add_special=False, parse_special=True)
    limit = model.max_forced_run
    if len(ids) > limit:
        raise ChatError(f"is {len(ids)} tokens with the thought's close; at most {limit} are written at once",
                        ("reasoning_budget_message",), param="reasoning_budget_message")
    return ids


def _strict_tool(tools) -> int | None:
    """The first tool declared `strict`, if any."""
    return next((i for i, t in enumerate(tools) if t["function"].get("strict") is True), None)


def _check_schemas(tools) -> None:
    """A malformed parameters schema is a bad request however the calls are
    read, watched or not (one merely outside the subset leaves them
    unwatched, unless its tool is strict)."""
    from ember.structured import InvalidSchemaError, json_schema_rules

    for i, t in enumerate(tools):
        try:
            json_schema_rules(t["function"]["parameters"], "checked")
        except InvalidSchemaError as e:
            raise ChatError(f"the schema cannot be used: {e}", ("tools", i, "function", "parameters"),
                            param=f"tools[{i}].function.parameters") from None
        except InvalidRequestError:
            pass


def _schema_error(tools, e: Exception) -> ChatError:
    """The tool whose parameters schema the call grammar could not use (each
    compiled alone to find it), or all of them."""
    from ember.structured import compile_grammar

    for i, t in enumerate(tools):
        try:
            compile_grammar(json_schema=t["function"].get("parameters") or {})
        except InvalidRequestError as own:
            where = ("tools", i, "function", "parameters")
            return ChatError(f"the schema cannot be used: {own}", where, param=f"tools[{i}].function.parameters")
    return ChatError(f"a parameters schema cannot be used: {e}", ("tools",))


def build_prompt(model, request: ChatRequest, *, template: str | None = None, framings: dict | None = None,
                 add_generation_prompt: bool = True, next_turn: bool = False, prefill: bool = True) -> ChatPrompt:
    """The prompt of `request` for `model` (its own chat template, or
    `template`). `framings` caches each template's tool-call framing across
    calls. With `next_turn`, the next turn is rendered too (see `ChatPrompt`).
    Without `prefill`, a conversation ending in the assistant's words is a
    finished turn, and a new one is opened after it (llama-server's
    --no-prefill-assistant)."""
    from ember.chat.tools import (GENERIC, ToolCallStream, apply_generic_tools, call_grammar, call_trigger,
                                  detect_framing, normalize_tool_messages, validate_tools)
    from ember.reasoning import detect_reasoning, starts_in_thought
    from ember.structured import compile_grammar, json_schema_rules

    rr = _reasoning(request)
    try:
        plan = validate_tools(request.tools, request.tool_choice, request.parallel_tool_calls)
        checked = normalize_tool_messages(request.messages)
    except InvalidRequestError as e:
        raise ChatError.of(str(e)) from None
    if plan.parse:
        _check_schemas(plan.tools)

    def render(msgs, tools, generation_prompt=add_generation_prompt):
        try:
            return model.render_chat(msgs, tools=tools, chat_template_kwargs=rr.template_kwargs,
                                     template=template, add_generation_prompt=generation_prompt)
        except InvalidRequestError as e:  # a template variable the request may not set
            raise ChatError.of(str(e)) from None

    # What the template shows of the client's words, control spellings
    # marked (see `ember.chat.literal`); the tools' own copy parses the calls.
    client = client_text(model.control_spellings)
    messages = client.mark(checked, ("messages",))
    shown_tools = client.mark(list(plan.tools), ("tools",))
    out = ChatPrompt(text="", shaper=ChatShaper())
    # A JSON answer cannot hold a thought: one the prompt opened is closed
    # first. A GBNF grammar is the client's own and may write the thought.
    answer = request.answer
    json_answer = answer is not None and not answer.gbnf
    tools, stream = (shown_tools if plan.template_tools else plan.template_tools), None
    if tools:
        key = template if template is not None else model.chat_template
        cache = framings if framings is not None else {}
        if key not in cache:
            cache[key] = detect_framing(render)
        framing = cache[key]
        if framing is GENERIC:
            messages, tools = apply_generic_tools(messages, shown_tools, parallel=plan.parallel), None
        if plan.parse:
            stream = ToolCallStream(framing, plan.tools)
        if plan.forced:
            if answer is not None:
                raise ChatError("a forced call cannot be combined with a format or grammar for the answer",
                                ("tool_choice",))
            try:
                out.grammar = compile_grammar(grammar=plan.grammar(framing, json_schema_rules))
            except InvalidRequestError as e:
                raise _schema_error(plan.tools, e) from None
            json_answer = True  # the call starts at once: an open thought is closed first
        elif plan.parse and answer is None and (trigger := call_trigger(framing)):
            # A watched call: the reply is free until the model writes the
            # call's opener, and from there the call is held to the tools'
            # schemas, so it is always whole. A schema outside the subset
            # leaves the calls parsed but unwatched.
            try:
                g = compile_grammar(grammar=call_grammar(framing, plan.tools, None, plan.parallel, json_schema_rules))
            except InvalidRequestError as e:
                if _strict_tool(plan.tools) is not None:
                    raise _schema_error(plan.tools, e) from None
                g = None
            # Llama 3's calls may also open bare, so its grammar does not start at the tag.
            if g is not None and g.accepts_prefix(trigger.encode()):
                out.grammar, out.grammar_trigger = g, trigger
        if plan.parse and out.grammar is None and (strict := _strict_tool(plan.tools)) is not None:
            # A strict tool is a promise that its calls fit its schema: refused where nothing holds them to it.
            why = ("a format or grammar for the answer leaves the calls unwatched" if answer is not None else
                   "this template's calls open with nothing to watch for")
            raise ChatError(f"its calls cannot be held to its schema here: {why}; tool_choice \"required\" or the "
                            "tool's name holds them", ("tools", strict, "function", "strict"))
    # A conversation ending in the assistant's own words asks for them to be
    # continued (llama-server's assistant prefill, Anthropic's too): the turn
    # is opened as for a reply and those words written into it.
    continued, prefill = prefill, None
    last = messages[-1] if messages and isinstance(messages[-1], dict) else {}
    if (continued and add_generation_prompt and len(messages) > 1 and last.get("role") == "assistant"
            and not last.get("tool_calls")):
        prefill, messages = last.get("content") or "", messages[:-1]
    try:
        text = render(messages, tools)
    except TemplateError as e:
        raise ChatError(f"the chat template failed: {e}", ("messages",)) from None
    source = template if template is not None else (model.chat_template or "")
    # The thought's markers steer the generation (a budget, a prefill, a JSON answer) whatever the
    # format; the format says only whether the reply is split at them.
    fmt = detect_reasoning(source, text)
    in_thought = starts_in_thought(fmt, text)
    if prefill:
        if fmt is not None and in_thought:
            text += fmt.close  # the words are the answer: the thought the prompt opened is over
            in_thought = False
        text += prefill
    if fmt is not None and in_thought and (json_answer or (rr.budget == 0 and not rr.budget_message)):
        text += fmt.close
        in_thought = False
    elif fmt is not None and (rr.budget >= 0 or request.reasoning_control):
        # A thought that may be ended while it runs has a budget armed, unbounded until it is ended.
        # A message goes before the close as the model's own words (a budget of 0 writes both at once).
        close_ids = _forced_close(model, fmt.close, rr.budget_message)
        tokens = rr.budget if rr.budget >= 0 else _UNBOUNDED
        out.thought_budget = ThoughtBudget(tokens, fmt.opener, fmt.closer, tuple(close_ids), in_thought)
    if next_turn and add_generation_prompt and prefill is None:
        try:
            out.next_turn = unmark(render(messages + _NEXT_TURN, tools, generation_prompt=False))[0]
        except (TemplateError, ChatError):
            pass  # a template that cannot render the next turn gives no hint
    if out.grammar is None and answer is not None:
        out.grammar = answer.grammar
    out.text, out.literal = unmark(text)
    out.shaper = ChatShaper(reasoning=fmt if rr.split else None, in_thought=in_thought, tools=stream,
                            raw_content=rr.raw_content)
    return out
