"""The options one generation runs under, as one typed object: built once
per request (by an API's adapter, or from `ember.Model`'s keywords), read by
name along the way, and converted once into the engine's own options. The
defaults are llama-server's."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from ember import _native

__all__ = ["SamplingParams", "ThoughtBudget"]


@dataclass(frozen=True, slots=True)
class ThoughtBudget:
    """Past `tokens` of thought, the close is written for the model."""

    tokens: int
    #: the template's thought markers
    opener: str
    closer: str
    #: the close's token ids, as they are forced
    close_ids: tuple[int, ...]
    #: the prompt left a thought open (the reply starts inside it)
    in_thought: bool

    def native(self) -> tuple:
        return (self.tokens, self.opener, self.closer, list(self.close_ids), self.in_thought)


@dataclass(slots=True)
class SamplingParams:
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    repeat_penalty: float = 1.0
    #: how many of the last tokens the penalties look at (-1: the whole context)
    repeat_last_n: int = 64
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    #: None: a fresh seed per request
    seed: int | None = None
    ignore_eos: bool = False
    #: strings that end the text (cut before them, never shown)
    stop: list[str] = field(default_factory=list)
    #: token id -> bias added to its logit (-inf: never drawn)
    logit_bias: dict[int, float] = field(default_factory=dict)
    #: log-probabilities of this many top tokens with each draw
    n_probs: int = 0
    #: ...from the distribution the token was drawn from, after the samplers (llama-server's
    #: post_sampling_probs), not the model's own
    post_sampling_probs: bool = False
    #: reuse what the slot holds of the prompt
    cache_prompt: bool = True
    #: llama-server's code-completion rules (`ember.model.LineRules`): the
    #: text ends at a line indented less than this (0: never)...
    n_indent: int = 0
    #: ...or at a newline written this long after the first token (0: never)
    t_max_predict_ms: float = 0
    #: a streamed reply waiting this many seconds for its first event sends an SSE comment to
    #: keep its connection (llama-server's sse_ping_interval; 0 or less: never; None: the server's)
    sse_ping_interval: int | None = None
    #: llama-server's chain: the stages that run, in order, by llama.cpp's
    #: names ("penalties", "top_k", "typ_p", "top_p", "min_p", "temperature",
    #: "infill"); None: llama.cpp's default chain
    samplers: list[str] | None = None
    #: the compiled grammar (`ember.structured.compile_grammar`) the output is held to
    grammar: _native.Grammar | None = None
    #: with a grammar: it holds the output only from where this text is written
    grammar_trigger: str | None = None
    thought_budget: ThoughtBudget | None = None
    #: positions of the prompt where a hybrid's slot keeps a checkpoint
    checkpoint_hints: list[int] = field(default_factory=list)
    #: the chat layer's next turn, rendered: where its tokens part from this
    #: prompt's becomes a checkpoint hint once the prompt is tokenized
    next_turn: str | None = None

    def copy(self) -> SamplingParams:
        """A copy whose lists and maps are its own (a request's options start
        as a copy of the server's defaults)."""
        return replace(self, stop=list(self.stop), logit_bias=dict(self.logit_bias),
                       checkpoint_hints=list(self.checkpoint_hints))

    def native(self, max_tokens: int) -> _native.GenerateOptions:
        """The engine's options for a generation of at most `max_tokens`."""
        return _native.GenerateOptions(
            max_tokens=max_tokens, ignore_eos=self.ignore_eos, temperature=self.temperature, top_k=self.top_k,
            top_p=self.top_p, min_p=self.min_p, typical_p=self.typical_p, repeat_penalty=self.repeat_penalty,
            repeat_last_n=self.repeat_last_n, frequency_penalty=self.frequency_penalty,
            presence_penalty=self.presence_penalty, logit_bias=list(self.logit_bias.items()), seed=self.seed,
            n_probs=self.n_probs, post_sampling_probs=self.post_sampling_probs, cache_prompt=self.cache_prompt,
            grammar=self.grammar,
            grammar_trigger=self.grammar_trigger,
            thought_budget=self.thought_budget.native() if self.thought_budget is not None else None,
            samplers=self.samplers)

    def settings(self) -> dict:
        """The sampling fields by name (llama-server's `generation_settings`
        reports them so)."""
        skip = {"grammar", "thought_budget", "checkpoint_hints", "next_turn", "grammar_trigger", "cache_prompt"}
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}
        if out["samplers"] is None:
            out["samplers"] = list(DEFAULT_CHAIN)
        return out


#: The stages of llama.cpp's default chain that run here, in its order.
DEFAULT_CHAIN = ("penalties", "top_k", "typ_p", "top_p", "min_p", "temperature")
