"""Request bodies as typed structs and their checks: what every route accepts,
decoded once with msgspec (unknown fields ignored, as OpenAI and llama-server
clients send many), ranges checked here, failures raised as 400s naming the field."""

from __future__ import annotations

import json
import math
import re
from typing import Any, Callable

import msgspec

from ember.chat.request import AnswerFormat, ChatRequest as Chat
from ember.sampling import SamplingParams
from ember.server.errors import ApiError

__all__ = [
    "ChatMessage", "ChatRequest", "CoreSampling", "TextCompletionRequest", "LlamaCompletionRequest", "InfillRequest",
    "TokenizeRequest", "DetokenizeRequest", "ApplyTemplateRequest", "decode", "sampling_options",
    "chat_messages", "ROLES",
]

ROLES = ("system", "developer", "user", "assistant", "tool", "function")
_AT = re.compile(r" - at `\$\.?(.*)`$")
_MAX_LOGPROBS = 20


class ContentPart(msgspec.Struct, forbid_unknown_fields=False):
    type: str
    text: str | None = None


class ChatMessage(msgspec.Struct, forbid_unknown_fields=False):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class StreamOptions(msgspec.Struct, forbid_unknown_fields=False):
    include_usage: bool = False


class Unhonoured(msgspec.Struct, forbid_unknown_fields=False):
    """llama-server's fields ember knows but cannot honour yet, read on every
    generating route (its clients send them everywhere) so that a request
    setting one is refused by name instead of being served as if it were
    absent ([`refuse_unhonoured`])."""

    mirostat: Any = None
    dry_multiplier: Any = None
    xtc_probability: Any = None
    top_n_sigma: Any = None
    dynatemp_range: Any = None
    adaptive_target: Any = None
    min_keep: Any = None
    lora: Any = None
    grammar_lazy: Any = None


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class Sampling(Unhonoured):
    """The fields OpenAI and llama-server share; defaults are llama-server's."""

    stream: bool = False
    stop: str | list[str] | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    typical_p: float | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    seed: int | None = None
    # OpenAI: {"token id": bias}; llama-server also takes [[id, bias], ...] with bias false for "never",
    # and a text in place of an id for each of its tokens
    logit_bias: dict[str, float | bool] | list[list[Any]] | None = None
    ignore_eos: bool = False
    # llama-server's: the finished reply carries `__verbose`, its own /completion body (default: -v)
    verbose: bool | None = None
    # llama-server's, in a stream: every chunk carries `timings`, and the prompt's reading is
    # reported (`prompt_progress`) before its first pass and after each
    timings_per_token: bool = False
    return_progress: bool = False
    # Structured output (checked and compiled by `grammar_option`).
    response_format: Any = None
    grammar: Any = None
    json_schema: Any = None
    tool_choice: Any = None
    # llama-server's code-completion rules (`ember.model.LineRules`)
    n_indent: int | None = None
    t_max_predict_ms: float | None = None
    # llama-server's chain: sampler names in order, or one letter each in a string
    samplers: Any = None
    # seconds a stream waits silent before an SSE comment keeps its connection (-1: never)
    sse_ping_interval: int | None = None


# (field, is it set to something ember would have to act on?, why it is refused)
_UNHONOURED = [
    ("mirostat", lambda v: v not in (None, 0), "the mirostat sampler is not supported"),
    ("dry_multiplier", lambda v: v not in (None, 0, 0.0), "the DRY sampler is not supported"),
    ("xtc_probability", lambda v: v not in (None, 0, 0.0), "the XTC sampler is not supported"),
    ("top_n_sigma", lambda v: v not in (None, -1, -1.0, 0, 0.0), "the top-n-sigma sampler is not supported"),
    ("dynatemp_range", lambda v: v not in (None, 0, 0.0), "dynamic temperature is not supported"),
    ("adaptive_target", lambda v: v is not None and not (_number(v) and v < 0),
     "the adaptive sampler is not supported"),
    ("min_keep", lambda v: v not in (None, 0), "a floor on the candidates each sampler keeps is not supported"),
    ("lora", lambda v: bool(v), "LoRA adapters are not supported"),
    ("grammar_lazy", lambda v: bool(v), "a grammar that waits for a trigger is not supported; a grammar holds from "
     "the first token"),
]


def refuse_unhonoured(req: Unhonoured) -> None:
    for name, is_set, why in _UNHONOURED:
        if is_set(getattr(req, name)):
            raise ApiError(400, f"{name}: {why}", param=name)


class CoreSampling(Unhonoured):
    """The sampling fields read on the routes whose own API names fewer
    (Anthropic's messages, OpenAI's responses): theirs, and llama-server's,
    which its clients send on every route (those it cannot honour refused as
    on the others)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    typical_p: float | None = None
    seed: int | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float | bool] | list[list[Any]] | None = None
    ignore_eos: bool = False
    grammar: Any = None
    # llama-server's: a JSON Schema the answer is held to (read by each route's answer format)
    json_schema: Any = None
    n_indent: int | None = None
    t_max_predict_ms: float | None = None
    samplers: Any = None

    def sampling(self) -> dict:
        """The sampling fields as `Sampling`'s keywords (the answer's format
        is each route's own to read)."""
        return {name: getattr(self, name) for name in CoreSampling.__struct_fields__
                if name not in ("grammar", "json_schema")}


class OpenAIRequest(Sampling):
    """The fields OpenAI's two generating routes share beyond sampling."""

    # The reply's length: n_predict, or (llama-server's other names for it, read in this order)
    # max_completion_tokens, max_tokens
    n_predict: int | None = None
    max_completion_tokens: int | None = None
    max_tokens: int | None = None
    # /completion's own ways of asking for probabilities and choices, refused by name here
    # (`refuse_completion_fields`): OpenAI's logprobs and n say the same in this API's shapes.
    n_probs: Any = None
    post_sampling_probs: Any = None
    n_cmpl: Any = None

    def refuse_completion_fields(self, probs: str) -> None:
        for name, instead in (("n_probs", probs), ("post_sampling_probs", probs), ("n_cmpl", "n")):
            if getattr(self, name) not in (None, False):
                raise ApiError(400, f"{name}: /completion's field; on this route send {instead}", param=name)


class ChatRequest(OpenAIRequest):
    messages: list[ChatMessage] = []
    model: str | None = None
    n: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    stream_options: StreamOptions | None = None
    tools: list[dict[str, Any]] | None = None
    parallel_tool_calls: Any = None
    chat_template_kwargs: Any = None
    reasoning_effort: Any = None
    # The thought's budget under its three names (llama-server reads the first two, in this order)
    reasoning_budget_tokens: Any = None
    thinking_budget_tokens: Any = None
    reasoning_budget: Any = None
    reasoning_budget_message: Any = None
    reasoning_format: Any = None
    # llama-server's: the thought may be ended while it runs (POST /v1/chat/completions/control)
    reasoning_control: bool = False
    # llama-server's and vLLM's: a reply's turn opened (the default), or the last assistant
    # message continued (which ember does by default when the conversation ends in one)
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    # llama-server's, read on its chat route as on /completion
    cache_prompt: bool | None = None
    id_slot: int = -1
    # Read so that a request setting them is refused by name (`refuse_unserved`).
    functions: Any = None
    function_call: Any = None
    modalities: Any = None
    audio: Any = None
    web_search_options: Any = None
    verbosity: Any = None

    def refuse_unserved(self) -> None:
        """OpenAI's fields for what this server does not do, refused rather
        than answered as if they were absent."""
        for name, why in (("functions", "the deprecated form of tools; send tools"),
                          ("function_call", "the deprecated form of tool_choice; send tool_choice"),
                          ("audio", "this server answers in text only"),
                          ("web_search_options", "this server searches nothing")):
            if getattr(self, name) is not None:
                raise ApiError(400, f"{name}: {why}", param=name)
        if self.modalities is not None and self.modalities != ["text"]:
            raise ApiError(400, f'modalities: this server answers in text only (["text"]), got '
                           f"{json.dumps(self.modalities)[:40]}", param="modalities")
        if self.verbosity not in (None, "medium"):
            raise ApiError(400, f"verbosity: this server does not steer an answer's length (medium only); "
                           f"max_tokens bounds it, got {json.dumps(self.verbosity)[:40]}", param="verbosity")

    def prefill(self, server_default: bool) -> bool:
        """Whether the assistant's last words are continued: asked by
        continue_final_message, else the server's default."""
        return bool(self.continue_final_message) or server_default

    def generation_prompt(self, prefill: bool = True) -> bool:
        """Whether the prompt opens the reply's turn (or, with `prefill`,
        continues the assistant's last words); False leaves the last turn as
        it is."""
        if self.continue_final_message:
            if self.add_generation_prompt:
                raise ApiError(400, "continue_final_message: cannot be true with add_generation_prompt true (one "
                               "opens a new turn, the other continues the last)", param="continue_final_message")
            last = self.messages[-1] if self.messages else None
            if last is None or last.role != "assistant" or last.tool_calls:
                raise ApiError(400, "continue_final_message: the last message must be the assistant's words (not "
                               "its tool calls) to continue", param="continue_final_message")
            return True
        opened = self.add_generation_prompt is not False
        m = self.messages
        if prefill and opened and len(m) >= 2 and m[-1].role == m[-2].role == "assistant" and not m[-1].tool_calls:
            # The last is continued (the assistant's prefill); what the one before it is, is not clear.
            raise ApiError(400, f"messages[{len(m) - 1}]: two assistant messages end the conversation; the last is "
                           "continued, so it may follow only another role's turn", param=f"messages[{len(m) - 1}]")
        return opened

    def chat(self) -> Chat:
        """The chat core's request (its answer format compiled, so a bad
        schema is a 400 before any slot is taken)."""
        return Chat(
            messages=chat_messages(self.messages), tools=self.tools, tool_choice=self.tool_choice,
            parallel_tool_calls=self.parallel_tool_calls, answer=chat_answer(self),
            chat_template_kwargs=self.chat_template_kwargs, reasoning_effort=self.reasoning_effort,
            reasoning_budget=self.thought_budget(), reasoning_budget_message=self.reasoning_budget_message,
            reasoning_format=self.reasoning_format, reasoning_control=self.reasoning_control)

    def thought_budget(self) -> Any:
        """The budget the request gives under any of its names (checked by
        the chat core); two names giving different budgets are refused."""
        names = ("reasoning_budget_tokens", "thinking_budget_tokens", "reasoning_budget")
        given = [(n, getattr(self, n)) for n in names if getattr(self, n) is not None]
        (a, va), *rest = given or [(None, None)]
        for b, vb in rest:
            if json.dumps(vb) != json.dumps(va):
                raise ApiError(400, f"{b}: {json.dumps(vb)[:40]}, where {a} says {json.dumps(va)[:40]}; send one",
                               param=b)
        return given[0][1] if given else None


class TextCompletionRequest(OpenAIRequest):
    # a string, token ids, or a one-string list (msgspec takes one array type per union: checked by hand)
    prompt: str | list[Any] = ""
    model: str | None = None
    n: int | None = None
    echo: bool = False
    logprobs: int | None = None
    stream_options: StreamOptions | None = None
    # the text after an insertion (written in the model's fill-in-the-middle tokens)
    suffix: str | None = None
    # Read so that a request setting it is refused by name (see `check_text_completion`).
    best_of: int | None = None


def check_text_completion(req: TextCompletionRequest) -> None:
    req.refuse_completion_fields("logprobs")
    if req.suffix and req.echo:
        raise ApiError(400, "echo: cannot go with suffix (an insertion's prompt is written in fill-in-the-middle "
                       "tokens, not echoed)", param="echo")
    if req.best_of not in (None, 1):
        raise ApiError(400, f"best_of: ember answers one completion per request, got best_of={req.best_of}",
                       param="best_of")


class LlamaCompletionRequest(Sampling):
    # the probabilities after the samplers, as `prob`/`top_probs` (else the model's, as log-probabilities)
    post_sampling_probs: bool = False
    # a string, token ids, ids and strings mixed, {"prompt_string": ...}, or a list of those
    # (read by the route: msgspec takes one array type per union)
    prompt: str | list[Any] | dict[str, Any] = ""
    # n_predict, or (llama-server's other names for it, read in this order) max_completion_tokens, max_tokens
    n_predict: int | None = None
    max_completion_tokens: int | None = None
    max_tokens: int | None = None
    # n_probs, or its other name logprobs where it is absent
    n_probs: int | None = None
    logprobs: int | None = None
    # completions of each prompt: n_cmpl, or n where it is absent
    n_cmpl: int | None = None
    n: int | None = None
    cache_prompt: bool | None = None
    return_tokens: bool = False
    id_slot: int = -1
    # the paths ("timings/predicted_n") of the final result's fields to answer, each under its path
    response_fields: list[str] | None = None


class InfillChunk(msgspec.Struct, forbid_unknown_fields=False):
    text: str
    filename: str = "tmp"


class InfillRequest(LlamaCompletionRequest):
    # each a string, or token ids and strings mixed (as /completion's prompt); both required
    input_prefix: str | list[Any] | None = None
    input_suffix: str | list[Any] | None = None
    # files of context put before the prefix
    input_extra: list[InfillChunk] | None = None


def reply_length(req: OpenAIRequest | LlamaCompletionRequest, default: int) -> int:
    """The reply's most tokens, as llama-server reads them on every route."""
    return max_tokens(*first_set(req, "n_predict", "max_completion_tokens", "max_tokens"), default)


def first_set(req: msgspec.Struct, *names: str) -> tuple[str, Any]:
    """The first of a field's `names` (its own, then its other spellings) the
    request set, and its value; the first name and None where it set none."""
    for name in names:
        if getattr(req, name) is not None:
            return name, getattr(req, name)
    return names[0], None


class TokenizeRequest(msgspec.Struct, forbid_unknown_fields=False):
    content: str = ""
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(msgspec.Struct, forbid_unknown_fields=False):
    tokens: list[int] = []


class ApplyTemplateRequest(ChatRequest):
    """A chat request whose prompt is wanted, not its reply (llama-server's /apply-template)."""


def decode(body: bytes, type):
    if not body.strip():
        raise ApiError(400, "the request body is empty: expected a JSON object")
    try:
        return msgspec.json.decode(body, type=type)
    except msgspec.ValidationError as e:
        msg = str(e)
        m = _AT.search(msg)
        param = m.group(1) if m else None
        if param is not None:
            what = msg[: m.start()]
            raise ApiError(400, f"{param or 'body'}: {what[0].lower() + what[1:] if what else 'invalid'}", param=param or None)
        raise ApiError(400, f"invalid request: {msg}")
    except msgspec.DecodeError as e:
        raise ApiError(400, f"the request body is not valid JSON: {e}")
    except UnicodeDecodeError as e:
        raise ApiError(400, f"the request body is not valid UTF-8 (byte {e.start})")
    except RecursionError:
        raise ApiError(400, "the request body nests arrays or objects too deeply")


def _finite(name: str, v: float | None, lo: float | None = None, hi: float | None = None) -> None:
    if v is None:
        return
    if not math.isfinite(v):
        raise ApiError(400, f"{name}: must be a finite number", param=name)
    if lo is not None and v < lo:
        raise ApiError(400, f"{name}: must be >= {lo}, got {v}", param=name)
    if hi is not None and v > hi:
        raise ApiError(400, f"{name}: must be <= {hi}, got {v}", param=name)


#: Choices one request may ask for (each takes a slot).
MAX_CHOICES = 128


def check_n(n: int | None) -> int:
    """The choices asked for (OpenAI's `n`, 1 by default)."""
    if n is None:
        return 1
    if not 1 <= n <= MAX_CHOICES:
        raise ApiError(400, f"n: must be between 1 and {MAX_CHOICES}, got {n}", param="n")
    return n


def check_logprobs(name: str, v: int | None) -> None:
    if v is not None and not 0 <= v <= _MAX_LOGPROBS:
        raise ApiError(400, f"{name}: must be between 0 and {_MAX_LOGPROBS}, got {v}", param=name)


#: The largest count the engine takes (its counts are 32-bit, as llama.cpp's).
MAX_COUNT = 2**31 - 1


def max_tokens(name: str, v: int | None, default: int) -> int:
    """-1 (llama-server's 'until the context is full') or a count; 0 answers at once."""
    if v is None:
        v = default
    if v < -1:
        raise ApiError(400, f"{name}: must be >= -1, got {v}", param=name)
    if v > MAX_COUNT:
        raise ApiError(400, f"{name}: must be at most {MAX_COUNT}, got {v}", param=name)
    return v


def sampling_options(req: Sampling, n_vocab: int, defaults: SamplingParams,
                     tokenize: Callable[[str], list[int]] | None = None) -> SamplingParams:
    """The generation's options: the fields the request set, checked, and the
    server's `defaults` (llama-server's, the model file's and the flags') for
    the rest. The grammar is the route's to set (`grammar_option` for a
    completion, `answer_format` for a chat). `tokenize` reads a logit bias
    keyed by text (llama-server's), where a route takes one."""
    refuse_unhonoured(req)
    _finite("temperature", req.temperature, 0.0)
    _finite("top_p", req.top_p, 0.0, 1.0)
    _finite("min_p", req.min_p, 0.0, 1.0)
    _finite("typical_p", req.typical_p, 0.0, 1.0)
    _finite("repeat_penalty", req.repeat_penalty, 0.0)
    _finite("frequency_penalty", req.frequency_penalty, -2.0, 2.0)
    _finite("presence_penalty", req.presence_penalty, -2.0, 2.0)
    if req.top_k is not None and not 0 <= req.top_k <= MAX_COUNT:
        raise ApiError(400, f"top_k: must be between 0 and {MAX_COUNT}, got {req.top_k}", param="top_k")
    if req.repeat_last_n is not None and not -1 <= req.repeat_last_n <= MAX_COUNT:
        raise ApiError(400, f"repeat_last_n: must be between -1 and {MAX_COUNT}, got {req.repeat_last_n}",
                       param="repeat_last_n")
    params = defaults.copy()
    params.ignore_eos = params.ignore_eos or req.ignore_eos
    for f in _SET_AS_SENT:
        v = getattr(req, f)
        if v is not None:
            setattr(params, f, v)
    if req.seed is not None and req.seed != -1:
        if req.seed < 0 or req.seed >= 2**64:
            raise ApiError(400, f"seed: must be -1 or between 0 and 2^64-1, got {req.seed}", param="seed")
        params.seed = req.seed
    if req.stop is not None:
        stops = [req.stop] if isinstance(req.stop, str) else list(req.stop)
        if len(stops) > 16:
            raise ApiError(400, "stop: at most 16 stop strings", param="stop")
        params.stop = [s for s in stops if s]
    if req.logit_bias:
        params.logit_bias = _logit_bias(req.logit_bias, n_vocab, tokenize)
    if req.n_indent is not None:
        if not 0 <= req.n_indent <= MAX_COUNT:
            raise ApiError(400, f"n_indent: must be between 0 and {MAX_COUNT}, got {req.n_indent}", param="n_indent")
        params.n_indent = req.n_indent
    if req.t_max_predict_ms is not None:
        # llama-server reads 0 or less as no limit.
        _finite("t_max_predict_ms", req.t_max_predict_ms)
        params.t_max_predict_ms = max(0.0, req.t_max_predict_ms)
    if req.sse_ping_interval is not None:
        if not -1 <= req.sse_ping_interval <= MAX_COUNT:
            raise ApiError(400, f"sse_ping_interval: must be between -1 (never) and {MAX_COUNT} seconds, got "
                           f"{req.sse_ping_interval}", param="sse_ping_interval")
        params.sse_ping_interval = req.sse_ping_interval
    if req.samplers is not None:
        params.samplers = sampler_names(req.samplers)
    if params.samplers is not None:
        params.samplers = runnable_chain(params.samplers, params.top_k)
    return params


#: llama-server's samplers by the letter of each (a chain given as one string).
_SAMPLER_LETTERS = {"d": "dry", "k": "top_k", "y": "typ_p", "p": "top_p", "s": "top_n_sigma", "m": "min_p",
                    "t": "temperature", "x": "xtc", "i": "infill", "e": "penalties", "a": "adaptive_p"}


def _sampler_spellings() -> dict[str, str]:
    """Every spelling llama.cpp reads a sampler's name in (lower-cased): the
    name, with dashes for its underscores, without them, and three aliases."""
    out = {}
    for name in _SAMPLER_LETTERS.values():
        out.update({name: name, name.replace("_", "-"): name, name.replace("_", ""): name})
    out.update(nucleus="top_p", temp="temperature", typ="typ_p")
    return out


_SAMPLER_SPELLINGS = _sampler_spellings()
#: Stages ember lacks that do nothing at their off values, the only ones a request may give
#: them (`refuse_unhonoured`): named in a chain, they are left out of it.
_IDLE_STAGES = {"dry", "top_n_sigma", "xtc"}


def sampler_names(raw: Any, field: str = "samplers") -> list[str]:
    """llama-server's `samplers` (names in order, in any of llama.cpp's
    spellings, or a string of their letters) as the samplers' names."""
    if isinstance(raw, str):
        unknown = sorted(set(raw) - set(_SAMPLER_LETTERS))
        if unknown:
            raise ApiError(400, f"{field}: no sampler has the letter {unknown[0]!r} (known: "
                           f"{''.join(_SAMPLER_LETTERS)})", param=field)
        return [_SAMPLER_LETTERS[c] for c in raw]
    if not isinstance(raw, list) or not all(isinstance(n, str) for n in raw):
        raise ApiError(400, f"{field}: expected a list of sampler names or a string of their letters", param=field)
    for n in raw:
        if n.lower() not in _SAMPLER_SPELLINGS:
            raise ApiError(400, f"{field}: no sampler is named {n!r} (known: "
                           f"{', '.join(sorted(set(_SAMPLER_LETTERS.values())))})", param=field)
    return [_SAMPLER_SPELLINGS[n.lower()] for n in raw]


def runnable_chain(names: list[str], top_k: int) -> list[str]:
    """The stages of a named chain that run, checked as ember can run them
    as llama.cpp would."""
    if "adaptive_p" in names:
        raise ApiError(400, "samplers: the adaptive sampler is not supported", param="samplers")
    chain = [n for n in names if n not in _IDLE_STAGES]
    if "penalties" in chain[1:]:
        # ember takes the penalties as a row is read, before every other stage.
        raise ApiError(400, "samplers: the penalties run here only first in the chain", param="samplers")
    if "infill" in chain:
        before = chain[:chain.index("infill")]
        if "top_k" not in before or not 1 <= top_k <= MAX_INFILL_CANDIDATES:
            raise ApiError(400, f"samplers: the infill sampler compares every pair of candidates: it needs top_k "
                           f"(between 1 and {MAX_INFILL_CANDIDATES}) before it", param="samplers")
    return chain


#: As the engine's infill stage bounds it.
MAX_INFILL_CANDIDATES = 1024


#: The sampling fields taken as the request sent them (their ranges checked above).
_SET_AS_SENT = ("temperature", "top_k", "top_p", "min_p", "typical_p", "repeat_penalty", "repeat_last_n",
                "frequency_penalty", "presence_penalty")


def _response_format(rf: Any) -> tuple[Any, bool]:
    """(JSON Schema or None, whether any JSON object) from OpenAI's
    `response_format`, with llama-server's extension of a `schema` beside the type."""
    if not isinstance(rf, dict) or not isinstance(rf.get("type"), str):
        raise ApiError(400, 'response_format: expected {"type": "text" | "json_object" | "json_schema", ...}',
                       param="response_format")
    kind = rf["type"]
    if kind == "text":
        return None, False
    if kind == "json_object":
        schema = rf.get("schema")
        return (schema, False) if schema is not None else (None, True)
    if kind == "json_schema":
        wrapper = rf.get("json_schema")
        if wrapper is None and "schema" in rf:
            return rf["schema"], False
        if not isinstance(wrapper, dict):
            raise ApiError(400, "response_format.json_schema: expected an object carrying the schema",
                           param="response_format")
        # OpenAI lets the schema be left out: any JSON value then, as llama-server reads it.
        return wrapper.get("schema", {}), False
    raise ApiError(400, f"response_format.type: expected text, json_object or json_schema, got {kind!r}",
                   param="response_format")


def grammar_option(req: Sampling):
    """The compiled grammar the request's `response_format`, `json_schema` or
    `grammar` asks for, or None. Compiled here, before any slot is taken, so a
    bad schema or grammar is a 400 naming its field and never a 200 with
    unconstrained output."""
    answer = answer_format(_asked(req))
    return answer.grammar if answer is not None else None


def chat_answer(req: Sampling) -> AnswerFormat | None:
    """The chat request's answer format from the same fields."""
    return answer_format(_asked(req))


def _asked(req: Sampling) -> list[tuple[str, dict]]:
    asked = []
    if req.response_format is not None:
        schema, json_object = _response_format(req.response_format)
        if schema is not None or json_object:
            asked.append(("response_format", {"json_schema": schema, "json_object": json_object}))
    return asked + extension_answers(req)


def extension_answers(req) -> list[tuple[str, dict]]:
    """The answer formats every route reads beside its API's own: llama-server's
    `json_schema` and ember's `grammar`, as `answer_format`'s entries."""
    asked = []
    if req.json_schema is not None:
        asked.append(("json_schema", {"json_schema": req.json_schema}))
    if req.grammar not in (None, ""):
        asked.append(("grammar", {"grammar": req.grammar}))
    return asked


def answer_format(asked: list[tuple[str, dict]]) -> AnswerFormat | None:
    """The answer's format from the fields of a request that ask for one,
    each as (its name, `compile_grammar`'s keywords for it): one at most, a
    second refused by name, what cannot be compiled a 400 naming its field."""
    from ember.errors import InvalidRequestError
    from ember.structured import compile_grammar

    if not asked:
        return None
    if len(asked) > 1:
        (first, _), (second, _) = asked[:2]
        raise ApiError(400, f"{second}: cannot be combined with {first}; give one grammar or schema", param=second)
    (name, kwargs), = asked
    try:
        grammar = compile_grammar(**kwargs)
    except InvalidRequestError as e:
        msg = str(e)
        raise ApiError(400, msg if msg.startswith(f"{name}:") else f"{name}: {msg}", param=name)
    return AnswerFormat(grammar, gbnf="grammar" in kwargs)


def text_tokens(model) -> Callable[[str], list[int]]:
    """A logit bias's text as llama-server reads it: its tokens, no special ones."""
    return lambda text: model.tokenize(text, add_special=False, parse_special=False)


def _logit_bias(raw, n_vocab: int, tokenize: Callable[[str], list[int]] | None) -> dict[int, float]:
    """Token id -> bias. A key that is not an id is a text whose every token
    gets the bias (llama-server's), on the routes that can tokenize."""
    out: dict[int, float] = {}
    what = "token ids or texts" if tokenize else "token ids"
    for item in raw.items() if isinstance(raw, dict) else raw:
        if not isinstance(raw, dict) and (not isinstance(item, list) or len(item) != 2):
            pair = "[token id or text, bias]" if tokenize else "[token id, bias]"
            raise ApiError(400, f"logit_bias: expected {pair} pairs", param="logit_bias")
        key, bias = item
        if isinstance(key, bool) or not isinstance(key, (int, str)):
            raise ApiError(400, f"logit_bias: keys are {what}, got {json.dumps(key)}", param="logit_bias")
        if isinstance(key, int):
            toks = [key]
        else:
            try:
                toks = [int(key)]
            except ValueError:
                if tokenize is None or not key:
                    raise ApiError(400, f"logit_bias: keys are {what}, got {key!r}", param="logit_bias") from None
                toks = tokenize(key)
        if bias is False:
            bias = -math.inf
        elif isinstance(bias, bool) or not isinstance(bias, (int, float)):
            raise ApiError(400, "logit_bias: a bias is a number, or false for 'never'", param="logit_bias")
        elif not math.isfinite(bias):
            raise ApiError(400, "logit_bias: biases must be finite", param="logit_bias")
        for tok in toks:
            if not 0 <= tok < n_vocab:
                raise ApiError(400, f"logit_bias: token id {tok} is outside the vocabulary (0..{n_vocab - 1})",
                               param="logit_bias")
            out[tok] = float(bias)
    return out


def chat_messages(msgs: list[ChatMessage], name: str = "messages") -> list[dict]:
    """The dicts a chat template reads: content parts joined to text."""
    if not msgs:
        raise ApiError(400, f"{name}: at least one message is required", param=name)
    out = []
    for i, m in enumerate(msgs):
        if m.role not in ROLES:
            raise ApiError(400, f"{name}[{i}].role: unknown role {m.role!r} (expected one of {', '.join(ROLES)})",
                           param=f"{name}[{i}].role")
        content = m.content
        if content is None and not (m.role == "assistant" and m.tool_calls):
            # As OpenAI: only an assistant's turn that is all calls may leave its content out.
            raise ApiError(400, f"{name}[{i}].content: required (null only on an assistant message with tool_calls)",
                           param=f"{name}[{i}].content")
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if part.type != "text":
                    raise ApiError(400, f"{name}[{i}].content[{j}].type: {part.type!r} is not supported (text only)",
                                   param=f"{name}[{i}].content[{j}].type")
                if part.text is None:
                    raise ApiError(400, f"{name}[{i}].content[{j}].text: required for a text part",
                                   param=f"{name}[{i}].content[{j}].text")
                texts.append(part.text)
            content = "\n".join(texts)  # as llama.cpp joins a message's text parts
        d: dict = {"role": m.role, "content": content if content is not None else ""}
        if m.name is not None:
            d["name"] = m.name
        if m.tool_calls is not None:
            d["tool_calls"] = m.tool_calls
        if m.tool_call_id is not None:
            d["tool_call_id"] = m.tool_call_id
        if m.reasoning_content is not None:
            d["reasoning_content"] = m.reasoning_content
        out.append(d)
    return out
