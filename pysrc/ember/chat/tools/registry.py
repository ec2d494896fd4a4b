"""The framings ember reads, by name (``FRAMINGS``) and in the order a chat
template's markup is recognised in, and ``detect_framing``, which tells from a
template the one it writes. Adding a framing is one new module (its block
parser, grammar writer and Framing) and its entry here: FRAMINGS, and a place
in _DETECT_ORDER ahead of the framings whose probes its markup also matches."""

from __future__ import annotations

from collections.abc import Callable

from ember.chat.tools.framing import _PROBE_ID, _PROBE_KEY, _PROBE_NAME, _PROBE_USER, _PROBE_VALUE, Framing
from ember.chat.tools.gemma import FUNCTIONGEMMA, GEMMA4
from ember.chat.tools.generic import GENERIC
from ember.chat.tools.hermes import HERMES
from ember.chat.tools.llama3 import LLAMA3_JSON
from ember.chat.tools.mistral import MISTRAL, MISTRAL_ARGS
from ember.chat.tools.qwen3_coder import QWEN3_CODER


FRAMINGS: dict[str, Framing] = {
    f.name: f for f in (HERMES, QWEN3_CODER, LLAMA3_JSON, MISTRAL, MISTRAL_ARGS, GEMMA4, FUNCTIONGEMMA, GENERIC)
}

# The order framings are recognised in: the most specific markup first
# (Qwen3-Coder's call is inside a <tool_call> too; Hermes' and Mistral's
# hold the same {"name": ...} object that Llama 3 writes bare).
_DETECT_ORDER = (QWEN3_CODER, HERMES, GEMMA4, FUNCTIONGEMMA, MISTRAL_ARGS, MISTRAL, GENERIC, LLAMA3_JSON)


# ---------------------------------------------------------------------------
# Detection
# ---------------------------------------------------------------------------

Render = Callable[[list[dict], list[dict] | None], str]

_PROBE_TOOLS = [{
    "type": "function",
    "function": {
        "name": _PROBE_NAME,
        "description": "Answers the probe.",
        "parameters": {"type": "object", "properties": {_PROBE_KEY: {"type": "string"}}, "required": [_PROBE_KEY]},
    },
}]


def _probe_messages(content: str | None) -> list[dict]:
    return [
        {"role": "user", "content": _PROBE_USER},
        {"role": "assistant", "content": content, "tool_calls": [{
            "id": _PROBE_ID, "type": "function",
            "function": {"name": _PROBE_NAME, "arguments": {_PROBE_KEY: _PROBE_VALUE}},
        }]},
    ]


def _classify(rendered: str) -> Framing:
    # Declarations come before the user's turn in every template; the call is
    # after it. Reading only what follows keeps a declared name from counting.
    k = rendered.rfind(_PROBE_USER)
    tail = rendered[k + len(_PROBE_USER):] if k != -1 else rendered
    if _PROBE_NAME not in tail:
        return GENERIC  # the template ignores tool_calls
    for framing in _DETECT_ORDER:
        if framing.probe.search(tail):
            return framing
    return GENERIC  # markup this module cannot read: ask for JSON instead


def call_trigger(framing: Framing) -> str | None:
    """The fixed text a call opens with in ``framing``, which its call
    grammar also starts with: what a watched call (``tool_choice`` auto)
    waits for before holding the output to the grammar. None for framings
    whose calls open with bare JSON, which prose can also start with."""
    op = framing.openers[0]
    if op.anchored or len(op.parts) != 1 or not isinstance(op.parts[0], str):
        return None
    return op.parts[0]


def detect_framing(render: Render) -> Framing:
    """The framing a chat template writes calls in. ``render(messages,
    tools)`` renders a conversation to prompt text with the model's template.
    A sentinel call is rendered and the markup around it recognised; a
    template that fails on it, ignores it or writes unknown markup gets
    GENERIC."""
    for content in (None, ""):  # some templates concatenate content and fail on None
        try:
            rendered = render(_probe_messages(content), _PROBE_TOOLS)
        except Exception:
            continue
        return _classify(rendered)
    return GENERIC
