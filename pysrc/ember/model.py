"""The in-process API: load a GGUF model, tokenize, score, generate and chat.

The engine runs in Rust with the GIL released; this layer owns what a user of
the Python API sees: text in and out, stop strings, chat templates.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Sequence

from ember import _native
from ember.errors import InvalidRequestError
from ember.sampling import SamplingParams

if TYPE_CHECKING:
    import numpy as np

__all__ = ["Model", "Completion", "CompletionBuilder", "LineRules", "Piece"]


@dataclass
class Piece:
    """One drawn token and the text it released (empty while held back: an
    incomplete UTF-8 character, or a possible start of a stop string)."""

    text: str
    token: int | None
    #: log-probability of the token, when n_probs > 0
    logprob: float | None = None
    #: the n_probs most likely (token, log-probability) pairs at this draw
    top: list[tuple[int, float]] | None = None


@dataclass
class PromptProgress:
    """How far the reading of a prompt has come (llama-server's prompt_progress):
    sent before its first pass and after each, to a request that asked."""

    total: int
    #: prompt tokens the cache held (not read); `processed` counts them too
    cache: int
    processed: int
    #: milliseconds spent reading so far
    time_ms: float


@dataclass
class Completion:
    """A finished generation."""

    text: str
    tokens: list[int] = field(default_factory=list)
    #: "stop" (end of turn or a stop string), "length" (max_tokens) or "context" (context full)
    finish_reason: str = "stop"
    #: the stop string that ended the text, if one did
    stop_string: str | None = None
    n_prompt: int = 0
    #: prompt tokens reused from the cache the previous generation left (not read again)
    n_cached: int = 0
    #: milliseconds spent reading the prompt, and drawing the tokens after it
    prompt_ms: float = 0.0
    gen_ms: float = 0.0

    @property
    def cut(self) -> bool:
        """Whether a limit ended it (max_tokens or the context), not the model or a stop string."""
        return self.finish_reason in ("length", "context")


class StopMatcher:
    """Finds stop strings in streamed text, holding back any tail that could
    still grow into one, so no part of a stop string ever reaches the client."""

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self.pending = ""

    def push(self, text: str) -> tuple[str, str | None]:
        """Returns (text safe to emit, the stop string hit or None)."""
        self.pending += text
        if not self.stops:
            out, self.pending = self.pending, ""
            return out, None
        hits = [(self.pending.find(s), s) for s in self.stops]
        hits = [(i, s) for i, s in hits if i >= 0]
        if hits:
            i, s = min(hits)
            out, self.pending = self.pending[:i], ""
            return out, s
        hold = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(self.pending)), 0, -1):
                if self.pending.endswith(s[:n]):
                    hold = max(hold, n)
                    break
        cut = len(self.pending) - hold
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out, None

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


class LineRules:
    """llama-server's two rules for code completion, read line by line:
    `n_indent` ends the text at the first line after a newline whose
    indentation (spaces and tabs) is shorter, cut where that line's text
    starts; `t_max_predict_ms` ends it at a newline written after that long
    since the first token. The text of a line still being indented is held
    back, so a line the rule cuts is never shown."""

    def __init__(self, n_indent: int = 0, t_max_predict_ms: float = 0):
        self.n_indent = n_indent
        self.t_max_predict_ms = t_max_predict_ms
        #: the text since a newline is the new line's indentation so far
        self.indenting = False
        self.held = ""

    def push(self, text: str, ms_since_first: float) -> tuple[str, bool]:
        """Returns (text safe to emit, whether a rule ended the text)."""
        if self.n_indent <= 0:
            return text, self._timed_out(text, ms_since_first)
        out: list[str] = []
        for c in text:
            if self.indenting:
                if c in " \t":
                    self.held += c
                    continue
                # The line's text starts (an empty line's too, as llama-server reads it).
                if len(self.held) < self.n_indent:
                    out.append(self.held)
                    self.held = ""
                    return "".join(out), True
                self.indenting = False
                out.append(self.held)
                self.held = ""
            out.append(c)
            if c == "\n":
                self.indenting = True
        emitted = "".join(out)
        return emitted, self._timed_out(emitted, ms_since_first)

    def _timed_out(self, emitted: str, ms_since_first: float) -> bool:
        return self.t_max_predict_ms > 0 and "\n" in emitted and ms_since_first > self.t_max_predict_ms

    def flush(self) -> str:
        out, self.held = self.held, ""
        return out


class CompletionBuilder:
    """Turns a generation's draws into what a caller reads: a `Piece` per
    draw (stop strings held back, never shown), then the `Completion` with
    its finish reason and timings. Shared by `Model.stream_completion` and the
    server's engine, whose draws come from a batcher step."""

    def __init__(self, stops: Sequence[str], n_prompt: int, n_cached: int, n_probs: int, t_start: float,
                 lines: LineRules | None = None):
        self.matcher = StopMatcher(stops)
        self.lines = lines or LineRules()
        self.n_probs = n_probs
        self.t_start = t_start
        self.t_read: float | None = None
        self.pieces: list[str] = []
        #: how the prompt met what its slot held (a batcher's line), if it held anything
        self.resume: str | None = None
        self.done = Completion(text="", n_prompt=n_prompt, n_cached=n_cached, finish_reason="length")
        #: a line rule ended the text: what it held back is not shown
        self.ended_by_rule = False

    def prompt_read(self) -> None:
        """Marks the end of the prompt's reading (at the first draw at the latest)."""
        if self.t_read is None:
            self.t_read = time.perf_counter()
            self.done.prompt_ms = (self.t_read - self.t_start) * 1e3

    def draw(self, token: int, text: str, reason: str | None, logprob: float | None,
             top: list[tuple[int, float]]) -> tuple[list[Piece | Completion], bool]:
        """The events of one draw, and whether the completion has ended."""
        self.prompt_read()
        done = self.done
        done.tokens.append(token)
        out, hit = self.matcher.push(text)
        out, ruled = self.lines.push(out, (time.perf_counter() - self.t_read) * 1e3)
        self.pieces.append(out)
        events: list[Piece | Completion] = [Piece(out, token, logprob, top if self.n_probs else None)]
        if ruled:
            # As llama-server stops at these rules: at a limit, not the model's end.
            done.finish_reason = "length"
            self.ended_by_rule = True
            return events + self.finish(), True
        if hit is not None:
            done.finish_reason, done.stop_string = "stop", hit
            return events + self.finish(), True
        if reason is not None:
            done.finish_reason = reason
            return events + self.finish(), True
        return events, False

    def finish(self) -> list[Piece | Completion]:
        """The held-back tail (unless a stop string ended the text) and the `Completion`."""
        self.prompt_read()
        events: list[Piece | Completion] = []
        done = self.done
        if done.stop_string is None and not self.ended_by_rule:
            tail, ruled = self.lines.push(self.matcher.flush(), 0.0)
            if ruled:
                done.finish_reason = "length"
            tail += self.lines.flush()
            if tail:
                self.pieces.append(tail)
                events.append(Piece(tail, None))
        done.text = "".join(self.pieces)
        done.gen_ms = (time.perf_counter() - (self.t_read or self.t_start)) * 1e3
        events.append(done)
        return events


#: llama.cpp's pooling types, by their number in a GGUF's `{arch}.pooling_type`.
POOLINGS = ("none", "mean", "cls", "last", "rank")


def _normalized(v, norm: int):
    """`v` scaled as llama.cpp's `common_embd_normalize`."""
    import numpy as np

    if norm == -1:
        return v
    if norm < -1:
        raise InvalidRequestError(f"embd_normalize: expected -1, 0, 1, 2 or a larger p, got {norm}")
    top = np.abs(v).max()
    if top == 0:
        return v
    if norm == 0:
        total = top / 32760.0
    else:
        # The p-norm of v / max|v| first: large powers of the raw values overflow.
        total = top * ((np.abs(v) / top) ** norm).sum() ** (1.0 / norm)
    return v / total


def _grammar(grammar, json_schema):
    """A compiled grammar from GBNF text, a compiled one, or a JSON Schema."""
    if grammar is None and json_schema is None:
        return None
    from ember.structured import Grammar, compile_grammar

    if isinstance(grammar, Grammar):
        if json_schema is not None:
            raise InvalidRequestError("grammar: cannot be combined with json_schema; give one grammar or schema")
        return grammar
    return compile_grammar(grammar=grammar, json_schema=json_schema)


def _answer_schema(response_format) -> dict | bool | None:
    """The schema an OpenAI-shaped `response_format` holds the answer to
    (True: any JSON value; None: free text)."""
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return response_format.get("schema", True)
    if kind == "json_schema":
        inner = response_format.get("json_schema")
        schema = inner.get("schema") if isinstance(inner, dict) else None
        if not isinstance(schema, (dict, bool)):
            raise InvalidRequestError("response_format.json_schema: expected an object carrying the schema")
        return schema
    raise InvalidRequestError('response_format: expected {"type": "text" | "json_object" | "json_schema", ...}')


def _max_tokens(n: int) -> int:
    if n < 0:
        raise InvalidRequestError("max_tokens: must be >= 0")
    return n


def sampling_params(params: SamplingParams | None = None, json_schema: dict | bool | None = None,
                    **fields) -> SamplingParams:
    """`params`, or the `SamplingParams` of `fields` (a stop string alone,
    a grammar as GBNF text or compiled, `json_schema` compiled to one)."""
    if params is not None:
        if fields or json_schema is not None:
            raise TypeError("give the generation's options as params or as keywords, not both")
        return params
    if "stop" in fields:
        fields["stop"] = _check_stop(fields["stop"])
    if fields.get("logit_bias") is None:
        fields.pop("logit_bias", None)
    grammar = _grammar(fields.pop("grammar", None), json_schema)
    return SamplingParams(grammar=grammar, **fields)


def _check_stop(stop: str | Sequence[str] | None) -> list[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    stops = list(stop)
    for s in stops:
        if not isinstance(s, str):
            raise InvalidRequestError(f"stop: expected strings, got {type(s).__name__}")
    return stops


class Model:
    """A GGUF model loaded for inference.

    ``Model()`` with no path loads ember's default model (SmolLM2-135M-Instruct),
    fetching it once into the user's cache.
    """

    def __init__(
        self,
        path: str | os.PathLike | None = None,
        *,
        n_ctx: int = 0,
        threads: int = 0,
        kv_type: str = "f16",
        max_batch: int = 512,
        gpu_layers: int | str | None = None,
        device: str | None = None,
    ):
        """`gpu_layers` and `device` are llama-server's -ngl and --device:
        naming a device (``device="Vulkan0"``) runs every layer and the
        output head there, or raises `DeviceError` saying why it cannot;
        ``gpu_layers="all"`` alone takes the first card, and without one the
        model runs on the CPU with the reason in `device_note`. ember puts a
        whole model on the device or none of it, so a count of layers below
        the model's is refused."""
        from ember.devices import request

        if path is None:
            from ember.fetch import default_model_path

            path = default_model_path()
        self.path = Path(path)
        if not self.path.is_file():
            raise _native.ModelLoadError(f"{self.path}: no such file")
        where = request(gpu_layers, device)
        self._native = _native.Model(str(self.path), n_ctx, threads, kv_type, max_batch, where.device, where.layers,
                                     where.strict)
        #: most tokens one forward pass reads
        self.max_batch = max_batch
        self._template: str | None = self._native.metadata("tokenizer.chat_template")
        #: the tool-call framing of each chat template used, found once (see `chat`)
        self._framings: dict = {}
        self._control_spellings: tuple[str, ...] | None = None

    # -- facts ---------------------------------------------------------------
    @property
    def n_vocab(self) -> int:
        return self._native.n_vocab

    @property
    def placement(self) -> dict | None:
        """The device the model runs on (its name, description and kind, and
        the bytes its weights and working buffers take there), or None on
        the CPU."""
        return self._native.placement()

    @property
    def device_note(self) -> str | None:
        """Why a device was asked for and the model runs on the CPU, or None."""
        return self._native.device_note

    @property
    def n_ctx(self) -> int:
        return self._native.n_ctx

    @property
    def n_embd(self) -> int:
        """Width of the hidden states, and of an embedding."""
        return self._native.config()["n_embd"]

    @property
    def architecture(self) -> str:
        return self._native.architecture

    @property
    def name(self) -> str:
        return self._native.name or self.path.stem

    @property
    def chat_template(self) -> str | None:
        return self._template

    def metadata(self, key: str):
        return self._native.metadata(key)

    # -- tokens --------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False,
                 literal: Sequence[tuple[int, int]] = ()) -> list[int]:
        """Token ids of `text`. With `parse_special`, spellings of control
        tokens become them, except inside the byte ranges `literal`."""
        return self._native.tokenize(text, add_special, parse_special, list(literal))

    @property
    def control_spellings(self) -> tuple[str, ...]:
        """The texts `tokenize` turns into control tokens with `parse_special`."""
        if self._control_spellings is None:
            self._control_spellings = tuple(self._native.control_spellings())
        return self._control_spellings

    def detokenize(self, ids: Sequence[int], special: bool = False) -> str:
        return self._native.detokenize(list(ids), special)

    #: The most tokens written at once without a draw (a thought's forced close, with its message).
    max_forced_run: int = _native.MAX_FORCED_RUN

    def token_to_piece(self, token: int, special: bool = False) -> bytes:
        return self._native.token_to_piece(token, special)

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """Teacher-forced logits: one float32 row of n_vocab per position."""
        # Imported here, not at load: numpy's BLAS starts threads that poll
        # for work, and a server process never needs them beside the
        # engine's own (they took measurable time from its cores).
        import numpy as np

        ids = list(ids)
        raw = self._native.logits(ids)
        return np.frombuffer(raw, dtype="<f4").reshape(len(ids), self.n_vocab)

    # -- embeddings ----------------------------------------------------------
    def hidden_states(self, ids: Sequence[int]) -> np.ndarray:
        """The final hidden state of every position (after the output norm,
        what the head reads): one float32 row of n_embd per position."""
        import numpy as np

        ids = list(ids)
        raw = self._native.hidden_states(ids)
        return np.frombuffer(raw, dtype="<f4").reshape(len(ids), -1)

    @property
    def pooling_type(self) -> str:
        """How the file says its embeddings are pooled (`{arch}.pooling_type`,
        llama.cpp's numbering); "none" where it says nothing, as llama.cpp reads it."""
        value = self.metadata(f"{self.architecture}.pooling_type")
        return POOLINGS[value] if isinstance(value, int) and 0 <= value < len(POOLINGS) else "none"

    def embed(self, text: str | Sequence[int], *, pooling: str | None = None, normalize: int = 2) -> np.ndarray:
        """An embedding of `text` (or token ids): the hidden states pooled by
        `pooling` ("mean", "cls": the first position, "last", or "none": one
        row per position; default the file's own, see `pooling_type`) and,
        when pooled, normalized as llama.cpp's `embd_normalize` says (2:
        euclidean, -1: none, 0: max-abs scaled to int16's range, 1: taxicab,
        p > 2: p-norm)."""
        import numpy as np

        pooling = self.pooling_type if pooling is None else pooling
        if pooling not in POOLINGS or pooling == "rank":
            raise InvalidRequestError(f"pooling: expected none, mean, cls or last, got {pooling!r}")
        ids = self.tokenize(text, add_special=True, parse_special=True) if isinstance(text, str) else [int(t) for t in text]
        if not ids:
            raise InvalidRequestError("input: empty")
        rows = self.hidden_states(ids)
        if pooling == "none":
            return rows
        v = {"mean": lambda: rows.mean(axis=0), "cls": lambda: rows[0], "last": lambda: rows[-1]}[pooling]()
        return _normalized(v.astype(np.float64), normalize).astype(np.float32)

    # -- reranking -------------------------------------------------------------
    @property
    def can_rank(self) -> bool:
        """Whether the file has a reranker's classification head (`cls.output`)."""
        return self._native.n_rank_labels is not None

    def rerank_prompt(self, query: str, document: str) -> list[int]:
        """The ids a reranker reads for `query` and `document`, as
        llama-server writes them: the file's rerank template
        (`tokenizer.chat_template.rerank`) with both put in, read with
        control tokens and without the vocabulary's own BOS; else BOS, the
        query, EOS, SEP and the document, EOS, each where the vocabulary
        adds it (EOS standing in for a SEP it lacks)."""
        template = self.metadata("tokenizer.chat_template.rerank")
        if isinstance(template, str):
            text = template.replace("{query}", query).replace("{document}", document)
            return self.tokenize(text, add_special=False, parse_special=True)
        q = self.tokenize(query, add_special=False)
        d = self.tokenize(document, add_special=False)
        eos = self._native.eos_id
        sep = self.metadata("tokenizer.ggml.seperator_token_id")
        if eos is None:
            eos = sep
        add_eos = self.metadata("tokenizer.ggml.add_eos_token") is True and eos is not None
        add_sep = self.metadata("tokenizer.ggml.add_sep_token") is True and sep is not None
        bos = [self._native.bos_id] if self._native.add_bos and self._native.bos_id is not None else []
        return bos + q + ([eos] if add_eos else []) + ([sep] if add_sep else []) + d + ([eos] if add_eos else [])

    def rank(self, ids: Sequence[int]) -> list[float]:
        """A reranker's scores of `ids` (llama.cpp's rank pooling): its
        classification head over the last position, one score a label
        (probabilities for Qwen3's rerankers, as llama.cpp gives them)."""
        return self._native.rank([int(t) for t in ids])

    def rerank(self, query: str, documents: Sequence[str]) -> list[float]:
        """How relevant each of `documents` is to `query`: the first label's
        score of each pair's `rerank_prompt`, as llama-server's /rerank
        answers it."""
        return [self.rank(self.rerank_prompt(query, d))[0] for d in documents]

    # -- generation ----------------------------------------------------------
    def _prompt_ids(self, prompt: str | Sequence[int], add_special: bool, parse_special: bool) -> list[int]:
        if isinstance(prompt, str):
            ids = self.tokenize(prompt, add_special=add_special, parse_special=parse_special)
        else:
            ids = [int(t) for t in prompt]
        if not ids:
            raise InvalidRequestError("prompt: empty")
        return ids

    def stream_completion(self, prompt: str | Sequence[int], max_tokens: int = 128, *, add_special: bool = True,
                          parse_special: bool = False, json_schema: dict | bool | None = None,
                          params: SamplingParams | None = None, **sampling) -> Iterator[Piece | Completion]:
        """Yields a `Piece` per drawn token, then the `Completion` once.

        The generation runs under `params`, or under the `SamplingParams`
        fields given as keywords (``temperature``, ``top_k``, ``stop``,
        ``seed``, ``grammar``...; llama-server's defaults for the rest).

        With ``cache_prompt`` (the default), the prompt's prefix that the last
        generation's context shares with it is reused rather than read again:
        a conversation sent whole each turn costs only its new part.

        ``grammar`` (GBNF text or a compiled grammar) or ``json_schema``
        holds the output to a document: tokens that would break it are never
        drawn, and the turn ends only once it is whole. With
        ``grammar_trigger``, the grammar waits for the output to write that
        text and holds it from there (a tool call after free prose)."""
        params = sampling_params(params, json_schema, **sampling)
        ids = self._prompt_ids(prompt, add_special, parse_special)
        native = params.native(_max_tokens(max_tokens))
        t0 = time.perf_counter()
        gen = self._native.generate(ids, native)
        build = CompletionBuilder(params.stop, len(ids), gen.n_cached, params.n_probs, t0,
                                  LineRules(params.n_indent, params.t_max_predict_ms))
        build.prompt_read()
        for d in gen:
            events, finished = build.draw(d.token, d.text, d.stop, d.logprob, d.top)
            yield from events
            if finished:
                return
        yield from build.finish()

    def start_in(self, batcher: "_native.Batcher", slot: int, prompt: Sequence[int], max_tokens: int,
                 params: SamplingParams, owner: int = 0) -> "CompletionBuilder":
        """Places a completion in a slot of ``batcher``; the batcher's steps
        then draw its tokens, which the returned builder turns into `Piece`s
        and the `Completion`. The slot's cache is reused only for `owner`'s
        prompts (0: everyone's)."""
        ids = self._prompt_ids(prompt, True, False)
        t0 = time.perf_counter()
        started = batcher.start(slot, ids, params.native(_max_tokens(max_tokens)), params.checkpoint_hints, owner)
        build = CompletionBuilder(params.stop, len(ids), started.n_cached, params.n_probs, t0,
                                  LineRules(params.n_indent, params.t_max_predict_ms))
        build.resume = started.resume
        return build

    def complete(self, prompt: str | Sequence[int], max_tokens: int = 128, **kwargs) -> Completion:
        """Generates to the end and returns the text with its finish reason and tokens."""
        result = None
        for result in self.stream_completion(prompt, max_tokens, **kwargs):
            pass
        assert isinstance(result, Completion)
        return result

    def generate(self, prompt: str | Sequence[int], max_tokens: int = 128, *, stream: bool = False, **kwargs):
        """Generates text after ``prompt``: the whole text, or with ``stream=True``
        an iterator of text pieces as they are drawn."""
        if stream:
            return (p.text for p in self.stream_completion(prompt, max_tokens, **kwargs) if isinstance(p, Piece) and p.text)
        return self.complete(prompt, max_tokens, **kwargs).text

    # -- chat ----------------------------------------------------------------
    def render_chat(
        self,
        messages: list[dict],
        *,
        add_generation_prompt: bool = True,
        tools: list[dict] | None = None,
        chat_template_kwargs: dict | None = None,
        template: str | None = None,
    ) -> str:
        """The prompt the model's chat template (or ember's fallback) makes of ``messages``."""
        from ember.chat_template import pick_fallback, render_chat

        bos = self._piece_text(self._native.bos_id)
        eos = self._piece_text(self._native.eos_id)
        tmpl = template if template is not None else self._template
        fallback = None
        if tmpl is None:
            fallback = pick_fallback(self.architecture, _VocabProbe(self))
        return render_chat(
            tmpl, messages, add_generation_prompt=add_generation_prompt, bos_token=bos, eos_token=eos,
            tools=tools, extra_kwargs=chat_template_kwargs, fallback=fallback or "chatml",
        )

    def chat(self, messages: list[dict], max_tokens: int = 128, *, stream: bool = False, tools=None,
             tool_choice=None, parallel_tool_calls=None, response_format: dict | None = None,
             chat_template_kwargs: dict | None = None, reasoning_effort=None, reasoning_budget=None,
             reasoning_budget_message=None, reasoning_format=None, **kwargs):
        """Answers a conversation as the server's chat route does, through the
        same chat core: the reply as a message (`content`, `reasoning_content`
        when the template thinks, `tool_calls` when tools were offered, each
        call's `function.name` and `function.arguments`), or with `stream`
        the deltas of those fields as the route sends them. `kwargs` are
        `generate`'s (sampling, stop, grammar, json_schema...)."""
        from ember.chat import AnswerFormat, ChatRequest, build_prompt, chat_delta

        grammar, json_schema = kwargs.pop("grammar", None), kwargs.pop("json_schema", None)
        if response_format is not None:
            json_schema = _answer_schema(response_format)
        answer = _grammar(grammar, json_schema)
        request = ChatRequest(
            messages=messages, tools=tools, tool_choice=tool_choice, parallel_tool_calls=parallel_tool_calls,
            answer=AnswerFormat(answer, gbnf=grammar is not None) if answer is not None else None,
            chat_template_kwargs=chat_template_kwargs, reasoning_effort=reasoning_effort,
            reasoning_budget=reasoning_budget, reasoning_budget_message=reasoning_budget_message,
            reasoning_format=reasoning_format)
        p = build_prompt(self, request, framings=self._framings)
        params = sampling_params(**kwargs)
        p.apply(params)
        ids = self.chat_text_ids(p.text, p.literal)
        shaper = p.shaper
        if not stream:
            shaper.read_whole(self.complete(ids, max_tokens, params=params))
            return shaper.message()

        def deltas():
            for ev in self.stream_completion(ids, max_tokens, params=params):
                for out in shaper.feed(ev.text) if isinstance(ev, Piece) else shaper.finish(ev):
                    if (delta := chat_delta(out)) is not None:
                        yield delta

        return deltas()

    def chat_prompt_ids(self, messages: list[dict], **render_kwargs) -> list[int]:
        """Token ids of a rendered conversation: control tokens parsed, BOS by the
        model's rule and never twice (templates that write `bos_token` themselves
        would otherwise double it, as llama.cpp also guards against)."""
        return self.chat_text_ids(self.render_chat(messages, **render_kwargs))

    def chat_text_ids(self, text: str, literal: Sequence[tuple[int, int]] = ()) -> list[int]:
        """Token ids of a rendered conversation (see `chat_prompt_ids`); the
        byte ranges `literal` are the client's words, read as text."""
        ids = self.tokenize(text, add_special=True, parse_special=True, literal=literal)
        bos = self._native.bos_id
        if len(ids) >= 2 and ids[0] == bos and ids[1] == bos:
            ids = ids[1:]
        return ids

    def _piece_text(self, token: int | None) -> str:
        if token is None:
            return ""
        return self._native.token_to_piece(token, True).decode("utf-8", "replace")


class _VocabProbe:
    """Answers `"<start_of_turn>" in vocab` by tokenizing the spelling as a special token."""

    def __init__(self, model: Model):
        self.model = model

    def __contains__(self, text: str) -> bool:
        ids = self.model.tokenize(text, add_special=False, parse_special=True)
        return len(ids) == 1 and self.model.token_to_piece(ids[0], True).decode("utf-8", "replace") == text
