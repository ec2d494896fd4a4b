"""`ember serve` / `ember-server`: llama-server's flags, its LLAMA_ARG_* variables
and a --config file merged into one validated `ServerOptions`, the start lines
that explain each choice, and the process around the HTTP app (bind, signals, exit).

Precedence: the command line, then --config, then the environment, then defaults.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from ember import devices
from ember.chat_template import NAMED
from ember.server import llama_flags, machine
from ember.server.options import ReasoningDefaults, ServerOptions

__all__ = ["OptionError", "build_parser", "main", "parse_options", "serve"]

# Positions smaller than this cannot hold a useful chat, so a memory cap below
# it is reported as an error rather than silently served.
_MIN_CTX = 256
#: -np auto's slots, as llama-server's.
_AUTO_SLOTS = 4
_TRUTHY = {"1", "true", "on", "enabled", "yes"}
_FALSEY = {"0", "false", "off", "disabled", "no"}


class OptionError(Exception):
    """A setting ember cannot honour; `code` is the exit status (2: usage, 1: the rest)."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


class DevicesListed(Exception):
    """--list-devices: the list is the message; nothing is served."""


@dataclass(frozen=True)
class _Flag:
    name: str  # the long flag without dashes: also the --config key
    spellings: tuple[str, ...]
    kind: type  # int, float, str or bool
    env: str | None
    help: str
    default: Any = None


#: What one step of --api-prefix's path may hold: characters a URL carries as they are, so the
#: prefix is the same written or percent-encoded.
_PREFIX_SEGMENT = re.compile(r"[A-Za-z0-9._~-]+")

_FLAGS = [
    _Flag("model", ("-m", "--model"), str, "LLAMA_ARG_MODEL", "GGUF model file (default: SmolLM2-135M-Instruct, fetched once)"),
    _Flag("hf-repo", ("-hf", "-hfr", "--hf-repo"), str, "LLAMA_ARG_HF_REPO",
          "a model by name, OWNER/NAME[:QUANT], fetched from the hub into its cache (the quantization as "
          "llama-server picks it: Q4_K_M by default)"),
    _Flag("hf-file", ("-hff", "--hf-file"), str, "LLAMA_ARG_HF_FILE", "the file of --hf-repo to fetch, by name"),
    _Flag("hf-token", ("-hft", "--hf-token"), str, None, "the hub's access token (default: HF_TOKEN)"),
    _Flag("model-url", ("-mu", "--model-url"), str, "LLAMA_ARG_MODEL_URL",
          "a model by URL, fetched once (resumed if cut) to --model's path, else into ember's cache"),
    _Flag("offline", ("--offline",), bool, "LLAMA_OFFLINE", "fetch nothing: --hf-repo and --model-url use only what is cached",
          False),
    _Flag("host", ("--host",), str, "LLAMA_ARG_HOST", "addresses to listen on, comma-separated, or a UNIX socket's "
          "path ending in .sock (default 127.0.0.1)", "127.0.0.1"),
    _Flag("port", ("--port",), int, "LLAMA_ARG_PORT", "port (default 8080; 0 takes a free one)", 8080),
    _Flag("ctx-size", ("-c", "--ctx-size"), int, "LLAMA_ARG_CTX_SIZE", "context length (0: the model's trained length, capped by memory)", 0),
    _Flag("slot-ctx", ("--slot-ctx",), int, None, "one slot's context instead of -c (the total is this times -np; where the slots share it, this)"),
    _Flag("kv-unified", ("-kvu", "--kv-unified"), bool, "LLAMA_ARG_KV_UNIFIED",
          "the slots share one context: each holds up to all of it, together no more (the default with -np auto)"),
    _Flag("no-kv-unified", ("-no-kvu", "--no-kv-unified"), bool, None,
          "each slot keeps its share of the context (-c / -np)", False),
    _Flag("parallel", ("-np", "--parallel"), int, "LLAMA_ARG_N_PARALLEL",
          "slots: requests answered together (-1, the default: auto, llama-server's: 4 sharing one context, or one "
          "slot where the model runs on a device)", -1),
    _Flag("n-predict", ("-n", "--n-predict", "--predict"), int, "LLAMA_ARG_N_PREDICT", "default max tokens per request (-1: until the context is full)", -1),
    _Flag("threads", ("-t", "--threads"), int, "LLAMA_ARG_THREADS", "worker threads (0: physical cores)", 0),
    _Flag("batch-size", ("-b", "--batch-size"), int, "LLAMA_ARG_BATCH",
          "prompt tokens one slot reads in a pass at most (default 2048; the engine measures a smaller chunk "
          "that keeps other slots' next tokens prompt)", 2048),
    _Flag("ubatch-size", ("-ub", "--ubatch-size"), int, "LLAMA_ARG_UBATCH",
          "tokens in one forward pass at most, all slots together (default 512)", 512),
    _Flag("cache-type-k", ("-ctk", "--cache-type-k"), str, "LLAMA_ARG_CACHE_TYPE_K", "KV cache type for keys: f16 (default), bf16, f32 or q8_0", "f16"),
    _Flag("cache-type-v", ("-ctv", "--cache-type-v"), str, "LLAMA_ARG_CACHE_TYPE_V", "KV cache type for values: f16 (default), bf16, f32 or q8_0", "f16"),
    _Flag("gpu-layers", ("-ngl", "--gpu-layers", "--n-gpu-layers"), str, "LLAMA_ARG_N_GPU_LAYERS",
          "layers on the GPU: all (or auto, -1, or the model's count and up) puts every layer and the output head "
          "on the first card, 0 none; ember does not split a model, so a smaller count is refused. Without a card "
          "the model runs on the CPU and a start line says why"),
    _Flag("device", ("-dev", "--device"), str, "LLAMA_ARG_DEVICE",
          "the device to run the model on, by its --list-devices name (Vulkan0, ...), or none for the CPU; a named "
          "device that cannot hold or run the model is refused"),
    _Flag("alias", ("-a", "--alias"), str, "LLAMA_ARG_ALIAS",
          "model names the API reports, comma-separated (the first in sorted order is the id, as llama-server's)"),
    _Flag("tags", ("--tags",), str, "LLAMA_ARG_TAGS", "the model's tags, comma-separated, listed in /v1/models"),
    _Flag("api-key", ("--api-key",), str, "LLAMA_API_KEY", "comma-separated keys a request must present"),
    _Flag("api-key-file", ("--api-key-file",), str, "LLAMA_ARG_API_KEY_FILE",
          "file of keys, one a line (blank lines and lines starting with # are skipped); adds to --api-key"),
    _Flag("cors-origin", ("--cors-origin",), str, None,
          "a browser origin allowed to call the server (repeatable; * for any, without credentials; localhost for "
          "any page served from this machine; default: none, pages of the server's own origin only)"),
    _Flag("cors-origins", ("--cors-origins",), str, "LLAMA_ARG_CORS_ORIGINS",
          "llama-server's spelling: the origins of --cors-origin, comma-separated"),
    _Flag("insecure-no-key", ("--insecure-no-key",), bool, None,
          "serve an address beyond this machine (--host other than loopback) without an API key", False),
    _Flag("chat-template-file", ("--chat-template-file",), str, "LLAMA_ARG_CHAT_TEMPLATE_FILE", "Jinja chat template replacing the model's"),
    _Flag("chat-template", ("--chat-template",), str, "LLAMA_ARG_CHAT_TEMPLATE",
          "chat template replacing the model's: one of llama-server's built-in names (" + ", ".join(NAMED) +
          ") or a Jinja template's text"),
    _Flag("system-prompt-file", ("--system-prompt-file",), str, None,
          "a file whose text is the system message of every chat that sends none"),
    _Flag("chat-template-kwargs", ("--chat-template-kwargs",), str, "LLAMA_CHAT_TEMPLATE_KWARGS",
          "a JSON object of the template's own switches for every chat, e.g. '{\"enable_thinking\": false}' "
          "(a request's chat_template_kwargs win, key by key)"),
    _Flag("reasoning", ("-rea", "--reasoning"), str, "LLAMA_ARG_REASONING",
          "thinking on, off or auto (the template's default): tells the template enable_thinking for every chat "
          "that does not say"),
    _Flag("reasoning-format", ("--reasoning-format",), str, "LLAMA_ARG_THINK",
          "how a thought is returned where the request does not say: auto or deepseek (in reasoning_content; the "
          "default), deepseek-legacy (also left in content) or none (left in content)"),
    _Flag("reasoning-budget", ("--reasoning-budget",), int, "LLAMA_ARG_THINK_BUDGET",
          "tokens of thought before the close is written for the model, where the request gives no budget "
          "(-1: no limit, the default; 0: none)"),
    _Flag("reasoning-budget-message", ("--reasoning-budget-message",), str, "LLAMA_ARG_THINK_BUDGET_MESSAGE",
          "words written before that close, where the request gives none"),
    _Flag("reasoning-preserve", ("--reasoning-preserve",), bool, "LLAMA_ARG_REASONING_PRESERVE",
          "earlier turns' thoughts are kept in the prompt, where the template can drop them (its preserve_reasoning; "
          "default: the template's own)"),
    _Flag("no-reasoning-preserve", ("--no-reasoning-preserve",), bool, None,
          "earlier turns' thoughts are dropped from the prompt, where the template can", False),
    _Flag("reasoning-effort", ("--reasoning-effort",), str, "LLAMA_ARG_REASONING_EFFORT",
          "the reasoning_effort of every chat that sends none: none, minimal, low, medium, high or xhigh "
          "(default: the template's own)"),
    _Flag("seed", ("-s", "--seed"), int, "LLAMA_ARG_SEED", "default seed of requests that set none (-1: a fresh "
          "one for each)", -1),
    _Flag("temp", ("--temp", "--temperature"), float, None, "default temperature (0: greedy)"),
    _Flag("top-k", ("--top-k",), int, None, "default top-k (0: off)"),
    _Flag("top-p", ("--top-p",), float, None, "default top-p (1.0: off)"),
    _Flag("min-p", ("--min-p",), float, None, "default min-p (0.0: off)"),
    _Flag("typical", ("--typical", "--typical-p"), float, None, "default locally typical p (1.0: off)"),
    _Flag("repeat-last-n", ("--repeat-last-n",), int, None, "default count of last tokens the penalties read "
          "(-1: the whole context)"),
    _Flag("repeat-penalty", ("--repeat-penalty",), float, None, "default repeat penalty (1.0: off)"),
    _Flag("presence-penalty", ("--presence-penalty",), float, None, "default presence penalty (0.0: off)"),
    _Flag("frequency-penalty", ("--frequency-penalty",), float, None, "default frequency penalty (0.0: off)"),
    _Flag("no-prefill-assistant", ("--no-prefill-assistant",), bool, "LLAMA_ARG_NO_PREFILL_ASSISTANT",
          "a conversation ending in the assistant's words is a finished turn, and a new one is opened after it "
          "(by default the words are continued)", False),
    _Flag("no-cache-prompt", ("--no-cache-prompt",), bool, "LLAMA_ARG_NO_CACHE_PROMPT",
          "a request reads its whole prompt again, reusing nothing a slot holds, unless it says cache_prompt: true",
          False),
    _Flag("ignore-eos", ("--ignore-eos",), bool, None, "requests go on past the end-of-generation token by default",
          False),
    _Flag("samplers", ("--samplers",), str, None,
          "default chain of samplers, in order, separated by ';' (llama.cpp's names: penalties;top_k;typ_p;top_p;"
          "min_p;temperature, and infill)"),
    _Flag("sampler-seq", ("--sampler-seq", "--sampling-seq"), str, None,
          "default chain of samplers as one letter each (e: penalties, k: top_k, y: typ_p, p: top_p, m: min_p, "
          "t: temperature, i: infill)"),
    _Flag("logit-bias", ("-l", "--logit-bias"), str, None,
          "default bias of a token's logit, TOKEN_ID+BIAS or TOKEN_ID-BIAS (repeatable; -inf bans it)"),
    _Flag("no-slots", ("--no-slots",), bool, None, "do not serve GET /slots (the slots' state)", False),
    _Flag("slot-prompt-similarity", ("-sps", "--slot-prompt-similarity"), float, None,
          "share of a prompt a free slot must already hold for the request to take that slot rather than the "
          "least recently used one (default 0.1; 0: always the least recently used)", 0.1),
    _Flag("ssl-key-file", ("--ssl-key-file",), str, "LLAMA_ARG_SSL_KEY_FILE", "PEM private key: serve HTTPS"),
    _Flag("ssl-cert-file", ("--ssl-cert-file",), str, "LLAMA_ARG_SSL_CERT_FILE", "PEM certificate chain for HTTPS"),
    _Flag("verbose", ("-v", "--verbose", "--log-verbose"), bool, None,
          "every reply carries llama-server's __verbose object (the prompt as the model read it, the stop, the "
          "timings) unless the request sets verbose false; the log is as without it", False),
    _Flag("metrics", ("--metrics",), bool, "LLAMA_ARG_ENDPOINT_METRICS", "serve Prometheus metrics at /metrics", False),
    _Flag("cache-ram", ("-cram", "--cache-ram"), int, "LLAMA_ARG_CACHE_RAM",
          "MiB of host memory for conversations whose slot went to another (0: off, -1: no limit; default: "
          "a quarter of the free memory, at most 8192)"),
    _Flag("cache-reuse", ("--cache-reuse",), int, "LLAMA_ARG_CACHE_REUSE",
          "min chunk to reuse from the cache by shifting it (0 only: ember reuses the shared prefix)", 0),
    _Flag("ctx-checkpoints", ("-ctxcp", "--ctx-checkpoints", "--swa-checkpoints"), int, "LLAMA_ARG_CTX_CHECKPOINTS",
          "checkpoints of a hybrid model's recurrent states kept per slot, so a prompt that parts from what the "
          "slot holds resumes from the newest one before the parting (default 32, llama-server's; 0: none)", 32),
    _Flag("ctx-checkpoints-interval", ("--ctx-checkpoints-interval",), int, None,
          "a long prompt of a hybrid model is checkpointed every N positions (default 1024; 0: never)", 1024),
    _Flag("checkpoint-min-step", ("-cms", "--checkpoint-min-step"), int, "LLAMA_ARG_CHECKPOINT_MIN_SPACING_NT",
          "interval checkpoints keep at least N positions from any other, and a full list drops one that close "
          "first (default 0: no minimum)", 0),
    _Flag("slot-save-path", ("--slot-save-path",), str, "LLAMA_ARG_SLOT_SAVE_PATH", "existing directory for saved slots"),
    _Flag("timeout", ("-to", "--timeout"), int, "LLAMA_ARG_TIMEOUT",
          "seconds a request may take to arrive whole (its line and headers within the lesser of this and 30), "
          "and an idle connection stays open (default 600, llama-server's)", 600),
    _Flag("max-connections", ("--max-connections",), int, None,
          "connections open at once; past them a new one is answered 503 (default 256)", 256),
    _Flag("shutdown-timeout", ("--shutdown-timeout",), int, None,
          "seconds the requests in flight get to finish on SIGTERM or /shutdown; then they are cut, each ending with "
          "an error in its route's shape (default 5)", 5),
    _Flag("responses-max", ("--responses-max",), int, None,
          "responses the Responses API keeps for previous_response_id and GET (default 1024; 0: none); the "
          "oldest finished go first, and a restart loses them", 1024),
    _Flag("responses-max-mib", ("--responses-max-mib",), int, None,
          "MiB the kept responses may take together (default 64)", 64),
    _Flag("sse-ping-interval", ("--sse-ping-interval",), int, "LLAMA_ARG_SSE_PING_INTERVAL",
          "seconds a streamed reply waits for its first token before its stream starts with an SSE comment, "
          "sent again each such interval, to keep the client's connection (-1: never; default 30, llama-server's)",
          30),
    _Flag("sleep-idle-seconds", ("--sleep-idle-seconds",), int, None,
          "seconds without a request that needs the model, after which it is let go (its memory and caches) "
          "until the next one loads it again (-1: never, the default)", -1),
    _Flag("queue-depth", ("--queue-depth",), int, None, "requests waiting beyond the ones served; past it, 503 (default 64)", 64),
    _Flag("no-webui", ("--no-webui", "--no-ui"), bool, "LLAMA_ARG_NO_WEBUI",
          "do not serve the chat page at / (clients probing / still get their answer)", False),
    _Flag("path", ("--path",), str, "LLAMA_ARG_STATIC_PATH", "a folder of your own files served at / instead of "
          "the chat page"),
    _Flag("api-prefix", ("--api-prefix",), str, "LLAMA_ARG_API_PREFIX",
          "a path every route is served under, without the trailing slash, as llama-server's (/api: "
          "/api/v1/chat/completions, the chat page at /api/; nothing answers outside it)"),
    _Flag("embeddings", ("--embedding", "--embeddings"), bool, "LLAMA_ARG_EMBEDDINGS",
          "serve /v1/embeddings and /embedding (completions stay served too)", False),
    _Flag("spm-infill", ("--spm-infill",), bool, None,
          "/infill puts the suffix before the prefix (suffix/prefix/middle), as some models were trained", False),
    _Flag("embd-normalize", ("--embd-normalize",), int, None,
          "how /v1/embeddings and /embedding normalize a vector where the request's embd_normalize does not say: "
          "-1 none, 0 max-abs (int16), 1 taxicab, 2 euclidean (the default), p > 2 the p-norm", 2),
    _Flag("pooling", ("--pooling",), str, "LLAMA_ARG_POOLING",
          "how embeddings are pooled: none, mean, cls, last or rank (default: the model file's own, else none)"),
    _Flag("reranking", ("--rerank", "--reranking"), bool, "LLAMA_ARG_RERANKING",
          "serve /rerank with a reranker model (--embeddings --pooling rank)", False),
]
_BY_NAME = {f.name: f for f in _FLAGS}
#: Flags whose values from every source add up rather than one replacing another.
_ADDED_UP = ("api-key", "api-key-file", "cors-origin", "cors-origins")
#: Flags given once per value.
_REPEATED = ("cors-origin", "logit-bias")
_READ_ENV = {f.env for f in _FLAGS if f.env} | llama_flags.ENV_NAMES


class _Parser(argparse.ArgumentParser):
    # argparse exits on its own; raising keeps parse_options callable from tests
    # and lets main() print one line and choose the status.
    def error(self, message: str):  # type: ignore[override]
        raise OptionError(message, 2)


def build_parser(prog: str = "ember serve") -> argparse.ArgumentParser:
    p = _Parser(prog=prog, description="Serve a GGUF model over HTTP: OpenAI- and llama-server-compatible routes.",
                epilog="Each flag also reads its llama-server variable (LLAMA_ARG_*); the command line wins.")
    for f in _FLAGS:
        env = f" [env {f.env}]" if f.env else ""
        if f.kind is bool:
            p.add_argument(*f.spellings, dest=f.name, action="store_true", default=None, help=f.help + env)
        elif f.name in _REPEATED:
            p.add_argument(*f.spellings, dest=f.name, action="append", default=None,
                           metavar="ORIGIN" if f.name == "cors-origin" else "BIAS", help=f.help + env)
        else:
            p.add_argument(*f.spellings, dest=f.name, type=f.kind, default=None, metavar=f.name.split("-")[-1].upper(),
                           help=f.help + env)
    p.add_argument("--config", metavar="FILE", help="JSON object of long flag names, e.g. {\"ctx-size\": 4096}")
    p.add_argument("--usage", action="help", help=argparse.SUPPRESS)
    p.add_argument("--version", action="version", version=f"ember {_version()}", help="print the version and exit")
    p.add_argument("--list-devices", action="store_true", default=None,
                   help="list the devices a model can run on, and exit")
    llama_flags.add_to(p)
    return p


def _version() -> str:
    from ember import __version__

    return __version__


def _refuse_glued(argv: list[str], parser: argparse.ArgumentParser) -> None:
    """A single-dash word that is no flag's spelling (`-ngx`) is refused, not
    read as a short flag with its value glued on (`-n gx`), as argparse would."""
    known = set(parser._option_string_actions)
    for arg in argv:
        word = arg.split("=", 1)[0]
        if len(word) > 2 and word[0] == "-" and word[1] != "-" and word not in known:
            try:
                float(word)
                continue  # a negative number, a flag's value
            except ValueError:
                pass
            raise OptionError(f"{word}: not a flag of ember or llama-server's (it is not read as {word[:2]} "
                              f"{word[2:]})")


def _flag(name: str) -> str:
    return "--" + name


def _show(f: _Flag, value: Any) -> str:
    if f.name in ("api-key", "hf-token"):
        return "(hidden)"
    if f.kind is bool:
        return "true" if value else "false"
    return str(value)


def _env_value(f: _Flag, raw: str) -> Any:
    if f.kind is bool:
        low = raw.strip().lower()
        if low in _TRUTHY:
            return True
        if low in _FALSEY:
            return False
        raise OptionError(f"{f.env}={raw!r} is not a yes/no value (use 1/0, true/false, on/off)")
    if f.kind in (int, float):
        try:
            return f.kind(raw.strip())
        except ValueError:
            raise OptionError(f"{f.env}={raw!r} is not {'an integer' if f.kind is int else 'a number'}") from None
    return raw


def _cors_origins(args, config: dict[str, Any], environ: Mapping[str, str]) -> list[str]:
    """Every allowed origin, added up: --cors-origin (repeated), --cors-origins
    (comma-separated, llama-server's), the config's keys of both names and
    LLAMA_ARG_CORS_ORIGINS."""
    given = [("--cors-origin", o) for o in getattr(args, "cors-origin") or []]
    lists = [("--cors-origins", getattr(args, "cors-origins")), ("LLAMA_ARG_CORS_ORIGINS",
                                                                  environ.get("LLAMA_ARG_CORS_ORIGINS"))]
    lists += [(f"--config {args.config}: \"{k}\"", config.get(k)) for k in ("cors-origin", "cors-origins")]
    given += [(where, o) for where, raw in lists if isinstance(raw, str) for o in raw.split(",")]
    out = []
    for where, o in ((w, x.strip()) for w, x in given):
        if o == "null":
            raise OptionError(f"{where} null: the opaque origin of sandboxed pages and files is never trusted")
        if o not in ("*", "localhost") and not (o.startswith(("http://", "https://"))
                                                and "/" not in o.split("://", 1)[1]):
            raise OptionError(f"{where} {o!r}: expected *, localhost or an origin such as http://localhost:3000 "
                              "(scheme and host, no path)")
        out.append(o)
    return list(dict.fromkeys(out))


def _names(raw: str | None) -> list[str]:
    """A comma-separated list's items, stripped, empty ones dropped, each once, sorted
    (llama-server keeps aliases and tags in an ordered set)."""
    return sorted({x.strip() for x in (raw or "").split(",") if x.strip()})


def _keys_named(where: str, raw: str) -> list[str]:
    """The comma-separated keys of one source; one that names none is
    refused (an empty flag would otherwise start an open server)."""
    keys = [k.strip() for k in raw.split(",")]
    if not any(keys):
        raise OptionError(f"{where}: names no key (an empty key would leave the server open; leave the flag out "
                          "for that)")
    for k in keys:
        if not k:
            raise OptionError(f"{where}: an empty key between commas")
        if any(c.isspace() for c in k):
            raise OptionError(f"{where}: a key may not contain spaces")
    return keys


def _api_keys(args, config: dict[str, Any], environ, rules: dict) -> list[str]:
    """Every key from every source, added up: --api-key, the config's
    "api-key", LLAMA_API_KEY and the key files they name (whose lines may
    carry a key's scope and limits, into `rules`)."""
    keys: list[str] = []
    if args.__dict__.get("api-key") is not None:
        keys += _keys_named("--api-key", args.__dict__["api-key"])
    if "api-key" in config:
        keys += _keys_named(f"--config {args.config}: \"api-key\"", config["api-key"])
    if "LLAMA_API_KEY" in environ:
        keys += _keys_named("LLAMA_API_KEY", environ["LLAMA_API_KEY"])
    files = [("--api-key-file", args.__dict__.get("api-key-file")),
             (f"--config {args.config}: \"api-key-file\"", config.get("api-key-file")),
             ("LLAMA_ARG_API_KEY_FILE", environ.get("LLAMA_ARG_API_KEY_FILE"))]
    for where, path in files:
        if path is not None:
            keys += _key_file(where, path, rules)
    return list(dict.fromkeys(keys))


def _key_file(where: str, path: str, rules: dict) -> list[str]:
    """The keys of a key file; a line's fields (scope, inflight, rate,
    burst: `ember.server.keys`) go into `rules`."""
    from ember.server.keys import parse_key_line

    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise OptionError(f"{where} {path}: cannot read it ({e})", 1) from None
    keys = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            key, rule = parse_key_line(line)
        except ValueError as e:
            raise OptionError(f"{where} {path}: line {n}: {e}", 1) from None
        if line != key:
            rules[key] = rule
        keys.append(key)
    if not keys:
        raise OptionError(f"{where} {path}: holds no key (only blank or # lines)", 1)
    return keys


def _loopback(host: str) -> bool:
    """Whether `host` is reached from this machine only. A name other than
    localhost may resolve anywhere, so it counts as reaching beyond; a UNIX
    socket is this machine's."""
    import ipaddress

    if host.lower() in ("localhost", "localhost.") or host.endswith(".sock"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _read_config(path: str) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise OptionError(f"--config {path}: {e.strerror or e}", 1) from None
    except json.JSONDecodeError as e:
        raise OptionError(f"--config {path}: not JSON ({e})", 1) from None
    if not isinstance(data, dict):
        raise OptionError(f"--config {path}: must be a JSON object of flag names", 1)
    out: dict[str, Any] = {}
    for key, value in data.items():
        f = _BY_NAME.get(key)
        if f is None:
            raise OptionError(f"--config {path}: unknown key {key!r} (keys are long flag names such as \"ctx-size\")", 1)
        if f.name == "api-key" and isinstance(value, list) and all(isinstance(v, str) for v in value):
            value = ",".join(value)
        if f.kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if f.name in _REPEATED and isinstance(value, list) and all(isinstance(v, str) for v in value):
            value = ",".join(value)
        # bool is an int in Python; a JSON `true` for a number is a mistake, not 1.
        ok = isinstance(value, f.kind) and not (f.kind in (int, float) and isinstance(value, bool))
        if not ok:
            want = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}[f.kind]
            raise OptionError(f"--config {path}: {key!r} must be {want}, not {json.dumps(value)}", 1)
        out[key] = value
    return out


def kv_bytes_per_position(info: Mapping[str, Any]) -> int | None:
    """f16 K and V bytes one position costs across the layers that keep a
    cache, from `_native.inspect`'s reading of the header (per-layer head
    widths and counts, layers that read another layer's cache)."""
    per_pos = info.get("kv_bytes_per_position")
    return int(per_pos) if per_pos else None


def _mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB"


def _resolve_model(model: str | None, source: str, lines: list[str]) -> str:
    if model is None:
        from ember.fetch import default_model_path

        path = default_model_path()
        lines.append(f"model: {path} (ember's default, SmolLM2-135M-Instruct; pass -m FILE for another)")
        return str(path)
    p = Path(model).expanduser()
    if not p.is_file():
        raise OptionError(f"--model {model}: no such file", 1)
    lines.append(f"model: {p} (from {source})")
    return str(p)


def _fetch_model(values: dict[str, Any], lines: list[str]) -> str:
    """The local path of the model --hf-repo names, fetched if not cached."""
    from ember.hub import HubError, fetch

    ref = values["hf-repo"]
    try:
        path = fetch(ref, file=values["hf-file"], offline=bool(values["offline"]), token=values["hf-token"])
    except HubError as e:
        raise OptionError(f"--hf-repo {ref}: {e}", 1) from None
    lines.append(f"model: {path} ({ref}{' offline' if values['offline'] else ''}, from the hub's cache)")
    return str(path)


def _fetch_url(values: dict[str, Any], lines: list[str]) -> str:
    """The local path of the model --model-url names: --model's path when
    given (as llama-server's), else a place of its own in ember's cache."""
    from ember.download import DownloadError, fetch_url, url_target
    from ember.fetch import models_dir

    url = values["model-url"]
    try:
        target = Path(values["model"]).expanduser() if values["model"] else url_target(url, models_dir())
        cached = target.is_file()
        path = fetch_url(url, target, offline=bool(values["offline"]))
    except DownloadError as e:
        raise OptionError(f"--model-url: {e}", 1) from None
    lines.append(f"model: {path} (from {url}{', fetched before: remove the file to fetch it again' if cached else ''})")
    return str(path)


def _choose_ctx(requested: int, info: Mapping[str, Any], mem_available: int | None, lines: list[str],
                kv_scale: float = 1.0) -> int:
    meta = info["metadata"]
    arch = meta.get("general.architecture")
    trained = meta.get(f"{arch}.context_length")
    per_pos = kv_bytes_per_position(info)
    if per_pos:
        per_pos = max(1, int(per_pos * kv_scale))  # the cache type's entries against f16's
    cap = None
    if per_pos and mem_available:
        cap = (mem_available // 2 // per_pos) // _MIN_CTX * _MIN_CTX
    if requested > 0:
        note = ""
        if isinstance(trained, int) and requested > trained:
            note = f"; beyond the {trained} positions the model was trained on, quality may fall"
        if cap is not None and requested > cap:
            note += f"; its KV cache ({_mib(requested * per_pos)}) exceeds half the available memory"
        lines.append(f"context: {requested} positions (from -c/--ctx-size{note})")
        return requested
    if not isinstance(trained, int) or trained <= 0:
        raise OptionError("--ctx-size: the model file does not state its trained context length; pass -c N", 1)
    if cap is None:
        lines.append(f"context: {trained} positions (the model's trained length; free memory unknown, not capped)")
        return trained
    if cap < _MIN_CTX:
        raise OptionError(
            f"--ctx-size: even {_MIN_CTX} positions need {_mib(_MIN_CTX * per_pos)} of KV cache, "
            f"more than half the available {_mib(mem_available)}", 1)
    if trained > cap:
        lines.append(
            f"context: {cap} positions, not the trained {trained}: {trained} would need "
            f"{_mib(trained * per_pos)} of KV cache and half the available memory is {_mib(mem_available // 2)} "
            f"(pass -c N to choose)")
        return cap
    lines.append(f"context: {trained} positions (the model's trained length; KV cache {_mib(trained * per_pos)})")
    return trained


def parse_options(argv: list[str], environ: Mapping[str, str], *, prog: str = "ember serve",
                  mem_available: int | None = None) -> tuple[ServerOptions, list[str]]:
    """The validated options and the start lines (without the `ember: ` prefix).

    Raises `OptionError` for anything ember cannot honour. `mem_available`
    replaces /proc/meminfo's MemAvailable (tests)."""
    parser = build_parser(prog)
    _refuse_glued(argv, parser)
    args = parser.parse_args(argv)
    if args.list_devices:
        raise DevicesListed(devices.listing())
    lines: list[str] = []
    config: dict[str, Any] = _read_config(args.config) if args.config else {}
    try:
        lines += llama_flags.answer(args, environ, llama_flags.spelling_given(argv))
    except llama_flags.Refusal as e:
        raise OptionError(str(e)) from None

    for key in sorted(environ):
        if key.startswith("LLAMA_ARG_") and key not in _READ_ENV:
            lines.append(f"{key} is not read by ember")

    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for f in _FLAGS:
        cli = getattr(args, f.name)
        env_raw = environ.get(f.env) if f.env else None
        env = _env_value(f, env_raw) if env_raw is not None else None
        if f.name in _ADDED_UP:
            continue  # read from every source by `_api_keys`
        if cli is not None:
            values[f.name], sources[f.name] = cli, "the command line"
            if f.name in config:
                lines.append(f"{_flag(f.name)} {_show(f, cli)} from the command line replaces "
                             f"\"{f.name}\": {_show(f, config[f.name])} from {args.config}")
            elif env_raw is not None:
                shown = "(hidden)" if f.name == "api-key" else env_raw
                lines.append(f"{_flag(f.name)} {_show(f, cli)} from the command line overrides {f.env}={shown}")
        elif f.name in config:
            values[f.name], sources[f.name] = config[f.name], args.config
            if env_raw is not None:
                shown = "(hidden)" if f.name == "api-key" else env_raw
                lines.append(f"\"{f.name}\": {_show(f, config[f.name])} from {args.config} overrides {f.env}={shown}")
        elif env_raw is not None:
            values[f.name], sources[f.name] = env, f.env
        else:
            values[f.name], sources[f.name] = f.default, "default"

    def bad(name: str, why: str, code: int = 2) -> OptionError:
        return OptionError(f"{_flag(name)} {values[name]}: {why} (from {sources[name]})", code)

    port = values["port"]
    from ember.server.protocols.vertex import gcp_routes

    if (vertex := gcp_routes(environ)) is not None:
        # As llama-server: in Vertex AI the platform names the port, over --port.
        raw = environ.get("AIP_HTTP_PORT") or "8080"
        try:
            port = int(raw)
        except ValueError:
            raise OptionError(f"AIP_HTTP_PORT={raw!r} is not a port") from None
        health = f", health at {vertex[1]}" if vertex[1] else ""
        lines.append(f"Vertex AI (AIP_MODE=PREDICTION): predictions at POST {vertex[0]}{health}, on port {port} "
                     "(AIP_HTTP_PORT)" + (f", over --port {values['port']}" if sources["port"] != "default" else ""))
    if not 0 <= port <= 65535:
        raise bad("port", "out of range 0-65535")
    if values["ctx-size"] < 0:
        raise bad("ctx-size", "must be 0 (the model's length) or positive")
    if values["slot-ctx"] is not None:
        if values["slot-ctx"] < 1:
            raise bad("slot-ctx", "must be at least 1")
        if sources["ctx-size"] != "default":
            raise bad("slot-ctx", f"names one slot's context; give it or --ctx-size ({sources['ctx-size']}), not both")
    if values["parallel"] < 1 and values["parallel"] != -1:
        raise bad("parallel", "must be at least 1, or -1 (auto)")
    if values["n-predict"] < -1:
        raise bad("n-predict", "must be -1 (no limit) or a count")
    if values["embd-normalize"] < -1:
        raise bad("embd-normalize", "expected -1 (none), 0, 1, 2 or a larger p")
    if values["sse-ping-interval"] < -1:
        raise bad("sse-ping-interval", "must be -1 (never) or a count of seconds")
    if values["sleep-idle-seconds"] == 0 or values["sleep-idle-seconds"] < -1:
        raise bad("sleep-idle-seconds", "must be -1 (never) or a count of seconds")
    if values["sleep-idle-seconds"] > 0:
        lines.append(f"sleep: after {values['sleep-idle-seconds']} s with no request that needs the model, it is let "
                     "go (its memory and caches) until the next one loads it again")
    if values["threads"] < -1:
        raise bad("threads", "must be 0 (physical cores) or a count")
    if values["timeout"] < 1:
        raise bad("timeout", "must be at least 1 second")
    if values["max-connections"] < 1:
        raise bad("max-connections", "must be at least 1")
    if values["shutdown-timeout"] < 0:
        raise bad("shutdown-timeout", "must be 0 (cut at once) or more seconds")
    if values["queue-depth"] < 0:
        raise bad("queue-depth", "must be 0 or more")
    if values["responses-max"] < 0:
        raise bad("responses-max", "must be 0 (keep none) or more")
    if values["responses-max-mib"] < 1:
        raise bad("responses-max-mib", "must be at least 1")
    for name in ("batch-size", "ubatch-size"):
        if values[name] < 1:
            raise bad(name, "must be at least 1")
    if not 0.0 <= values["slot-prompt-similarity"] <= 1.0:
        raise bad("slot-prompt-similarity", "must be between 0.0 and 1.0")
    hosts = [h.strip() for h in values["host"].split(",")]
    if not any(hosts):
        raise bad("host", "names no address")
    hosts = list(dict.fromkeys(h for h in hosts if h))
    kv_type = _kv_type(values, sources, bad)

    if values["hf-repo"] is not None:
        if values["model"] is not None:
            raise bad("hf-repo", f"and --model ({sources['model']}) both name the model; give one")
        if values["model-url"] is not None:
            raise bad("hf-repo", f"and --model-url ({sources['model-url']}) both name the model; give one")
        model = _fetch_model(values, lines)
    elif values["model-url"] is not None:
        model = _fetch_url(values, lines)
    else:
        if values["hf-file"] is not None:
            raise bad("hf-file", "names a file of --hf-repo, which is not given")
        model = _resolve_model(values["model"], sources["model"], lines)
    from ember import _native

    try:
        info = _native.inspect(model, 0)
        meta = info["metadata"]
    except Exception as e:  # any unreadable header is the user's file, not a bug to trace
        raise OptionError(f"--model {model}: not a GGUF file ember can read ({e})", 1) from None

    # -np auto: llama-server's four slots, sharing the context unless told otherwise.
    auto = values["parallel"] == -1
    parallel = _AUTO_SLOTS if auto else values["parallel"]
    if values["no-kv-unified"] and values["kv-unified"]:
        raise bad("kv-unified", "and --no-kv-unified both given; give one")
    unified = (not values["no-kv-unified"] and auto) if values["kv-unified"] is None else values["kv-unified"]
    requested = values["ctx-size"] if values["slot-ctx"] is None else values["slot-ctx"] * (1 if unified else parallel)
    ctx = _choose_ctx(requested, info, machine.mem_available() if mem_available is None else mem_available, lines,
                      kv_scale=_CACHE_TYPE_SCALE[kv_type])
    lines.append(f"KV cache: {kv_type} keys and values" + ("" if kv_type == "f16" else f" (from {sources['cache-type-k']})"))
    _device_request(values, sources, bad, lines)

    depth = values["queue-depth"]
    if parallel > 1 and unified:
        why = "-np auto, llama-server's default" if auto and values["kv-unified"] is None else sources["kv-unified"]
        lines.append(f"slots: {parallel} sharing one context of {ctx} positions (from {why}): each "
                     "holds up to all of it, idle conversations giving way to busy ones; answered together in each "
                     f"pass; up to {depth} more waiting; past that, 503" +
                     ("; one slot of the whole context if the model runs on a device" if auto else ""))
    elif parallel > 1:
        lines.append(f"slots: {parallel}, each of {ctx // parallel} positions (the context is cut among them), "
                     f"answered together in each pass; up to {depth} more waiting; past that, 503")
    else:
        lines.append(f"slots: 1, up to {depth} more waiting; past that, 503")

    threads = max(values["threads"], 0)
    if threads:
        lines.append(f"threads: {threads} (from {sources['threads']})")
    else:
        lines.append(f"threads: {machine.physical_cores()} (the physical cores)")

    if values["n-predict"] >= 0:
        lines.append(f"max tokens per request: {values['n-predict']} unless the request asks for fewer or more")

    aliases = _names(values["alias"])
    if values["alias"] is not None and not aliases:
        raise bad("alias", "names no model name")
    alias = aliases[0] if aliases else None
    if len(aliases) > 1:
        lines.append(f"model names: {', '.join(aliases)}, the id {alias} (from {sources['alias']})")
    else:
        lines.append(f"model name: {alias} (from {sources['alias']})" if alias is not None
                     else f"model name: {meta.get('general.name') or Path(model).stem} (from the file)")
    tags = _names(values["tags"])
    if tags:
        lines.append(f"model tags: {', '.join(tags)} (from {sources['tags']})")

    template = values["chat-template-file"]
    template_text = None
    if template is not None and values["chat-template"] is not None:
        raise bad("chat-template", f"and --chat-template-file ({sources['chat-template-file']}) both name the "
                  "template; give one")
    if values["chat-template"] is not None:
        named = values["chat-template"].strip()
        if named in NAMED:
            template_text = NAMED[named]
            lines.append(f"chat template: llama-server's built-in {named!r} (from {sources['chat-template']})")
        elif "{{" in named or "{%" in named:
            template_text = values["chat-template"]
            lines.append(f"chat template: the Jinja text given (from {sources['chat-template']})")
        else:
            raise bad("chat-template", f"is neither a built-in template's name ({', '.join(NAMED)}) nor a Jinja "
                      "template's text")
    elif template is not None:
        tp = Path(template).expanduser()
        try:
            tp.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise OptionError(f"--chat-template-file {template}: cannot read it ({e})", 1) from None
        template = str(tp)
        lines.append(f"chat template: {tp} (from --chat-template-file)")
    elif meta.get("tokenizer.chat_template"):
        lines.append("chat template: the model file's own")
    else:
        lines.append("chat template: ember's built-in fallback (the file has none)")

    system_prompt = None
    if values["system-prompt-file"] is not None:
        sp = Path(values["system-prompt-file"]).expanduser()
        try:
            system_prompt = sp.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise OptionError(f"--system-prompt-file {sp}: cannot read it ({e})", 1) from None
        lines.append(f"system prompt: {sp} ({len(system_prompt)} characters), the system message of every chat "
                     "that sends none")

    sampling = _sampling_defaults(values, sources, meta, lines, bad)
    reasoning = _reasoning_defaults(values, sources, lines, bad)
    ubatch = min(values["ubatch-size"], values["batch-size"])
    if sources["batch-size"] != "default" or sources["ubatch-size"] != "default":
        lines.append(f"passes: at most {ubatch} tokens each (-ub), a slot's prompt read at most "
                     f"{min(values['batch-size'], ubatch)} a pass (-b), in chunks the engine measures below that")
    sps = values["slot-prompt-similarity"]
    if sources["slot-prompt-similarity"] != "default":
        lines.append(f"slot choice: a free slot holding {sps:.0%} of a prompt is taken for it (-sps)" if sps
                     else "slot choice: the least recently used free slot (-sps 0)")

    ssl_files = (values["ssl-key-file"], values["ssl-cert-file"])
    if any(v is not None for v in ssl_files):
        if None in ssl_files:
            missing = "ssl-cert-file" if ssl_files[1] is None else "ssl-key-file"
            raise OptionError(f"--{missing}: HTTPS needs both --ssl-key-file and --ssl-cert-file")
        _check_ssl(*ssl_files)
        lines.append(f"HTTPS: certificate {ssl_files[1]} (from --ssl-cert-file)")
    if values["no-slots"]:
        lines.append("GET /slots: not served (--no-slots)")

    key_rules: dict = {}
    keys = _api_keys(args, config, environ, key_rules)
    origins = _cors_origins(args, config, environ)
    if values["insecure-no-key"] and keys:
        raise OptionError("--insecure-no-key: API keys are set, so the server is not keyless; give one or the other")
    if not keys and not all(_loopback(h) for h in hosts) and not values["insecure-no-key"]:
        raise bad("host", "reaches beyond this machine, and no API key is set: anyone who reaches the address could "
                  "use the server. Give --api-key or --api-key-file, or --insecure-no-key to serve it open")
    lines.append(f"API keys: {len(keys)} accepted (Authorization: Bearer KEY)" if keys
                 else "API keys: none; any client on the network that reaches the address is served")

    if values["cache-reuse"] < 0:
        raise bad("cache-reuse", "must be 0 or more")
    if values["cache-reuse"] > 0:
        raise bad("cache-reuse", "ember does not shift cached chunks yet; it reuses the prefix a prompt shares "
                                 "with a slot (and the host cache), so leave it at 0")

    cache_ram = values["cache-ram"]
    if cache_ram is None:
        avail = machine.mem_available() if mem_available is None else mem_available
        cache_ram = min(8192, (avail or 0) // 4 // 2**20)
        lines.append(f"host prompt cache: {cache_ram} MiB (a quarter of the free memory, at most 8192; --cache-ram)")
    elif cache_ram < -1:
        raise bad("cache-ram", "must be -1 (no limit), 0 (off) or MiB")
    else:
        shown = {0: "off", -1: "no limit"}.get(cache_ram, f"{cache_ram} MiB")
        lines.append(f"host prompt cache: {shown} (from {sources['cache-ram']})")

    for name in ("ctx-checkpoints", "ctx-checkpoints-interval", "checkpoint-min-step"):
        if values[name] < 0:
            raise bad(name, "must be 0 or more")

    slot_path = values["slot-save-path"]
    if slot_path is not None:
        if not Path(slot_path).expanduser().is_dir():
            raise bad("slot-save-path", "is not an existing directory", 1)
        slot_path = str(Path(slot_path).expanduser())
        lines.append(f"slot save path: {slot_path} (POST /slots/ID?action=save|restore writes and reads files there)")

    pooling, embeddings = values["pooling"], bool(values["embeddings"])
    if pooling is not None and pooling not in ("none", "mean", "cls", "last", "rank"):
        raise bad("pooling", f"expected none, mean, cls, last or rank, got {pooling!r}")
    if values["reranking"]:
        if pooling not in (None, "rank"):
            raise bad("pooling", "cannot go with --reranking, which pools by rank")
        pooling, embeddings = "rank", True
        lines.append("reranking: at /rerank and /v1/rerank (the model must be a reranker, with a classification "
                     "head)")
    elif embeddings:
        how = f"pooled by {pooling} (from {sources['pooling']})" if pooling else "pooled as the model file says"
        lines.append(f"embeddings: at /v1/embeddings and /embedding, {how}; /rerank too where the pooling is rank")
    elif pooling is not None:
        raise bad("pooling", "only shapes embeddings, which need --embeddings")

    if values["responses-max"]:
        lines.append(f"responses kept: up to {values['responses-max']} ({values['responses-max-mib']} MiB) in memory "
                     "for previous_response_id and GET /v1/responses/ID, the oldest finished dropped first; lost "
                     "on restart")
    else:
        lines.append("responses kept: none (--responses-max 0); store and previous_response_id are refused")
    if values["metrics"]:
        lines.append(f"metrics: at {values['api-prefix'] or ''}/metrics")
    if values["verbose"]:
        lines.append("replies carry __verbose (-v): the prompt as the model read it, the stop and the timings")
    api_prefix = values["api-prefix"] or ""
    if api_prefix:
        segments = api_prefix.split("/")
        if segments[0] or not all(_PREFIX_SEGMENT.fullmatch(s) and s not in (".", "..") for s in segments[1:]):
            raise bad("api-prefix", "must be a path such as /api: a leading slash, no trailing one, and between "
                      "slashes only letters, digits, '-', '_', '.' and '~'")
        lines.append(f"routes: every one under {api_prefix} (--api-prefix): {api_prefix}/v1/chat/completions, "
                     f"{api_prefix}/health, the page at {api_prefix}/; nothing answers outside it")
    static_path = values["path"]
    if static_path is not None:
        if not Path(static_path).expanduser().is_dir():
            raise bad("path", "is not an existing directory", 1)
        static_path = str(Path(static_path).expanduser().resolve())
        lines.append(f"web page: the files of {static_path} at {api_prefix}/ (from {sources['path']})")
    elif values["no-webui"]:
        lines.append(f"web page: none (--no-webui); GET {api_prefix}/ answers clients that probe it")
    else:
        lines.append(f"web page: a chat page at {api_prefix}/ (--no-webui turns it off)")
    embed = " and embeddings (/v1/embeddings, /embedding, /api/embed)" if values["embeddings"] else ""
    lines.append("APIs: OpenAI's (/v1/chat/completions, /v1/completions, /v1/responses), Anthropic's "
                 "(/v1/messages), llama-server's (/completion, /tokenize, /slots...) and Ollama's (/api/chat, "
                 f"/api/generate...){embed}")

    opts = ServerOptions(
        model=model, host=",".join(hosts), port=port, ctx_size=ctx, parallel=parallel, kv_unified=unified,
        parallel_auto=auto,
        n_predict=values["n-predict"],
        threads=threads, alias=alias, aliases=aliases, tags=tags, api_keys=keys, key_rules=key_rules, cors_origins=origins,
        shutdown_timeout=values["shutdown-timeout"], timeout=values["timeout"],
        max_connections=values["max-connections"], chat_template_file=template, metrics=bool(values["metrics"]),
        slot_save_path=slot_path, queue_depth=depth, kv_type=kv_type, cache_ram_mib=cache_ram,
        gpu_layers=values["gpu-layers"], device=values["device"],
        embeddings=embeddings, pooling=pooling, ctx_checkpoints=values["ctx-checkpoints"],
        checkpoint_interval=values["ctx-checkpoints-interval"], checkpoint_min_step=values["checkpoint-min-step"],
        chat_template=template_text, system_prompt=system_prompt, sampling=sampling, reasoning=reasoning,
        max_batch=ubatch,
        prompt_chunk=min(values["batch-size"], ubatch), slot_similarity=sps, slots_endpoint=not values["no-slots"],
        ssl_key_file=ssl_files[0], ssl_cert_file=ssl_files[1], webui=not values["no-webui"],
        static_path=static_path, api_prefix=api_prefix, responses_max=values["responses-max"],
        responses_max_mib=values["responses-max-mib"], verbose=bool(values["verbose"]),
        spm_infill=bool(values["spm-infill"]), n_batch=values["batch-size"],
        sleep_idle_seconds=values["sleep-idle-seconds"], sse_ping_interval=values["sse-ping-interval"],
        prefill_assistant=not values["no-prefill-assistant"], embd_normalize=values["embd-normalize"],
    )
    return opts, lines


def _device_request(values: dict[str, Any], sources: dict[str, str], bad, lines: list[str]) -> None:
    """-ngl and --device checked before the model loads: their spelling, and
    that a named device is there. Where the model runs is said once it has
    loaded; here, what was asked."""
    from ember.devices import request
    from ember.errors import InvalidRequestError

    try:
        asked = request(values["gpu-layers"], values["device"])
    except InvalidRequestError as e:
        field, why = str(e).split(": ", 1)
        raise bad("gpu-layers" if field == "gpu_layers" else "device", why) from None
    flag = "device" if values["device"] is not None else "gpu-layers"
    if values["device"] is None and values["gpu-layers"] is None:
        return
    if asked.on_cpu:
        lines.append(f"device: none, the model runs on the CPU (from {sources[flag]})")
    elif asked.device:
        there = [d["name"] for d in devices.vulkan_devices()]
        if not any(asked.device.lower() == t.lower() for t in there):
            raise bad("device", "no such device; the devices are: " + ", ".join(there + ["none (the CPU)"]))
        lines.append(f"device: {asked.device} asked for every layer and the output head (from {sources['device']}); "
                     "refused at load if it cannot hold or run the model")
    else:
        lines.append(f"device: the first card asked for every layer and the output head (from {sources[flag]}); "
                     "without one that can run the model, the CPU")


#: The file's recommended sampling (llama.cpp's general.sampling.* keys) ->
#: the flag and the field of `SamplingParams` each sets.
_FILE_SAMPLING = {
    "general.sampling.temp": ("temp", "temperature"),
    "general.sampling.top_k": ("top-k", "top_k"),
    "general.sampling.top_p": ("top-p", "top_p"),
    "general.sampling.min_p": ("min-p", "min_p"),
    "general.sampling.penalty_last_n": ("repeat-last-n", "repeat_last_n"),
    "general.sampling.penalty_repeat": ("repeat-penalty", "repeat_penalty"),
}
#: Flags whose values become the default of the request field beside them.
_SAMPLING_FLAGS = {"temp": "temperature", "top-k": "top_k", "top-p": "top_p", "min-p": "min_p",
                   "typical": "typical_p", "repeat-last-n": "repeat_last_n", "repeat-penalty": "repeat_penalty",
                   "presence-penalty": "presence_penalty", "frequency-penalty": "frequency_penalty"}
#: The file's recommendations for samplers ember does not have, and their off values.
_FILE_UNSUPPORTED = {"general.sampling.mirostat": (0,), "general.sampling.xtc_probability": (0, 0.0)}


def _reasoning_defaults(values: dict[str, Any], sources: dict[str, str], lines: list[str], bad) -> ReasoningDefaults:
    """What every chat is told of thinking where its request does not say
    (--chat-template-kwargs, -rea, --reasoning-*), checked as a request's
    own fields are."""
    from ember.errors import InvalidRequestError
    from ember.reasoning import EFFORTS, resolve_reasoning_request

    kwargs: dict[str, Any] = {}
    if values["chat-template-kwargs"] is not None:
        try:
            kwargs = json.loads(values["chat-template-kwargs"])
        except ValueError as e:
            raise bad("chat-template-kwargs", f"is not JSON ({e})") from None
        if not isinstance(kwargs, dict):
            raise bad("chat-template-kwargs", "must be a JSON object of the template's switches")
        lines.append(f"chat template switches: {json.dumps(kwargs)} for every chat (a request's own win, key by key)")
    if values["reasoning"] is not None:
        said = values["reasoning"].strip().lower()
        if said not in _TRUTHY | _FALSEY | {"auto"}:
            raise bad("reasoning", "expected on, off or auto")
        if said != "auto":
            enable = said in _TRUTHY
            if kwargs.get("enable_thinking", enable) != enable:
                raise bad("reasoning", f"and --chat-template-kwargs ({sources['chat-template-kwargs']}) set "
                          "enable_thinking apart; give one")
            kwargs["enable_thinking"] = enable
            lines.append(f"thinking: {'on' if enable else 'off'} unless a chat asks otherwise (the template is told "
                         f"enable_thinking={str(enable).lower()})")
    keep = values["reasoning-preserve"]
    if values["no-reasoning-preserve"]:
        if keep:
            raise bad("reasoning-preserve", "and --no-reasoning-preserve both given; give one")
        keep = False
    if keep is not None:
        if kwargs.get("preserve_reasoning", keep) != keep:
            raise bad("chat-template-kwargs", "and --reasoning-preserve set preserve_reasoning apart; give one")
        kwargs["preserve_reasoning"] = keep
        lines.append(f"earlier turns' thoughts: {'kept' if keep else 'dropped'} where the template can say "
                     f"(preserve_reasoning={str(keep).lower()})")
    effort = values["reasoning-effort"]
    if effort is not None:
        effort = effort.strip().lower()
        if effort == "default":
            effort = None
        elif effort not in EFFORTS:
            raise bad("reasoning-effort", f"expected default or one of {', '.join(EFFORTS)}")
        else:
            lines.append(f"reasoning effort: {effort} for every chat that sends none")
    budget, message, fmt = values["reasoning-budget"], values["reasoning-budget-message"], values["reasoning-format"]
    try:
        resolve_reasoning_request({"chat_template_kwargs": kwargs, "reasoning_effort": effort,
                                   "reasoning_budget": budget, "reasoning_budget_message": message,
                                   "reasoning_format": fmt})
    except InvalidRequestError as e:
        field, why = str(e).split(":", 1)
        flag = {"reasoning_budget": "reasoning-budget", "reasoning_format": "reasoning-format",
                "reasoning_budget_message": "reasoning-budget-message"}.get(field, "chat-template-kwargs")
        raise bad(flag, why.strip()) from None
    if fmt is not None:
        lines.append(f"reasoning format: {fmt} unless a request names its own")
    if budget is not None and budget >= 0:
        lines.append(f"thought budget: {budget} tokens, then the close is written for the model, unless a request "
                     "gives its own" + (f" (after {message!r})" if message else ""))
    return ReasoningDefaults(template_kwargs=kwargs, reasoning_format=fmt, reasoning_budget=budget,
                             reasoning_budget_message=message, reasoning_effort=effort)


def _sampling_defaults(values: dict[str, Any], sources: dict[str, str], meta: Mapping[str, Any], lines: list[str],
                       bad) -> Any:
    """The defaults of every request's sampling: llama-server's, then the
    model file's recommendations (general.sampling.*), then the flags."""
    from ember.sampling import SamplingParams
    from ember.server import wire
    from ember.server.errors import ApiError

    params = SamplingParams()
    from_file = []
    for key, (flag, field) in _FILE_SAMPLING.items():
        v = meta.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and values[flag] is None:
            setattr(params, field, type(getattr(params, field))(v))
            from_file.append(f"{field} {getattr(params, field):g}")
    for key, off in _FILE_UNSUPPORTED.items():
        if meta.get(key) not in (None, *off):
            lines.append(f"the file recommends {key.rsplit('.', 1)[1]} {meta[key]}: ember has no such sampler, "
                         "so it is left out")
    if meta.get("general.sampling.sequence"):
        lines.append("the file recommends a sampler order: left out; requests run llama.cpp's default chain unless "
                     "--samplers or their own `samplers` name another")
    by_flag = []
    for flag, field in _SAMPLING_FLAGS.items():
        if values[flag] is not None:
            setattr(params, field, values[flag])
            by_flag.append(flag)
    chain_flags = [f for f in ("samplers", "sampler-seq") if values.get(f) is not None]
    if len(chain_flags) > 1:
        raise bad("sampler-seq", "give one of --samplers and --sampler-seq")
    try:
        if chain_flags:
            by_flag.append(chain_flags[0])
            raw = values[chain_flags[0]]
            params.samplers = wire.sampler_names(raw.split(";") if chain_flags[0] == "samplers" else raw)
        check = wire.Sampling(**{field: getattr(params, field) for field in _SAMPLING_FLAGS.values()})
        params = wire.sampling_options(check, 2**31 - 1, params)
    except ApiError as e:
        field = e.param
        flag = (chain_flags[0] if field == "samplers"
                else next((f for f, fd in _SAMPLING_FLAGS.items() if fd == field), None))
        raise (bad(flag, e.message.split(": ", 1)[-1]) if flag in by_flag
               else OptionError(f"the model file's general.sampling: {e.message}", 1)) from None
    if values["seed"] != -1:
        if not 0 <= values["seed"] < 2**64:
            raise bad("seed", "must be -1 (a fresh one per request) or between 0 and 2^64-1")
        params.seed = values["seed"]
        by_flag.append("seed")
    if values["ignore-eos"]:
        params.ignore_eos = True
        by_flag.append("ignore-eos")
    if values.get("no-cache-prompt"):
        params.cache_prompt = False
        lines.append("prompt reuse: off unless a request says cache_prompt: true (--no-cache-prompt)")
    bias = values["logit-bias"]
    if bias:
        params.logit_bias = _logit_biases(bias if isinstance(bias, list) else bias.split(","), sources["logit-bias"])
        by_flag.append("logit-bias")
    if from_file or by_flag:
        shown = ", ".join(f"{k} {v:g}" for k, v in params.settings().items()
                          if k in ("temperature", "top_k", "top_p", "min_p", "typical_p", "repeat_penalty",
                                   "repeat_last_n", "presence_penalty", "frequency_penalty"))
        if params.samplers is not None:
            shown += f", samplers {';'.join(params.samplers)}"
        why = "; ".join(x for x in (f"from the file: {', '.join(from_file)}" if from_file else "",
                                    f"from --{', --'.join(by_flag)}" if by_flag else "") if x)
        lines.append(f"sampling defaults: {shown} ({why}); a request's own fields win")
    return params


def _logit_biases(entries: list[str], source: str) -> dict[int, float]:
    out: dict[int, float] = {}
    for raw in entries:
        m = re.fullmatch(r"\s*(\d+)\s*([+-])\s*(inf|\d+(?:\.\d*)?|\.\d+)\s*", raw, re.I)
        if m is None:
            raise OptionError(f"--logit-bias {raw!r}: expected TOKEN_ID+BIAS or TOKEN_ID-BIAS, such as 15043+1 or "
                              f"15043-inf (from {source})")
        value = float(m.group(3))
        out[int(m.group(1))] = value if m.group(2) == "+" else -value
    return out


def _check_ssl(key_file: str, cert_file: str) -> None:
    import ssl

    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert_file, key_file)
    except FileNotFoundError as e:
        raise OptionError(f"--ssl-cert-file/--ssl-key-file: {e.filename}: no such file", 1) from None
    except (ssl.SSLError, OSError) as e:
        raise OptionError(f"--ssl-cert-file {cert_file} / --ssl-key-file {key_file}: not a certificate and its "
                          f"key ({e})", 1) from None


#: llama-server's cache types, and the ones ember's KV cache stores.
_LLAMA_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
_EMBER_CACHE_TYPES = ("f16", "bf16", "f32", "q8_0")
#: Bytes of an entry of each cache type, as a share of an f16 entry's (Q8_0:
#: 34 bytes a block of 32).
_CACHE_TYPE_SCALE = {"f16": 1.0, "bf16": 1.0, "f32": 2.0, "q8_0": 34 / 64}


def _kv_type(values: dict[str, Any], sources: dict[str, str], bad) -> str:
    for name in ("cache-type-k", "cache-type-v"):
        v = values[name]
        if v not in _LLAMA_CACHE_TYPES:
            raise bad(name, f"is not a cache type (llama-server's are {', '.join(_LLAMA_CACHE_TYPES)})")
        if v not in _EMBER_CACHE_TYPES:
            raise bad(name, f"is not stored by ember's KV cache yet (it stores {', '.join(_EMBER_CACHE_TYPES)})")
    if values["cache-type-k"] != values["cache-type-v"]:
        raise bad("cache-type-v", f"differs from --cache-type-k {values['cache-type-k']}: ember stores keys and values in one type")
    return values["cache-type-k"]


def _say(line: str) -> None:
    print(f"ember: {line}", file=sys.stderr, flush=True)


def _url(host: str, port: int, scheme: str = "http") -> str:
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


async def _drain(engine, grace: float) -> None:
    """Waits up to `grace` seconds for the requests in flight (and those
    waiting for a slot) to finish; what is left is cut by the engine's close."""
    left = engine.n_busy + engine.waiting()
    if not left or grace <= 0:
        return
    _say(f"waiting up to {grace:g} s for {left} request{'s' * (left != 1)} in flight (--shutdown-timeout)")
    deadline = time.monotonic() + grace
    while engine.n_busy + engine.waiting() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)


async def serve(opts: ServerOptions, *, create_app: Callable | None = None) -> int:
    """Binds, prints the listening line, and runs until a signal, POST /shutdown
    or a failed model load. Returns the exit status."""
    from aiohttp import web

    from ember.server.connections import GuardedRunner
    from ember.server.http import RUNNER_OPTIONS

    if create_app is None:
        try:
            from ember.server.app import create_app
        except ModuleNotFoundError as e:
            if e.name != "ember.server.app":
                raise
            _say("this install has no HTTP app (ember.server.app); reinstall ember")
            return 1

    loop = asyncio.get_running_loop()
    stop: asyncio.Future[str] = loop.create_future()

    def request_stop(cause: str) -> None:
        if stop.done():
            # The first request is already unwinding; a second one means the
            # user will not wait for it.
            _say(f"stopping at once ({cause})")
            os._exit(130)
        stop.set_result(cause)

    def request_shutdown(cause: str) -> None:
        # Handlers may call it from a worker thread as well as from the loop.
        loop.call_soon_threadsafe(request_stop, cause)

    app = create_app(opts)
    app["request_shutdown"] = request_shutdown
    app.setdefault("closing", False)
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, request_stop, sig.name)
        except (NotImplementedError, RuntimeError):  # platforms without loop signal support
            signal.signal(sig, lambda s, _f: loop.call_soon_threadsafe(request_stop, signal.Signals(s).name))

    # Handlers still streaming get this long after the engine stops them.
    runner = GuardedRunner(app, head_timeout=min(opts.timeout, 30), max_connections=opts.max_connections, log=_say,
                           handle_signals=False, access_log=None, shutdown_timeout=5.0, **RUNNER_OPTIONS)
    await runner.setup()
    tls = None
    if opts.ssl_cert_file and opts.ssl_key_file:
        import ssl

        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(opts.ssl_cert_file, opts.ssl_key_file)
    scheme = "https" if tls else "http"
    port = opts.port
    for host in opts.hosts:
        # Port 0 takes a free port once; every other address listens on the same one.
        site = (web.UnixSite(runner, host, ssl_context=tls) if host.endswith(".sock")
                else web.TCPSite(runner, host, port, ssl_context=tls))
        where = host if host.endswith(".sock") else _url(host, port, scheme)
        try:
            await site.start()
        except OSError as e:
            _say(f"cannot listen on {where}: {e.strerror or e}")
            await runner.cleanup()
            return 1
        if not host.endswith(".sock"):
            sockets = getattr(site._server, "sockets", None) or []
            port = sockets[0].getsockname()[1] if sockets else port
            where = _url(host, port, scheme)
        _say(f"listening on {where}")

    waits: list[asyncio.Future] = [stop]
    failed = app.get("load_failed")
    if isinstance(failed, asyncio.Event):
        waits.append(asyncio.ensure_future(failed.wait()))
    elif isinstance(failed, asyncio.Future):
        waits.append(failed)
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)

    status = 0
    if stop.done():
        _say(f"stopping ({stop.result()})")
    else:
        status = 1
        _say(f"the model failed to load: {_load_failure(app, failed)}")
    app["closing"] = True
    state = app.get("state")
    if state is not None and hasattr(state, "closing"):
        # The app keeps its own flag there; both say the same thing. New
        # requests are refused from here on.
        state.closing = True
    # The state's: a server that slept and woke holds another engine than the first.
    engine = state.engine if state is not None and hasattr(state, "engine") else app.get("engine")
    if engine is not None and hasattr(engine, "n_busy"):
        await _drain(engine, opts.shutdown_timeout)
    if engine is not None and hasattr(engine, "close"):
        # close() joins the engine thread: off the loop, so a second signal
        # is still heard while the current request ends.
        await asyncio.to_thread(engine.close)
    await runner.cleanup()
    for w in waits[1:]:
        if isinstance(w, asyncio.Task):
            w.cancel()
    return status


def _load_failure(app, failed) -> str:
    if isinstance(failed, asyncio.Future) and failed.done() and not failed.cancelled():
        exc = failed.exception()
        if exc is not None:
            return str(exc) or type(exc).__name__
        if failed.result() is not None:
            return str(failed.result())
    reason = app.get("load_error") or getattr(app.get("state"), "load_error", None)
    return str(reason) if reason is not None else "see the lines above"


def main(argv: list[str] | None = None, *, prog: str = "ember-server") -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        opts, lines = parse_options(argv, os.environ, prog=prog)
    except DevicesListed as e:
        print(e)
        return 0
    except OptionError as e:
        print(f"ember: {e}", file=sys.stderr, flush=True)
        return e.code
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # fetching the default model, mostly: one line, not a traceback
        from ember.errors import EmberError

        if not isinstance(e, (EmberError, OSError)):
            raise
        print(f"ember: {e}", file=sys.stderr, flush=True)
        return 1
    for line in lines:
        _say(line)
    try:
        return asyncio.run(serve(opts))
    except KeyboardInterrupt:
        return 130


def _console() -> None:
    sys.exit(main())


if __name__ == "__main__":
    _console()
