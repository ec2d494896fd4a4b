"""Reasoning: what a model thinks before it answers, kept apart from the answer.

A reasoning model writes its thought between markers before the answer:
``<think> … </think>`` (Qwen3, DeepSeek R1) or Gemma 4's thought channel
``<|channel>thought … <channel|>``. The thought leaves as ``reasoning_content``
(streamed as ``reasoning_content`` deltas), the answer as ``content``, and the
markers never leave. This module reads which markers a chat template uses,
whether the rendered prompt already opened a thought, splits generated text
(streamed or whole), validates the request fields that steer thinking, and
tells the engine when a thought budget forces the close.

The split follows llama-server's ``deepseek`` parser:

* Only a thought at the start of the output (after optional whitespace)
  counts. A ``<think>`` written later, inside the answer, is the answer's own
  text (a model explaining the tag, say) and stays in ``content``.
* Reasoning is stripped of surrounding whitespace and the whitespace after
  the close is dropped, so the newlines templates write around the markers
  (Qwen3's ``<think>\\n…\\n</think>\\n\\n``, Gemma 4's ``…\\n<channel|>``)
  never leave. Output with no thought is passed through byte for byte.
* A thought left open at the end is reasoning to the end.
* ``reasoning`` is None when no thought was written at all, and ``""`` when
  an empty one was (``<think>\\n\\n</think>``), or when the prompt opened one
  that the model closed at once.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ember.errors import InvalidRequestError


__all__ = [
    "EFFORTS",
    "FORMATS",
    "GEMMA4_CHANNEL",
    "InvalidRequestError",
    "Piece",
    "ReasoningFormat",
    "ReasoningRequest",
    "ReasoningSplitter",
    "THINK_TAGS",
    "ThoughtBudget",
    "close_for_constrained_answer",
    "detect_reasoning",
    "resolve_reasoning_request",
    "split_reasoning",
    "starts_in_thought",
]


@dataclass(frozen=True)
class ReasoningFormat:
    """The markers one family of models writes around a thought."""

    name: str
    opener: str
    closer: str
    # What the engine writes when it must end a thought itself (budget spent,
    # constrained answer): the closer with the whitespace the template writes
    # around it, so the forced text reads like one the model wrote.
    close: str


THINK_TAGS = ReasoningFormat("think", "<think>", "</think>", "\n</think>\n\n")
GEMMA4_CHANNEL = ReasoningFormat("gemma4-channel", "<|channel>thought", "<channel|>", "\n<channel|>")

# The spellings a template source is searched for, per format. A template may
# write only the bare channel markers (to strip past thoughts from history),
# so either one identifies Gemma 4's family. GPT-OSS's "<|channel|>" matches
# neither.
_SIGNS: tuple[tuple[ReasoningFormat, tuple[str, ...]], ...] = (
    (GEMMA4_CHANNEL, ("<|channel>", "<channel|>")),
    (THINK_TAGS, ("<think>", "</think>")),
)

Kind = Literal["reasoning", "content"]
Piece = tuple[Kind, str]


def detect_reasoning(template_source: str, rendered_prompt: str | None = None) -> ReasoningFormat | None:
    """The thought markers a chat template uses, or None when it writes none.

    The template source decides, not the prompt: a prompt carries client text,
    and a user who types ``<think>`` must not turn splitting on. The prompt
    only breaks a tie, for a template that mentions both families: the
    family whose marker the prompt shows last (closest to the generation) wins;
    without a prompt (or a prompt showing neither) Gemma 4's channel does,
    being the more specific spelling.
    """
    found = [fmt for fmt, signs in _SIGNS if any(s in template_source for s in signs)]
    if len(found) < 2 or rendered_prompt is None:
        return found[0] if found else None
    prompt = rendered_prompt
    # max keeps the first of equals, so a prompt showing neither keeps _SIGNS' order.
    return max(found, key=lambda f: max(prompt.rfind(f.opener), prompt.rfind(f.closer)))


def starts_in_thought(fmt: ReasoningFormat | None, rendered_prompt: str) -> bool:
    """Whether generation starts inside a thought: the prompt ends (but for
    whitespace) with the opener, as templates that force thinking write it
    (``…<|im_start|>assistant\\n<think>\\n``). Only the end counts: an opener
    inside an earlier message is that message's text, and Qwen3's
    thinking-off prompt ends with a closed empty thought (``<think>\\n\\n</think>\\n\\n``),
    Gemma 4's with ``<|channel>thought\\n<channel|>``."""
    return fmt is not None and rendered_prompt.rstrip().endswith(fmt.opener)


def close_for_constrained_answer(fmt: ReasoningFormat | None, in_thought: bool) -> str:
    """The text to force before a constrained (JSON) answer: the close when
    the prompt left a thought open, else nothing.

    The rule is the simple one: an open thought is closed at once rather than
    left to run, since a grammar that had to admit free thought first would
    have to know where the thought ends. When generation does not start in a
    thought, the constraint holds from the first generated token, so the model
    cannot open one and nothing needs closing.
    """
    return fmt.close if fmt is not None and in_thought else ""


class _State(enum.Enum):
    LEAD = enum.auto()  # start of output: whitespace and maybe part of an opener held back
    THOUGHT_LEAD = enum.auto()  # inside a thought, nothing but whitespace seen yet
    THOUGHT = enum.auto()
    AFTER = enum.auto()  # the thought closed: whitespace before the answer is dropped
    CONTENT = enum.auto()  # the answer: passed through as it comes


def _partial_tail(text: str, marker: str) -> int:
    """Length of the longest end of ``text`` that is a proper start of ``marker``."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class ReasoningSplitter:
    """Splits streamed output into reasoning and content pieces.

    ``feed`` returns what can be released now; it holds back only what the
    following text could still change: leading whitespace and a partial
    opener at the start, whitespace at the end of the thought, and a tail
    that could be the start of the closer (``</thi``). ``finish`` releases the
    rest. For any chunking, the joined pieces equal ``split_reasoning``.
    """

    def __init__(self, fmt: ReasoningFormat, in_thought: bool) -> None:
        self._fmt = fmt
        self._state = _State.THOUGHT_LEAD if in_thought else _State.LEAD
        self._thought_seen = in_thought
        self._held = ""

    @property
    def thought_seen(self) -> bool:
        """A thought was opened, by the prompt or the model."""
        return self._thought_seen

    @property
    def in_thought(self) -> bool:
        """The output so far ends inside an open thought."""
        return self._state in (_State.THOUGHT_LEAD, _State.THOUGHT)

    @property
    def thought_over(self) -> bool:
        """No (further) thought can come: it closed, or the output started with an answer."""
        return self._state in (_State.AFTER, _State.CONTENT)

    def feed(self, text: str) -> list[Piece]:
        fmt = self._fmt
        held = self._held + text
        out: list[Piece] = []
        while True:
            state = self._state
            if state is _State.LEAD:
                rest = held.lstrip()
                if rest.startswith(fmt.opener):
                    held = rest[len(fmt.opener):]
                    self._state = _State.THOUGHT_LEAD
                    self._thought_seen = True
                elif fmt.opener.startswith(rest):
                    break
                else:
                    self._state = _State.CONTENT
            elif state is _State.THOUGHT_LEAD or state is _State.AFTER:
                held = held.lstrip()
                if not held:
                    break
                self._state = _State.THOUGHT if state is _State.THOUGHT_LEAD else _State.CONTENT
            elif state is _State.THOUGHT:
                end = held.find(fmt.closer)
                if end >= 0:
                    _put(out, "reasoning", held[:end].rstrip())
                    held = held[end + len(fmt.closer):]
                    self._state = _State.AFTER
                    continue
                ready = held[: len(held) - _partial_tail(held, fmt.closer)].rstrip()
                _put(out, "reasoning", ready)
                held = held[len(ready):]
                break
            else:
                _put(out, "content", held)
                held = ""
                break
        self._held = held
        return out

    def finish(self) -> list[Piece]:
        """Releases what was held: an unfinished opener is content, an open
        thought's tail (a partial closer included) is reasoning."""
        out: list[Piece] = []
        if self._state is _State.LEAD:
            _put(out, "content", self._held)
        elif self._state is _State.THOUGHT:
            _put(out, "reasoning", self._held.rstrip())
        self._held = ""
        return out


def _put(out: list[Piece], kind: Kind, text: str) -> None:
    if text:
        out.append((kind, text))


def split_reasoning(fmt: ReasoningFormat, text: str, in_thought: bool) -> tuple[str | None, str]:
    """(reasoning, content) of a whole output: reasoning None when no thought
    was opened, "" for an empty one."""
    splitter = ReasoningSplitter(fmt, in_thought)
    pieces = splitter.feed(text) + splitter.finish()
    reasoning = "".join(t for k, t in pieces if k == "reasoning")
    content = "".join(t for k, t in pieces if k == "content")
    return (reasoning if splitter.thought_seen else None), content


class ThoughtBudget:
    """Counts a thought's generated tokens and says when to force its close.

    ``budget`` is llama-server's reasoning_budget: -1 unrestricted, 0 closes
    the thought at once, N lets N tokens of thought be generated and then
    forces the close. The count starts after the opener: with the prompt
    holding it, from the first generated token; when the model opens the
    thought itself, from the token after the one that completes the opener.
    A thought the model closes itself, or an output that starts with its
    answer, is never forced. After a close is forced the budget is spent;
    the forced text need not be fed back.
    """

    def __init__(self, fmt: ReasoningFormat, in_thought: bool, budget: int) -> None:
        self._fmt = fmt
        self._budget = budget
        self._splitter = ReasoningSplitter(fmt, in_thought)
        self._count = 0
        self._spent = budget < 0

    def start(self) -> str | None:
        """Before the first token: the close to force now (budget 0 with the
        prompt's thought open), else None."""
        if not self._spent and self._budget == 0 and self._splitter.in_thought:
            return self._force()
        return None

    def feed(self, token_text: str) -> str | None:
        """After each generated token's text, in order: the close to force
        now, else None."""
        if self._spent:
            return None
        was_in_thought = self._splitter.in_thought
        self._splitter.feed(token_text)
        if self._splitter.thought_over:
            self._spent = True
            return None
        if not self._splitter.in_thought:
            return None
        if was_in_thought:
            self._count += 1
        return self._force() if self._count >= self._budget else None

    def _force(self) -> str:
        self._spent = True
        return self._fmt.close


EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
FORMATS = ("none", "auto", "deepseek", "deepseek-legacy")


@dataclass(frozen=True)
class ReasoningRequest:
    """What a request asks of thinking, validated."""

    # chat_template_kwargs to render with, enable_thinking settled from the effort.
    template_kwargs: dict[str, Any]
    # What the template is told; None leaves the template's own default.
    enable_thinking: bool | None
    effort: str | None
    # Tokens of thought before the close is forced; -1 unrestricted.
    budget: int
    reasoning_format: str
    # Written before the forced close (llama-server's reasoning_budget_message); "" none.
    budget_message: str = ""

    @property
    def split(self) -> bool:
        """Whether output is split at all: "none" returns the raw text as content."""
        return self.reasoning_format != "none"

    @property
    def raw_content(self) -> bool:
        """llama-server's "deepseek-legacy": content keeps the raw text, markers
        and all, while reasoning_content is filled as well."""
        return self.reasoning_format == "deepseek-legacy"


def resolve_reasoning_request(body: Mapping[str, Any]) -> ReasoningRequest:
    """Validates a request's chat_template_kwargs, reasoning_effort,
    reasoning_budget, reasoning_budget_message and reasoning_format (null is
    unset for each) and settles them as llama-server does: effort "none"
    tells the template enable_thinking=false, every other effort word true
    and the effort itself (as `reasoning_effort`, which templates such as
    gpt-oss's write into the prompt), and an explicit
    chat_template_kwargs.enable_thinking wins over the effort. A request
    naming neither keeps the template's default. Raises InvalidRequestError
    naming the field."""
    kwargs = body.get("chat_template_kwargs")
    if kwargs is None:
        kwargs = {}
    elif not isinstance(kwargs, dict):
        raise InvalidRequestError(f"chat_template_kwargs: expected an object, got {_sent(kwargs)}")
    kwargs = dict(kwargs)

    enable = kwargs.get("enable_thinking")
    if "enable_thinking" in kwargs and not isinstance(enable, bool):
        raise InvalidRequestError(
            f"chat_template_kwargs.enable_thinking: expected a boolean, got {_sent(enable)}"
        )

    effort = body.get("reasoning_effort")
    if effort is not None and effort not in EFFORTS:
        raise InvalidRequestError(f"reasoning_effort: expected one of {', '.join(EFFORTS)}, got {_sent(effort)}")
    if effort is not None and "enable_thinking" not in kwargs:
        enable = effort != "none"
        kwargs["enable_thinking"] = enable
    # The effort's word is the template's to read, over a kwarg of that name, as llama-server gives it.
    if effort == "none":
        kwargs.pop("reasoning_effort", None)
    elif effort is not None:
        kwargs["reasoning_effort"] = effort

    budget = body.get("reasoning_budget")
    if budget is None:
        budget = -1
    elif isinstance(budget, bool) or not isinstance(budget, int) or budget < -1:
        raise InvalidRequestError(f"reasoning_budget: expected an integer >= -1 (-1 unrestricted), got {_sent(budget)}")

    fmt = body.get("reasoning_format")
    if fmt is None:
        fmt = "auto"
    elif fmt not in FORMATS:
        raise InvalidRequestError(f"reasoning_format: expected one of {', '.join(FORMATS)}, got {_sent(fmt)}")

    message = body.get("reasoning_budget_message")
    if message is None:
        message = ""
    elif not isinstance(message, str):
        raise InvalidRequestError(f"reasoning_budget_message: expected a string, got {_sent(message)}")

    return ReasoningRequest(
        template_kwargs=kwargs, enable_thinking=enable, effort=effort, budget=budget, reasoning_format=fmt,
        budget_message=message,
    )


def _sent(value: object) -> str:
    # Errors quote what the client sent, as JSON; a whole array or object would be noise.
    if isinstance(value, (list, tuple)):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return json.dumps(value)
