"""What `ember serve` was asked for: the settings the HTTP app and the engine
read, already validated by the command line (`ember.server.cli`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ember.sampling import SamplingParams


@dataclass(frozen=True)
class ReasoningDefaults:
    """What a chat is told of thinking where its request does not say
    (llama-server's --chat-template-kwargs, -rea and --reasoning-* flags)."""

    #: the template's switches (enable_thinking from -rea among them)
    template_kwargs: dict = field(default_factory=dict)
    reasoning_format: str | None = None
    #: tokens of thought before the close is written (-1: no limit)
    reasoning_budget: int | None = None
    reasoning_budget_message: str | None = None
    reasoning_effort: str | None = None


@dataclass
class ServerOptions:
    #: GGUF file; None means ember's default model (fetched once)
    model: str | None = None
    #: addresses to listen on, comma-separated (a path ending in .sock: a UNIX socket)
    host: str = "127.0.0.1"
    #: 0 takes a free port (printed at start)
    port: int = 8080
    #: 0: the model's trained context, capped by memory
    ctx_size: int = 0
    #: slots: requests answered together in each pass, the context cut among them
    parallel: int = 1
    #: the slots share one context (-kvu) rather than each keeping its share
    kv_unified: bool = False
    #: -np auto: where the model runs on a device (whose context is not shared), one slot instead
    parallel_auto: bool = False
    #: default max tokens per request; -1 means until the context is full
    n_predict: int = -1
    #: 0: physical cores
    threads: int = 0
    #: model name the API reports; default general.name, else the file's stem
    alias: str | None = None
    #: every name the model answers to (-a's list, sorted; `alias` is the first)
    aliases: list[str] = field(default_factory=list)
    #: informational tags, listed in /v1/models (--tags)
    tags: list[str] = field(default_factory=list)
    api_keys: list[str] = field(default_factory=list)
    #: the scope and limits of the keys whose key-file line gave some
    #: (`ember.server.keys.KeyRule`); any other key may do everything
    key_rules: dict = field(default_factory=dict)
    #: browsers' origins allowed to call the server ("*": any, without credentials; "localhost":
    #: any page of this machine, http(s) on localhost, 127.0.0.1 or [::1] at any port)
    cors_origins: list[str] = field(default_factory=list)
    chat_template_file: str | None = None
    metrics: bool = False
    slot_save_path: str | None = None
    #: requests waiting beyond the ones being served; past it, 503
    queue_depth: int = 64
    #: KV cache element type: "f16", "bf16", "f32" or "q8_0" (--cache-type-k/-v)
    kv_type: str = "f16"
    #: layers on the device (-ngl): None, a count, "all" or "auto" (see `ember.devices.request`)
    gpu_layers: str | None = None
    #: the device (--device): None, "none" or a name from --list-devices
    device: str | None = None
    #: MiB of host memory for conversations whose slot went to another; 0 off, -1 no limit
    cache_ram_mib: int = 0
    #: request body cap in bytes; None derives it from the context size
    body_limit: int | None = None
    #: serve /v1/embeddings and /embedding (llama-server's --embeddings)
    embeddings: bool = False
    #: /infill's order: suffix, prefix, middle (llama-server's --spm-infill)
    spm_infill: bool = False
    #: how /v1/embeddings and /embedding normalize a vector where the request does not say (llama-server's
    #: --embd-normalize: -1 none, 0 max-abs int16, 1 taxicab, 2 euclidean, p > 2 the p-norm)
    embd_normalize: int = 2
    #: how embeddings are pooled: "none", "mean", "cls" or "last"; None: the file's own
    pooling: str | None = None
    #: checkpoints of a hybrid's recurrent states per slot (llama-server's --ctx-checkpoints)
    ctx_checkpoints: int = 32
    #: a long prompt is checkpointed every this many positions (0: never)
    checkpoint_interval: int = 1024
    #: interval checkpoints keep at least this far from any other (--checkpoint-min-step)
    checkpoint_min_step: int = 0
    #: seconds a request may take to arrive (its body whole; its head within
    #: the lesser of this and 30), and an idle connection stays open
    timeout: int = 600
    #: connections open at once; past them a new one is answered 503
    max_connections: int = 256
    #: seconds the requests in flight get to finish once the server is told to stop
    shutdown_timeout: float = 5.0
    #: a chat template's text replacing the model's (--chat-template: a built-in name's or the text given)
    chat_template: str | None = None
    #: the system message of every chat that sends none (--system-prompt-file)
    system_prompt: str | None = None
    #: every request's sampling defaults: llama-server's, the file's general.sampling.*, the flags'
    sampling: SamplingParams = field(default_factory=SamplingParams)
    #: every chat's thinking defaults, where its request does not say
    reasoning: ReasoningDefaults = field(default_factory=ReasoningDefaults)
    #: tokens in one forward pass at most (-ub)
    max_batch: int = 512
    #: prompt tokens one slot reads in a pass at most (-b); the engine measures its chunk below it
    prompt_chunk: int = 512
    #: -b as given: /infill's budgets are shares of it, as llama-server's are of its logical batch
    n_batch: int = 2048
    #: share of a prompt a free slot must hold to be chosen for it over the least recently used (-sps)
    slot_similarity: float = 0.1
    #: serve GET /slots (--no-slots turns it off)
    slots_endpoint: bool = True
    #: serve the chat page at / (--no-webui turns it off)
    webui: bool = True
    #: a folder of the user's own files served at / instead of the page (--path)
    static_path: str | None = None
    #: the path every route is served under (--api-prefix "/api": /api/health, the page at /api/); "" for none
    api_prefix: str = ""
    #: responses the Responses API keeps (0: none), and MiB they may take
    responses_max: int = 1024
    responses_max_mib: int = 64
    #: a conversation ending in the assistant's words is continued from them (--no-prefill-assistant:
    #: it is a finished turn, and a new one opens)
    prefill_assistant: bool = True
    #: seconds a stream waits silent before an SSE comment keeps its connection (0 or less: never)
    sse_ping_interval: int = 30
    #: seconds without a request needing the model before it is let go, until the next (-1: never)
    sleep_idle_seconds: int = -1
    #: every reply carries llama-server's `__verbose` object unless the request says otherwise (-v)
    verbose: bool = False
    #: HTTPS: a PEM key and certificate chain
    ssl_key_file: str | None = None
    ssl_cert_file: str | None = None

    @property
    def hosts(self) -> list[str]:
        return [h for h in self.host.split(",") if h]
