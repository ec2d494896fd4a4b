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
    #: values it takes: 0, 1, 2, "?" (an optional one: `-fa` alone or `-fa on`), or "+" (one or more:
    #: `--lora-scaled f:0.5` as llama-server now writes it, `--lora-scaled f 0.5` as it did)
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
_THREADS = "ember does not pin, prioritize or spin its threads; -t says how many"
_NO_TOOLS = ("ember runs no tools itself: a model's calls go back to the client, which runs them (and its own MCP "
             "servers)")
_ROUTER = "ember serves one model per server (-m, or -hf); run a server for each model"
_PRESET = "a preset of llama-server's that fetches a model from the hub; name the model with -m or -hf"

COMPAT_FLAGS: list[CompatFlag] = [
    CompatFlag(("--verbose-prompt",), 0, _refused(_CLI)),
    CompatFlag(("--no-display-prompt",), 0, _refused(_CLI)),
    CompatFlag(("-co", "--color"), 0, _refused(_CLI)),
    CompatFlag(("--verbosity", "-lv", "--log-verbosity"), 1, _refused(_LOGS)),
    CompatFlag(("-tb", "--threads-batch"), 1,
               _accepted("prompts are read by the same threads as generation (-t): ember keeps one pool"),
               "LLAMA_ARG_THREADS_BATCH"),
    CompatFlag(("-td", "--threads-draft", "--spec-draft-threads"), 1, _refused(_SPECULATIVE)),
    CompatFlag(("-tbd", "--threads-batch-draft", "--spec-draft-threads-batch"), 1, _refused(_SPECULATIVE)),
    CompatFlag(("--draft", "--draft-max", "--draft-n"), 1, _refused(_SPECULATIVE)),
    CompatFlag(("-ps", "--p-split"), 1, _refused(_SPECULATIVE)),
    CompatFlag(("-lcs", "--lookup-cache-static"), 1, _refused(_SPECULATIVE + " (lookup decoding)")),
    CompatFlag(("-lcd", "--lookup-cache-dynamic"), 1, _refused(_SPECULATIVE + " (lookup decoding)")),
    CompatFlag(("-md", "--model-draft", "--spec-draft-model"), 1, _refused(_SPECULATIVE)),
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
    CompatFlag(("-nkvo", "--no-kv-offload"), 0, _accepted(
        "on the CPU the KV cache is in host memory; a model on a device keeps its cache there, which this flag "
        "does not change (-ngl 0 keeps everything on the host)"), "LLAMA_ARG_NO_KV_OFFLOAD"),
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
    CompatFlag(("--lora-scaled",), "+", _refused(_ADAPTERS)),
    CompatFlag(("--lora-base",), 1, _refused(_ADAPTERS)),
    CompatFlag(("--lora-init-without-apply",), 0, _refused(_ADAPTERS)),
    CompatFlag(("--control-vector",), 1, _refused(_ADAPTERS)),
    CompatFlag(("--control-vector-scaled",), "+", _refused(_ADAPTERS)),
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
    # The flags of llama-server's README since its table above was read.
    CompatFlag(("-cl", "--cache-list"), 0, _refused("`ember list` lists the models ember has fetched")),
    CompatFlag(("--completion-bash",), 0, _refused("ember prints no shell completion script")),
    *[CompatFlag((flag,), 1, _refused(_THREADS)) for flag in (
        "--cpu-mask", "--cpu-range", "--cpu-strict", "--prio", "--poll", "--cpu-mask-batch", "--cpu-range-batch",
        "--cpu-strict-batch", "--prio-batch", "--poll-batch")],
    CompatFlag(("-C",), 1, _refused(_THREADS)),
    CompatFlag(("-Cr",), 1, _refused(_THREADS)),
    CompatFlag(("-Cb",), 1, _refused(_THREADS)),
    CompatFlag(("-Crb",), 1, _refused(_THREADS)),
    CompatFlag(("--perf",), 0, _accepted("every reply's timings are measured and reported (timings, usage)")),
    CompatFlag(("--no-perf",), 0, _accepted("nothing is printed per pass unless EMBER_DEBUG_BATCHES=1")),
    CompatFlag(("-kvo", "--kv-offload"), 0, _accepted("the KV cache lives where the model runs")),
    CompatFlag(("--repack",), 0, _accepted("weights are read in the layouts ember's kernels take, as always")),
    CompatFlag(("-nr", "--no-repack"), 0, _refused(
        "ember's kernels read some formats through their own layouts, made at load; that cannot be turned off")),
    CompatFlag(("--no-host",), 0, _refused("ember keeps no host buffers beside a device's to bypass")),
    CompatFlag(("-lm", "--load-mode"), 1, _refused("ember always maps the model file (its weights are read in "
                                                   "place)")),
    CompatFlag(("-lzm", "--lazy-mode"), 1, _refused("ember maps the whole file; the kernel reads each page as a "
                                                    "pass first needs it")),
    CompatFlag(("-ot", "--override-tensor"), 1, _refused(_ONE_DEVICE)),
    CompatFlag(("-cmoe", "--cpu-moe"), 0, _refused(_ONE_DEVICE)),
    CompatFlag(("-ncmoe", "--n-cpu-moe"), 1, _refused(_ONE_DEVICE)),
    CompatFlag(("-ncffn", "--n-cpu-ffn"), 1, _refused(_ONE_DEVICE)),
    CompatFlag(("-fit", "--fit"), "?", _when(lambda v: v in ("off", "0", "false"), "nothing is fitted but the "
                                             "context, whose default (-c 0) ember caps by the memory free",
                                             "ember fits the context to the memory itself (-c 0, the default) and "
                                             "runs a model on one device; -fit off says nothing else")),
    CompatFlag(("-fitt", "--fit-target"), 1, _refused("ember fits the context to the memory free itself (-c 0)")),
    CompatFlag(("-fitc", "--fit-ctx"), 1, _refused("ember fits the context to the memory free itself (-c 0); give "
                                                   "the context with -c")),
    CompatFlag(("--op-offload",), 0, _accepted("the operations run where the model runs")),
    CompatFlag(("--no-op-offload",), 0, _refused(_ONE_DEVICE)),
    CompatFlag(("-dr", "--docker-repo"), 1, _refused("ember fetches from the hub (-hf) or a URL (-mu), not Docker's")),
    CompatFlag(("--log-jsonl",), 0, _refused(_LOGS)),
    CompatFlag(("--no-log-jsonl",), 0, _accepted("the log is text lines")),
    CompatFlag(("--log-prefix",), 0, _accepted("the start lines carry the prefix \"ember:\"")),
    CompatFlag(("--no-log-prefix",), 0, _refused(_LOGS)),
    CompatFlag(("--log-timestamps",), 0, _refused(_LOGS)),
    CompatFlag(("--no-log-timestamps",), 0, _accepted("the log carries no timestamps")),
    CompatFlag(("--top-nsigma",), 1, _when(_number_is(0.0, -1.0), "top-n-sigma stays off",
                                           _SAMPLER.format("top-n-sigma", "-1"))),
    CompatFlag(("--dry-multiplier",), 1, _when(_number_is(0.0), "DRY stays off", _SAMPLER.format("DRY", "0.0"))),
    *[CompatFlag((flag,), 1, _refused(_SAMPLER.format("DRY", "--dry-multiplier 0"))) for flag in (
        "--dry-base", "--dry-allowed-length", "--dry-penalty-last-n", "--dry-sequence-breaker")],
    CompatFlag(("--adaptive-target",), 1, _when(lambda v: v.lstrip().startswith("-"), "adaptive-p stays off",
                                                _SAMPLER.format("adaptive-p", "a negative target"))),
    CompatFlag(("--adaptive-decay",), 1, _refused(_SAMPLER.format("adaptive-p", "--adaptive-target -1"))),
    CompatFlag(("-jf", "--json-schema-file"), 1, _refused(
        "a schema is set with each request (json_schema, response_format), not for the whole server")),
    CompatFlag(("--kv-unified-per-slot",), 1, _refused(
        "with -kvu a slot may hold the whole shared context; without it each holds its share (-c / -np)")),
    CompatFlag(("--warmup",), 0, _accepted("the load runs a few passes (to measure the prompt's chunk), which "
                                           "warms the weights")),
    CompatFlag(("--no-warmup",), 0, _accepted("the load still runs the passes that measure the prompt's chunk")),
    CompatFlag(("-mm",), 1, _refused(_IMAGES)),
    CompatFlag(("-mmu", "--mmproj-url"), 1, _refused(_IMAGES)),
    CompatFlag(("--mmproj-auto",), 0, _refused(_IMAGES)),
    CompatFlag(("--no-mmproj", "--no-mmproj-auto"), 0, _accepted("no projector is loaded: ember's models read "
                                                                  "text only")),
    CompatFlag(("--mmproj-offload",), 0, _refused(_IMAGES)),
    CompatFlag(("--no-mmproj-offload",), 0, _refused(_IMAGES)),
    CompatFlag(("-mmdev", "--mmproj-device"), 1, _refused(_IMAGES)),
    *[CompatFlag((flag,), 1, _refused(_IMAGES)) for flag in (
        "--image-min-tokens", "--image-max-tokens", "--mtmd-batch-max-tokens", "--video-fps",
        "--video-timestamp-interval", "--video-ffmpeg-dir", "--media-path")],
    CompatFlag(("--reuse-port",), 0, _refused("ember listens alone on its port")),
    CompatFlag(("--cors-methods",), 1, _refused(
        "ember's CORS answers allow the methods its routes take; the origins are --cors-origin's")),
    CompatFlag(("--cors-headers",), 1, _refused(
        "ember's CORS answers allow the headers its routes read; the origins are --cors-origin's")),
    CompatFlag(("--cors-credentials",), 0, _accepted(
        "an origin --cors-origin names may send credentials; * allows any origin without them")),
    CompatFlag(("--no-cors-credentials",), 0, _refused(
        "an origin --cors-origin names may send credentials; * allows any origin without them")),
    CompatFlag(("--ui-config", "--webui-config"), 1, _refused("ember's chat page takes no settings file")),
    CompatFlag(("--ui-config-file", "--webui-config-file"), 1, _refused("ember's chat page takes no settings file")),
    CompatFlag(("--ui-mcp-proxy", "--webui-mcp-proxy"), 0, _refused(_NO_TOOLS)),
    CompatFlag(("--no-ui-mcp-proxy", "--no-webui-mcp-proxy"), 0, _accepted("the chat page runs no MCP proxy")),
    CompatFlag(("--tools",), 1, _refused(_NO_TOOLS)),
    CompatFlag(("--tools-runtime",), 1, _refused(_NO_TOOLS)),
    CompatFlag(("--mcp-servers-config",), 1, _refused(_NO_TOOLS)),
    CompatFlag(("--mcp-servers-json",), 1, _refused(_NO_TOOLS)),
    CompatFlag(("-ag", "--agent"), 0, _refused(_NO_TOOLS)),
    CompatFlag(("-no-ag", "--no-agent"), 0, _accepted("no built-in tools run")),
    CompatFlag(("--cache-prompt",), 0, _accepted("a slot reuses what it holds of a prompt unless the request "
                                                 "says cache_prompt: false (the default; --no-cache-prompt turns "
                                                 "it off)")),
    CompatFlag(("--props",), 0, _refused("ember's settings are fixed when it starts; POST /props changes none")),
    CompatFlag(("--models-dir",), 1, _refused(_ROUTER)),
    CompatFlag(("--models-preset",), 1, _refused(_ROUTER)),
    CompatFlag(("--models-max",), 1, _refused(_ROUTER)),
    CompatFlag(("--models-autoload",), 0, _refused(_ROUTER)),
    CompatFlag(("--no-models-autoload",), 0, _refused(_ROUTER)),
    CompatFlag(("--skip-chat-parsing",), 0, _refused(
        "a request asks for the raw text with reasoning_format: none (tools, when offered, are still read)")),
    CompatFlag(("--no-skip-chat-parsing",), 0, _accepted("thoughts and tool calls are read per model family")),
    CompatFlag(("--prefill-assistant",), 0, _accepted(
        "a conversation ending in the assistant's words is continued from them (the default; "
        "--no-prefill-assistant opens a new turn after them)")),
    CompatFlag(("--log-prompts-dir",), 1, _refused(_LOGS)),
    *[CompatFlag(spellings, nargs, _refused(_SPECULATIVE)) for spellings, nargs in (
        (("--spec-draft-type-k", "-ctkd", "--cache-type-k-draft"), 1),
        (("--spec-draft-type-v", "-ctvd", "--cache-type-v-draft"), 1),
        (("--spec-draft-hf", "-hfd", "-hfrd", "--hf-repo-draft"), 1),
        (("--spec-draft-cpu-mask", "-Cd", "--cpu-mask-draft"), 1),
        (("--spec-draft-cpu-range", "-Crd", "--cpu-range-draft"), 1),
        (("--spec-draft-cpu-strict", "--cpu-strict-draft"), 1),
        (("--spec-draft-prio", "--prio-draft"), 1),
        (("--spec-draft-poll", "--poll-draft"), 1),
        (("--spec-draft-cpu-mask-batch", "-Cbd", "--cpu-mask-batch-draft"), 1),
        (("--spec-draft-cpu-strict-batch", "--cpu-strict-batch-draft"), 1),
        (("--spec-draft-prio-batch", "--prio-batch-draft"), 1),
        (("--spec-draft-poll-batch", "--poll-batch-draft"), 1),
        (("--spec-draft-override-tensor", "-otd", "--override-tensor-draft"), 1),
        (("--spec-draft-cpu-moe", "-cmoed", "--cpu-moe-draft"), 0),
        (("--spec-draft-n-cpu-moe", "--spec-draft-ncmoe", "-ncmoed", "--n-cpu-moe-draft"), 1),
        (("--spec-draft-n-max",), 1), (("--spec-draft-n-min",), 1), (("--draft-min", "--draft-n-min"), 1),
        (("--spec-synth-len",), 1), (("--spec-synth-rates",), 1),
        (("--spec-draft-p-split", "--draft-p-split"), 1), (("--spec-draft-p-min", "--draft-p-min"), 1),
        (("--spec-draft-backend-sampling",), 0), (("--no-spec-draft-backend-sampling",), 0),
        (("--spec-draft-device", "-devd", "--device-draft"), 1),
        (("--spec-draft-ngl", "-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft"), 1),
        *(((f"--spec-ngram-{kind}",), 1) for kind in (
            "mod-n-min", "mod-n-max", "mod-n-match", "simple-size-n", "simple-size-m", "simple-min-hits",
            "map-k-size-n", "map-k-size-m", "map-k-min-hits", "map-k4v-size-n", "map-k4v-size-m",
            "map-k4v-min-hits", "size-n", "size-m", "min-hits")))],
    *[CompatFlag((flag,), 0, _refused(_PRESET)) for flag in (
        "--embd-gemma-default", "--fim-qwen-1.5b-default", "--fim-qwen-3b-default", "--fim-qwen-7b-default",
        "--fim-qwen-7b-spec", "--fim-qwen-14b-spec", "--fim-qwen-30b-default", "--gpt-oss-20b-default",
        "--gpt-oss-120b-default", "--vision-gemma-4b-default", "--vision-gemma-12b-default", "--spec-default")],
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
        elif f.nargs in (2, "+"):
            kw["nargs"] = f.nargs
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
