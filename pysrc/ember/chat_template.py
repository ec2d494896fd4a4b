"""Chat templates: renders a GGUF file's Hugging Face-style Jinja template the
way transformers does, in a sandbox, and supplies built-in ChatML and Gemma
templates for files that carry none.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime
from collections.abc import Container, Iterable
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

try:
    from ember.errors import InvalidRequestError, TemplateError
except ImportError:  # the compiled module is absent: keep this pure-Python module usable on its own

    class TemplateError(Exception):  # type: ignore[no-redef]
        """A chat template failed to parse or render (including its own raise_exception)."""

    class InvalidRequestError(ValueError):  # type: ignore[no-redef]
        """A request that cannot be served as given."""


__all__ = [
    "FALLBACKS",
    "NAMED",
    "InvalidRequestError",
    "TemplateError",
    "normalize_messages",
    "pick_fallback",
    "render_chat",
    "template_takes_content_parts",
]

# ChatML, as llama.cpp's built-in "chatml" writes it.
CHATML = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{ message['content'] }}{% endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

# Gemma's official template (Gemma 3's, text only): a system message becomes a
# prefix of the first user turn, "assistant" is spelled "model", turn text is
# trimmed. The official one also raises on non-alternating roles; a fallback
# for files without a template should render what it is given instead.
GEMMA = r"""{{ bos_token }}
{%- if messages and messages[0]['role'] == 'system' -%}
    {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if message['role'] == 'assistant' -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{ '<start_of_turn>model\n' }}
{%- endif -%}
"""

FALLBACKS: dict[str, str] = {"chatml": CHATML, "gemma": GEMMA}

# The text of a turn, or nothing for content parts a named template cannot read.
_TEXT = "(message['content'] if message['content'] is string else '')"

# llama-server's built-in templates by name (--chat-template NAME), for the
# families ember runs, written as llama.cpp's llama-chat.cpp writes them.
NAMED: dict[str, str] = {
    "chatml": CHATML,
    "gemma": GEMMA,
    "llama3": (
        "{%- for message in messages -%}"
        "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + " + _TEXT + " | trim "
        "+ '<|eot_id|>' -}}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}"
    ),
    # Llama 2 without system support: a system message is the first turn's opening line.
    "llama2": (
        "{{- '[INST] ' -}}"
        "{%- for message in messages -%}"
        "{%- if not loop.first and loop.previtem['role'] == 'assistant' -%}{{- '[INST] ' -}}{%- endif -%}"
        "{%- if message['role'] == 'system' -%}{{- " + _TEXT + " + '\\n' -}}"
        "{%- elif message['role'] == 'user' -%}{{- " + _TEXT + " + ' [/INST]' -}}"
        "{%- else -%}{{- " + _TEXT + " + '</s>' -}}{%- endif -%}"
        "{%- endfor -%}"
    ),
    "mistral-v7": (
        "{%- for message in messages -%}"
        "{%- if message['role'] == 'system' -%}{{- '[SYSTEM_PROMPT] ' + " + _TEXT + " + '[/SYSTEM_PROMPT]' -}}"
        "{%- elif message['role'] == 'user' -%}{{- '[INST] ' + " + _TEXT + " + '[/INST]' -}}"
        "{%- else -%}{{- ' ' + " + _TEXT + " + '</s>' -}}{%- endif -%}"
        "{%- endfor -%}"
    ),
    "phi3": (
        "{%- for message in messages -%}"
        "{{- '<|' + message['role'] + '|>\\n' + " + _TEXT + " + '<|end|>\\n' -}}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- endif -%}"
    ),
    "command-r": (
        "{%- for message in messages -%}"
        "{%- set tag = {'system': 'SYSTEM', 'user': 'USER', 'assistant': 'CHATBOT'}.get(message['role']) -%}"
        "{%- if tag -%}{{- '<|START_OF_TURN_TOKEN|><|' + tag + '_TOKEN|>' + " + _TEXT + " | trim "
        "+ '<|END_OF_TURN_TOKEN|>' -}}{%- endif -%}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' -}}{%- endif -%}"
    ),
    "zephyr": (
        "{%- for message in messages -%}"
        "{{- '<|' + message['role'] + '|>\\n' + " + _TEXT + " + '<|endoftext|>\\n' -}}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- endif -%}"
    ),
}

# Names the renderer sets itself (and the functions it gives the template);
# chat_template_kwargs may not replace them: a request that set bos_token
# would write its own markup, one that set raise_exception would unmake the
# template's own refusals.
_RESERVED = frozenset({"messages", "add_generation_prompt", "tools", "bos_token", "eos_token", "raise_exception",
                       "strftime_now"})


def pick_fallback(architecture: str, token_texts: Container[str]) -> str:
    """The built-in template for a file without one: Gemma's turn markup when
    the vocabulary has ``<start_of_turn>``, otherwise ChatML. The vocabulary
    decides rather than ``architecture``, since fine-tunes often keep an
    architecture but retrain the markup."""
    return "gemma" if "<start_of_turn>" in token_texts else "chatml"


class _GenerationTag(jinja2.ext.Extension):
    """transformers' ``{% generation %}...{% endgeneration %}`` marks assistant
    text for training masks; templates that use it must still parse, and for
    rendering the block is just its body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> list[nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


#: A rendered prompt past this many characters is refused (no context holds
#: it), and so is a render that runs past this many seconds.
MAX_RENDER_CHARS = 32 << 20
MAX_RENDER_SECONDS = 10.0


class _Sandbox(ImmutableSandboxedEnvironment):
    """The stock sandbox turns an unsafe attribute into an Undefined that only
    fails when used further, so ``{{ x.__class__ }}`` quietly renders as
    nothing. A chat template has no business there: fail at the touch."""

    def unsafe_undefined(self, obj: Any, attribute: str) -> jinja2.Undefined:
        raise SecurityError(f"access to attribute {attribute!r} of a {type(obj).__name__!r} object is unsafe")

    # A repetition or power is checked before it is made: `"x" * 10**9` would
    # be one allocation the render loop's bounds never see.
    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > MAX_RENDER_CHARS:
                    raise TemplateError(f"the chat template repeats a value past {MAX_RENDER_CHARS} elements "
                                        "(the bound on a rendered prompt)")
        if operator == "**" and isinstance(right, int) and isinstance(left, int) and abs(right) > 1024:
            raise TemplateError("the chat template raises a number to a power past 1024 (the bound)")
        return super().call_binop(context, operator, left, right)


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Jinja's own tojson HTML-escapes (<, >, &, ') and sorts keys; templates
    # are written against transformers' plain json.dumps.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=1)
def _env() -> _Sandbox:
    env = _Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["range"] = _range
    return env


def _syntax_error(e: jinja2.TemplateSyntaxError) -> TemplateError:
    return TemplateError(f"chat template syntax error at line {e.lineno}: {e.message}")


@lru_cache(maxsize=32)
def _compile(source: str) -> jinja2.Template:
    try:
        return _env().from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise _syntax_error(e) from None


def _is_content_ref(node: nodes.Node) -> bool:
    if isinstance(node, nodes.Getitem):
        return isinstance(node.arg, nodes.Const) and node.arg.value == "content"
    if isinstance(node, nodes.Getattr):
        return node.attr == "content"
    return isinstance(node, nodes.Name) and node.name == "content"


@lru_cache(maxsize=32)
def template_takes_content_parts(source: str) -> bool:
    """Whether the template itself walks a list of content parts (loops over
    ``message['content']``), as multimodal templates do; for all others ember
    flattens parts to a string first. The same test vLLM applies."""
    try:
        ast = _env().parse(source)
    except jinja2.TemplateSyntaxError as e:
        raise _syntax_error(e) from None
    return any(_is_content_ref(loop.iter) for loop in ast.find_all(nodes.For))


def normalize_messages(messages: Iterable[dict], *, keep_parts: bool = False) -> list[dict]:
    """Copies ``messages``, turning OpenAI-style content part lists
    (``[{"type": "text", "text": ...}, ...]``) into one string, the text parts
    joined by newlines as llama.cpp joins them, unless ``keep_parts``. Only
    text parts are accepted: ember serves text models."""
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidRequestError(f"messages[{i}]: expected an object, got {type(message).__name__}")
        message = dict(message)
        content = message.get("content")
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                kind = part.get("type") if isinstance(part, dict) else None
                if kind != "text" or not isinstance(part.get("text"), str):
                    raise InvalidRequestError(
                        f"messages[{i}].content[{j}]: only text parts are supported, got {kind or type(part).__name__!r}"
                    )
                texts.append(part["text"])
            if not keep_parts:
                message["content"] = "\n".join(texts)
        out.append(message)
    return out


#: Steps of `range` loops one render may take: nested loops that write
#: nothing would otherwise run on unseen by the output's bounds.
MAX_RANGE_STEPS = 10_000_000
_budget = threading.local()


def _range(*args: int):
    r = range(*args)
    if len(r) > 100_000:  # the sandbox's own bound on one range
        raise TemplateError(f"the chat template asked for a range of {len(r)} (at most 100000)")
    for i in r:
        _budget.steps -= 1
        if _budget.steps < 0:
            raise TemplateError(f"the chat template looped more than {MAX_RANGE_STEPS} times (the bound on a render)")
        yield i


def _bounded(compiled: jinja2.Template, context: dict) -> str:
    """The render, output piece by piece, stopped at the size and time bounds."""
    out: list[str] = []
    size, t0 = 0, time.monotonic()
    _budget.steps = MAX_RANGE_STEPS
    for piece in compiled.generate(context):
        size += len(piece)
        if size > MAX_RENDER_CHARS:
            raise TemplateError(f"the chat template rendered more than {MAX_RENDER_CHARS} characters "
                                "(the bound on a rendered prompt)")
        if time.monotonic() - t0 > MAX_RENDER_SECONDS:
            raise TemplateError(f"the chat template took more than {MAX_RENDER_SECONDS:.0f} s to render "
                                "(the bound on a render)")
        out.append(piece)
    return "".join(out)


def _spellings_of(kwargs: dict) -> dict:
    """The other names templates read the same switches by, as llama.cpp
    gives them: `preserve_reasoning` (keep earlier turns' thoughts) as
    GLM's `clear_thinking`, Nemotron's `truncate_history_thinking`,
    DeepSeek V4's `drop_thinking` and LFM's `preserve_thinking`; the effort
    as `reasoning_strength` too."""
    out: dict = {}
    keep = kwargs.get("preserve_reasoning")
    if isinstance(keep, bool):
        out.update(preserve_thinking=keep, clear_thinking=not keep, truncate_history_thinking=not keep,
                   drop_thinking=not keep)
    if isinstance(kwargs.get("reasoning_effort"), str):
        out["reasoning_strength"] = kwargs["reasoning_effort"]
    return out


def render_chat(
    template: str | None,
    messages: list[dict],
    *,
    add_generation_prompt: bool = True,
    bos_token: str = "",
    eos_token: str = "",
    tools: list[dict] | None = None,
    extra_kwargs: dict | None = None,
    fallback: str = "chatml",
) -> str:
    """Renders ``messages`` into a prompt with ``template`` (a Hugging Face
    chat template), or with the built-in ``fallback`` ("chatml" or "gemma")
    when ``template`` is None or empty.

    The context matches transformers': ``messages``, ``tools`` (None when not
    given, as there), ``add_generation_prompt``, ``bos_token``, ``eos_token``,
    the ``raise_exception`` and ``strftime_now`` functions, and
    ``extra_kwargs`` (a request's chat_template_kwargs). To those llama.cpp
    adds, and so does this, what its templates read of it: ``enable_thinking``
    true (its "auto": a template that thinks, thinks, even one written as
    ``if not enable_thinking``), and today's date as ``date_string``
    ("05 Dec 2026", Llama 3's) and ``datetime`` ("Dec 05 2026"); the
    extra kwargs replace them. Every failure of the template, its own
    ``raise_exception`` included, is a TemplateError.
    """
    if not template:
        try:
            template = FALLBACKS[fallback]
        except KeyError:
            raise ValueError(f"unknown fallback chat template {fallback!r}; known: {', '.join(FALLBACKS)}") from None
    compiled = _compile(template)
    msgs = normalize_messages(messages, keep_parts=template_takes_content_parts(template))
    today = datetime.now()
    context: dict[str, Any] = {"bos_token": bos_token, "eos_token": eos_token, "enable_thinking": True,
                               "date_string": today.strftime("%d %b %Y"), "datetime": today.strftime("%b %d %Y")}
    if extra_kwargs:
        clash = (_RESERVED | _env().globals.keys()).intersection(extra_kwargs)
        if clash:
            names = sorted(clash)
            raise InvalidRequestError(f"chat_template_kwargs.{names[0]}: the template's own variable "
                                      f"({', '.join(names)}) cannot be set by a request")
        context.update(extra_kwargs)
        context.update({k: v for k, v in _spellings_of(extra_kwargs).items() if k not in extra_kwargs})
    context.update(messages=msgs, tools=tools, add_generation_prompt=add_generation_prompt)
    try:
        return _bounded(compiled, context)
    except TemplateError:
        raise
    except SecurityError as e:
        raise TemplateError(f"chat template attempted an unsafe operation: {e}") from None
    except jinja2.UndefinedError as e:
        raise TemplateError(f"chat template used an undefined value: {e.message}") from None
    except jinja2.TemplateSyntaxError as e:  # from a template it includes or compiles late
        raise _syntax_error(e) from None
    except Exception as e:
        raise TemplateError(f"chat template failed: {type(e).__name__}: {e}") from None
