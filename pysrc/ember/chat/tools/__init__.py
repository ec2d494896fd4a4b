"""Tool calls: OpenAI's ``tools`` / ``tool_calls`` over the markup each model
family was trained to write.

A model calls a function by writing it in its own framing (Hermes'
``<tool_call>{json}</tool_call>``, Qwen3-Coder's XML, Llama 3's bare JSON,
Mistral's ``[TOOL_CALLS]``, Gemma's ``call:NAME{...}``). This package:

* reads which framing a model uses from its chat template (``detect_framing``:
  a call with sentinel values is rendered and the markup around it is
  recognised), falling back to a generic JSON framing described in the system
  prompt when the template has no tool support (``generic_tools_system_prompt``,
  ``apply_generic_tools``), as llama-server does;
* validates a request's ``tools`` / ``tool_choice`` / ``parallel_tool_calls``
  (``validate_tools``) and its tool history (``normalize_tool_messages``);
* writes the GBNF grammar that forces a call in the model's own framing when
  ``tool_choice`` requires one (``call_grammar``);
* parses output into ``tool_calls``, streamed (``ToolCallStream``) or whole
  (``parse_tool_calls``, which is the stream run over the whole text, so the
  two cannot disagree).

Layout: the shared machinery, then one module per framing, as vLLM's tool
parsers are laid out.

* ``request``: a request's tool fields and tool history, validated.
* ``reader``: what block parsers are written with (a resumable
  recursive-descent reader, JSON read as it arrives or written piece by piece).
* ``grammar``: the GBNF helpers the framings' grammar writers share.
* ``framing``: the ``Framing`` record, the helpers a framing's definition
  uses, and ``call_grammar`` (beside the Framing it reads; see there).
* ``hermes``, ``llama3``, ``mistral``, ``qwen3_coder``, ``gemma``, ``generic``:
  a framing each (two where they share markup): its block parser, its grammar
  writer and its ``Framing``.
* ``registry``: the framings by name and in recognition order, and
  ``detect_framing``; a new framing is a new module and its entry there.
* ``stream``: ``ToolCallStream`` and ``parse_tool_calls``, with the parsing
  rules every framing follows.

Imports go one way: the framing modules import the shared ones, the registry
imports the framing modules, and this package re-exports the public names.
"""

from ember.chat.tools.framing import Framing, call_grammar
from ember.chat.tools.gemma import FUNCTIONGEMMA, GEMMA4
from ember.chat.tools.generic import GENERIC, apply_generic_tools, generic_tools_system_prompt
from ember.chat.tools.grammar import SchemaRules
from ember.chat.tools.hermes import HERMES
from ember.chat.tools.llama3 import LLAMA3_JSON
from ember.chat.tools.mistral import MISTRAL, MISTRAL_ARGS
from ember.chat.tools.qwen3_coder import QWEN3_CODER
from ember.chat.tools.registry import FRAMINGS, call_trigger, detect_framing
from ember.chat.tools.request import ToolPlan, ToolRequestError, normalize_tool_messages, validate_tools
from ember.chat.tools.stream import ToolCall, ToolCallParseError, ToolCallStream, ToolEvent, parse_tool_calls

__all__ = [
    "call_trigger",
    "FRAMINGS",
    "FUNCTIONGEMMA",
    "Framing",
    "GEMMA4",
    "GENERIC",
    "HERMES",
    "LLAMA3_JSON",
    "MISTRAL",
    "MISTRAL_ARGS",
    "QWEN3_CODER",
    "SchemaRules",
    "ToolCall",
    "ToolCallParseError",
    "ToolCallStream",
    "ToolEvent",
    "ToolPlan",
    "ToolRequestError",
    "apply_generic_tools",
    "call_grammar",
    "detect_framing",
    "generic_tools_system_prompt",
    "normalize_tool_messages",
    "parse_tool_calls",
    "validate_tools",
]
