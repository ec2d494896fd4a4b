"""llama-server's flags that are not settings of ember's own: each is
accepted, with a start line saying what it means here, or refused with the
reason. (The flags ember honours are `ember.server.cli`'s.)

Every spelling is registered with the parser, so none is read as a shorter
one with its value glued on (argparse takes an unknown `-ngl` as `-n gl`),
and a flag of a llama.cpp program other than the server is named as such.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Callable, Mapping


__all__ = ["COMPAT_FLAGS", "CompatFlag", "Refusal", "add_to", "answer"]


class Refusal(Exception):
    """A flag ember cannot honour; the message says why."""


@dataclass(frozen=True)
class CompatFlag:
    spellings: tuple[str, ...]
    #: values it takes: 0, 1, 2, or "?" (an optional one: `-fa` alone or `-fa on`)
    nargs: int | str
    #: the start line for the value given (None when it takes none), or a `Refusal`
    decide: Callable[[Any], str]
    env: str | None = None

    @property
    def dest(self) -> str:
        return "compat:" + self.spellings[-1].lstrip("-")


def _accepted(effect: str) -> Callable[[Any], str]:
    return lambda _value: effect


def _refused(why: str) -> Callable[[Any], str]:
    def decide(_value):
        raise Refusal(why)

    return decide


def _when(accepts: Callable[[str], bool], effect: str, why: str) -> Callable[[Any], str]:
    """Accepted when the value asks for what ember does anyway."""

    def decide(value):
        if not accepts(str(value).strip().lower()):
            raise Refusal(why)
        return effect

    return decide


def _number_is(*off: float) -> Callable[[str], bool]:
    def accepts(v: str) -> bool:
        try:
            return float(v) in off
        except ValueError:
            return False

    return accepts


def _flash_attention(value) -> str:
    v = "on" if value is True else str(value).strip().lower()
    if v not in ("on", "off", "auto", "1", "0", "true", "false", "enabled", "disabled"):
        raise Refusal(f"expected on, off or auto, got {value!r}")
    return ("attention is always fused (one pass over the cache with the softmax folded in); "
            "ember has no other path, and the result does not depend on it")


_CLI = "is llama-cli's, not the server's: a server takes its prompt, and how to show it, with each request"
_PERPLEXITY = "is llama-perplexity's, not the server's"
_SPECULATIVE = "ember has no speculative decoding"
_ADAPTERS = "ember applies no LoRA adapters or control vectors"
_ROPE = "ember takes the rope's frequencies and scaling from the model file and cannot override them"
_IMAGES = "ember's models read text only"
_SAMPLER = "ember has no {} sampler; leave it at its off value ({})"
_LOGS = "ember's log is its start lines and one line per event, on stderr; redirect it"
_ONE_DEVICE = "ember runs a model whole on one device (or the CPU), so nothing is split"

COMPAT_FLAGS: list[CompatFlag] = [
    CompatFlag(("--verbose-prompt",), 0, _refused(_CLI)),
    CompatFlag(("--no-display-prompt",), 0, _refused(_CLI)),
    CompatFlag(("-co", "--color"), 0, _refused(_CLI)),
    CompatFlag(("--verbosity", "-lv", "--log-verbosity"), 1, _refused(_LOGS)),
    CompatFlag(("-tb", "--threads-batch"), 1,
               _accepted("prompts are read by the same threads as generation (-t): ember keeps one pool"),
               "LLAMA_ARG_THREADS_BATCH"),
    CompatFlag(("-td", "--threads-draft"), 1, _refused(_SPECULATIVE)),
    CompatFlag(("-tbd", "--threads-batch-draft"), 1, _refused(_SPECULATIVE)),
    CompatFlag(("--draft", "--draft-max", "--draft-n"), 1, _refused(_SPECULATIVE)),
    CompatFlag(("-ps", "--p-split"), 1, _refused(_SPECULATIVE)),
    CompatFlag(("-lcs", "--lookup-cache-static"), 1, _refused(_SPECULATIVE + " (lookup decoding)")),
    CompatFlag(("-lcd", "--lookup-cache-dynamic"), 1, _refused(_SPECULATIVE + " (lookup decoding)")),
    CompatFlag(("-md", "--model-draft"), 1, _refused(_SPECULATIVE)),
    CompatFlag(("--spec-type",), 1, _refused(_SPECULATIVE)),
    CompatFlag(("--keep",), 1, _refused(
        "ember does not shift the context: a conversation that outgrows its slot ends with finish_reason "
        "\"length\", so there are no tokens to keep")),
    CompatFlag(("--chunks",), 1, _refused(_PERPLEXITY)),
    CompatFlag(("-fa", "--flash-attn"), "?", _flash_attention, "LLAMA_ARG_FLASH_ATTN"),
    CompatFlag(("-p", "--prompt"), 1, _refused(_CLI)),
    CompatFlag(("-f", "--file"), 1, _refused(_CLI)),
    CompatFlag(("--in-file",), 1, _refused(_CLI)),
    CompatFlag(("-bf", "--binary-file"), 1, _refused(_CLI)),
    CompatFlag(("-e", "--escape"), 0, _refused(_CLI)),
    CompatFlag(("--no-escape",), 0, _refused(_CLI)),
    CompatFlag(("-ptc", "--print-token-count"), 1, _refused(_CLI)),
    CompatFlag(("--prompt-cache",), 1, _refused(
        _CLI + "; the server keeps prompts in its slots and host cache (--cache-ram), and saves a slot with "
        "POST /slots/ID?action=save")),
    CompatFlag(("--prompt-cache-all",), 0, _refused(_CLI)),
    CompatFlag(("--prompt-cache-ro",), 0, _refused(_CLI)),
    CompatFlag(("-r", "--reverse-prompt"), 1, _refused(_CLI + " (stop strings are the request's \"stop\")")),
    CompatFlag(("-sp", "--special"), 0, _refused(_CLI)),
    CompatFlag(("-cnv", "--conversation"), 0, _refused(_CLI)),
    CompatFlag(("-no-cnv", "--no-conversation"), 0, _refused(_CLI)),
    CompatFlag(("-i", "--interactive"), 0, _refused(_CLI)),
    CompatFlag(("-if", "--interactive-first"), 0, _refused(_CLI)),
    CompatFlag(("-mli", "--multiline-input"), 0, _refused(_CLI)),
    CompatFlag(("--in-prefix-bos",), 0, _refused(_CLI)),
    CompatFlag(("--in-prefix",), 1, _refused(_CLI)),
    CompatFlag(("--in-suffix",), 1, _refused(_CLI)),
    CompatFlag(("-bs", "--backend-sampling", "--backend_sampling"), 0, _accepted(
        "tokens are drawn on the CPU beside the model, as always here; where they are drawn does not change them"),
        "LLAMA_ARG_BACKEND_SAMPLING"),
    CompatFlag(("--penalize-nl",), 0, _accepted("newlines count in the penalties like any other token")),
    CompatFlag(("--tfs",), 1, _when(_number_is(1.0), "tail-free sampling stays off",
                                    _SAMPLER.format("tail-free", "1.0"))),
    CompatFlag(("--dynatemp-range",), 1, _when(_number_is(0.0), "the temperature stays fixed",
                                               _SAMPLER.format("dynamic-temperature", "0.0"))),
    CompatFlag(("--dynatemp-exp",), 1, _when(_number_is(1.0), "the temperature stays fixed",
                                             _SAMPLER.format("dynamic-temperature", "1.0"))),
    CompatFlag(("--mirostat",), 1, _when(_number_is(0.0), "mirostat stays off", _SAMPLER.format("mirostat", "0"))),
    CompatFlag(("--mirostat-lr",), 1, _refused(_SAMPLER.format("mirostat", "--mirostat 0"))),
    CompatFlag(("--mirostat-ent",), 1, _refused(_SAMPLER.format("mirostat", "--mirostat 0"))),
    CompatFlag(("--xtc-probability",), 1, _when(_number_is(0.0), "XTC stays off", _SAMPLER.format("XTC", "0.0"))),
    CompatFlag(("--xtc-threshold",), 1, _refused(_SAMPLER.format("XTC", "--xtc-probability 0"))),
    CompatFlag(("--top-n-sigma",), 1, _when(_number_is(0.0, -1.0), "top-n-sigma stays off",
                                            _SAMPLER.format("top-n-sigma", "-1"))),
    CompatFlag(("--cfg-negative-prompt",), 1, _refused("ember has no classifier-free guidance")),
    CompatFlag(("--cfg-negative-prompt-file",), 1, _refused("ember has no classifier-free guidance")),
    CompatFlag(("--cfg-scale",), 1, _when(_number_is(1.0), "guidance stays off",
                                          "ember has no classifier-free guidance; leave it at 1.0")),
    CompatFlag(("--grammar",), 1, _refused(
        "a grammar is set with each request (grammar, json_schema, response_format), not for the whole server")),
    CompatFlag(("--grammar-file",), 1, _refused(
        "a grammar is set with each request (grammar, json_schema, response_format), not for the whole server")),
    CompatFlag(("-j", "--json-schema"), 1, _refused(
        "a schema is set with each request (json_schema, response_format), not for the whole server")),
    CompatFlag(("--attention",), 1, _when(lambda v: v == "causal", "attention is causal, as the model runs",
                                          "ember runs every model's attention as its family does (causal)")),
    CompatFlag(("--rope-scaling",), 1, _refused(_ROPE)),
    CompatFlag(("--rope-scale",), 1, _refused(_ROPE)),
    CompatFlag(("--rope-freq-base",), 1, _refused(_ROPE)),
    CompatFlag(("--rope-freq-scale",), 1, _refused(_ROPE)),
    CompatFlag(("--yarn-orig-ctx",), 1, _refused(_ROPE)),
    CompatFlag(("--yarn-ext-factor",), 1, _refused(_ROPE)),
    CompatFlag(("--yarn-attn-factor",), 1, _refused(_ROPE)),
    CompatFlag(("--yarn-beta-slow",), 1, _refused(_ROPE)),
    CompatFlag(("--yarn-beta-fast",), 1, _refused(_ROPE)),
    CompatFlag(("-gan", "--grp-attn-n"), 1, _refused("ember has no group attention (self-extend)")),
    CompatFlag(("-gaw", "--grp-attn-w"), 1, _refused("ember has no group attention (self-extend)")),
    CompatFlag(("-dkvc", "--dump-kv-cache"), 0, _refused("ember does not print its KV cache; GET /slots describes it")),
    CompatFlag(("-nkvo", "--no-kv-offload"), 0, _accepted("the KV cache is in host memory, as it always is here"),
               "LLAMA_ARG_NO_KV_OFFLOAD"),
    CompatFlag(("--all-logits",), 0, _refused(_PERPLEXITY)),
    CompatFlag(("--hellaswag",), 0, _refused(_PERPLEXITY)),
    CompatFlag(("--hellaswag-tasks",), 1, _refused(_PERPLEXITY)),
    CompatFlag(("--winogrande",), 0, _refused(_PERPLEXITY)),
    CompatFlag(("--winogrande-tasks",), 1, _refused(_PERPLEXITY)),
    CompatFlag(("--multiple-choice",), 0, _refused(_PERPLEXITY)),
    CompatFlag(("--multiple-choice-tasks",), 1, _refused(_PERPLEXITY)),
    CompatFlag(("--kl-divergence",), 0, _refused(_PERPLEXITY)),
    CompatFlag(("--ppl-stride",), 1, _refused(_PERPLEXITY)),
    CompatFlag(("--ppl-output-type",), 1, _refused(_PERPLEXITY)),
    CompatFlag(("-dt", "--defrag-thold"), 1,
               _accepted("each slot's cache is one contiguous run, so there is nothing to defragment"),
               "LLAMA_ARG_DEFRAG_THOLD"),
    CompatFlag(("-ns", "--sequences"), 1, _refused("is llama-parallel's; the server's slots are -np")),
    CompatFlag(("-cb", "--cont-batching"), 0,
               _accepted("batching is always continuous: a request joins the next pass, beside those under way")),
    CompatFlag(("-nocb", "--no-cont-batching"), 0, _refused(
        "batching is always continuous in ember; -np 1 answers one request at a time")),
    CompatFlag(("--mmproj",), 1, _refused(_IMAGES)),
    CompatFlag(("--image",), 1, _refused(_IMAGES)),
    CompatFlag(("--rpc",), 1, _refused("ember runs the model in this process only")),
    CompatFlag(("--mlock",), 0, _refused(
        "ember does not lock the model in memory; the file is mapped and the kernel may page it out")),
    CompatFlag(("--no-mmap",), 0, _refused("ember always maps the model file (its weights are read in place)")),
    CompatFlag(("--numa",), 1, _refused("ember does not place its threads by NUMA node")),
    CompatFlag(("--check-tensors",), 0, _refused(
        "ember checks each tensor's type, shape and bounds when it loads, but not every value")),
    CompatFlag(("--override-kv",), 1, _refused("ember reads the model file's metadata as it is")),
    CompatFlag(("--lora",), 1, _refused(_ADAPTERS)),
    CompatFlag(("--lora-scaled",), 2, _refused(_ADAPTERS)),
    CompatFlag(("--lora-base",), 1, _refused(_ADAPTERS)),
    CompatFlag(("--lora-init-without-apply",), 0, _refused(_ADAPTERS)),
    CompatFlag(("--control-vector",), 1, _refused(_ADAPTERS)),
    CompatFlag(("--control-vector-scaled",), 2, _refused(_ADAPTERS)),
    CompatFlag(("--control-vector-layer-range",), 2, _refused(_ADAPTERS)),
    CompatFlag(("--threads-http",), 1, _accepted(
        "one event loop answers HTTP (requests wait on the engine, not on a thread)"), "LLAMA_ARG_THREADS_HTTP"),
    CompatFlag(("--log-format",), 1, _when(lambda v: v == "text", "the log is text", _LOGS)),
    CompatFlag(("--simple-io",), 0, _accepted("the log is plain lines on stderr")),
    CompatFlag(("-ld", "--logdir"), 1, _refused(_LOGS)),
    CompatFlag(("--log-test",), 0, _refused(_LOGS)),
    CompatFlag(("--log-disable",), 0, _refused(_LOGS)),
    CompatFlag(("--log-enable",), 0, _accepted("the log is on, as always")),
    CompatFlag(("--log-file",), 1, _refused(_LOGS)),
    CompatFlag(("--log-new",), 0, _refused(_LOGS)),
    CompatFlag(("--log-append",), 0, _refused(_LOGS)),
    CompatFlag(("--log-colors",), 1, _refused(_LOGS)),
    CompatFlag(("--ui", "--webui"), 0, _accepted("the chat page is served at / (the default; --no-webui turns it off)")),
    CompatFlag(("--slots",), 0, _accepted("GET /slots is served (the default; --no-slots turns it off)")),
    CompatFlag(("--no-context-shift",), 0, _accepted("the context is never shifted")),
    CompatFlag(("--context-shift",), 0, _refused(
        "ember does not shift the context: a conversation that outgrows its slot ends with finish_reason "
        "\"length\"")),
    CompatFlag(("-no-kvu", "--no-kv-unified"), 0, _accepted("each slot keeps its own share of the context (the "
                                                              "default; -kvu shares it)")),
    CompatFlag(("--cache-idle-slots",), 0, _accepted(
        "a conversation whose slot goes to another is kept in the host cache (--cache-ram), as always here"),
        "LLAMA_ARG_CACHE_IDLE_SLOTS"),
    CompatFlag(("--no-cache-idle-slots",), 0, _refused(
        "ember keeps a conversation whose slot goes to another in the host cache whenever it has room; "
        "--cache-ram 0 turns the host cache off")),
    CompatFlag(("--swa-full",), 0, _accepted(
        "sliding-window layers keep their window (and a pass) in a ring; a prompt that parts before the window "
        "is read again, as without --swa-full")),
    CompatFlag(("--jinja",), 0, _accepted("chat templates are always rendered as Jinja")),
    CompatFlag(("--no-jinja",), 0, _accepted(
        "chat templates are rendered as Jinja all the same: ember has no other renderer (a file without a template "
        "gets the built-in one its vocabulary fits)")),
    CompatFlag(("-sm", "--split-mode"), 1, _when(lambda v: v == "none", "the model is in one piece, on one device",
                                                 _ONE_DEVICE)),
    CompatFlag(("-ts", "--tensor-split"), 1, _refused(_ONE_DEVICE)),
    CompatFlag(("-mg", "--main-gpu"), 1, _refused(f"{_ONE_DEVICE}: choose it with --device NAME")),
]

_BY_SPELLING = {s: f for f in COMPAT_FLAGS for s in f.spellings}
ENV_NAMES = frozenset(f.env for f in COMPAT_FLAGS if f.env)


def add_to(parser: argparse.ArgumentParser) -> None:
    """Registers every spelling, under a group of its own in --help."""
    group = parser.add_argument_group("llama-server's other flags (accepted where ember does the same anyway, "
                                      "else refused with the reason)")
    for f in COMPAT_FLAGS:
        kw: dict[str, Any] = {"dest": f.dest, "default": None, "help": argparse.SUPPRESS}
        if f.nargs == 0:
            kw["action"] = "store_true"
        elif f.nargs == "?":
            kw.update(nargs="?", const=True)
        elif f.nargs == 2:
            kw["nargs"] = 2
        group.add_argument(*f.spellings, **kw)


def answer(args: argparse.Namespace, environ: Mapping[str, str], given: Callable[[str], str]) -> list[str]:
    """The start lines of the compatibility flags given (on the command line
    or in their LLAMA_ARG_* variable). Raises `Refusal` naming the first one
    ember cannot honour; `given(dest)` names the spelling the user wrote."""
    lines = []
    for f in COMPAT_FLAGS:
        value = getattr(args, f.dest, None)
        where = given(f.dest) if value is not None else None
        if value is None and f.env and f.env in environ:
            value, where = environ[f.env], f.env
        if value is None or value is False:
            continue
        shown = where if value is True else f"{where} {' '.join(value) if isinstance(value, list) else value}"
        try:
            lines.append(f"{shown}: {f.decide(value)}")
        except Refusal as e:
            raise Refusal(f"{shown}: {e}") from None
    return lines


def spelling_given(argv: list[str]) -> Callable[[str], str]:
    """For each compat flag, the spelling `argv` used (its last one), so a
    refusal names what the user wrote."""
    used: dict[str, str] = {}
    for arg in argv:
        flag = arg.split("=", 1)[0]
        f = _BY_SPELLING.get(flag)
        if f is not None:
            used[f.dest] = flag
    return lambda dest: used.get(dest, next(f.spellings[-1] for f in COMPAT_FLAGS if f.dest == dest))
