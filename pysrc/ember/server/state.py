"""What every part of the server reads: the options it was started with,
the model and engine once loaded, the phase of the load, and the counters
behind /metrics."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from ember.server.errors import ApiError
from ember.server.options import ServerOptions

__all__ = ["Metrics", "ServerState", "unavailable"]


@dataclass
class Metrics:
    #: prompt tokens read, and those found in the cache instead (as llama-server counts them apart)
    prompt_tokens: int = 0
    prompt_tokens_cached: int = 0
    prompt_seconds: float = 0.0
    predicted_tokens: int = 0
    predicted_seconds: float = 0.0
    requests: int = 0
    #: requests refused before their route, by cause (key, scope, inflight,
    #: rate, host, origin)
    refusals: dict = field(default_factory=dict)


@dataclass
class ServerState:
    opts: ServerOptions
    log: Callable[[str], None]
    model: object = None
    engine: object = None
    phase: str = "loading"  # "loading" | "ready" | "failed"
    load_error: str | None = None
    template: str | None = None
    started: float = field(default_factory=time.time)
    metrics: Metrics = field(default_factory=Metrics)
    closing: bool = False
    #: the tool-call framing of each chat template in use, found once
    framings: dict = field(default_factory=dict)
    #: the model as Ollama's routes describe it (entry, file metadata), read once
    ollama_model: tuple | None = None
    #: each limited key's requests in flight and rate (`ember.server.keys.KeyLimits`)
    key_limits: object = None
    #: what the Responses API answered (`ember.server.response_store.ResponseStore`)
    responses: object = None
    #: streamed replies kept for their clients to read again (`ember.server.kept_streams.KeptStreams`)
    kept_streams: object = None
    #: chat completions under way, by id, for /v1/chat/completions/control: (owner, armed, generations)
    controls: dict = field(default_factory=dict)
    #: what the routes that describe the model read, from its last load (`ember.server.sleep.ModelFacts`)
    facts: object = None

    def __post_init__(self) -> None:
        from ember.server.keys import KeyLimits
        from ember.server.kept_streams import KeptStreams
        from ember.server.response_store import ResponseStore

        self.key_limits = KeyLimits(self.opts.key_rules)
        self.responses = ResponseStore(self.opts.responses_max, self.opts.responses_max_mib * 2**20)
        self.kept_streams = KeptStreams()

    def refused(self, cause: str) -> None:
        self.metrics.refusals[cause] = self.metrics.refusals.get(cause, 0) + 1

    def body_limit(self, path: str = "") -> int:
        if self.opts.body_limit is not None:
            return self.opts.body_limit
        # Room for a prompt that fills the context, at a generous 16 bytes a token, plus the envelope.
        n_ctx = self.facts.n_ctx if self.facts is not None else (self.opts.ctx_size or 8192)
        limit = 64 * 1024 + 16 * n_ctx
        if path in _EMBEDDING_PATHS:
            limit = max(limit, _EMBEDDING_BODY_LIMIT)  # many inputs a request, each within the context
        return limit

    @property
    def slot_ctx(self) -> int:
        """Positions one request may fill: the context cut among the slots."""
        if self.engine is not None:
            return self.engine.slot_ctx
        return self.model.n_ctx if self.model is not None else self.facts.slot_ctx

    @property
    def asleep(self) -> bool:
        """The model was loaded and let go while idle (--sleep-idle-seconds)."""
        return self.phase == "ready" and self.model is None

    def model_id(self) -> str:
        if self.opts.alias:
            return self.opts.alias
        if self.model is not None:
            return self.model.name
        if self.facts is not None:
            return self.facts.name
        return _stem(self.opts.model or "ember")


def _stem(path: str) -> str:
    from pathlib import Path

    return Path(path).stem


#: The routes whose body may carry many inputs, and their cap: OpenAI's
#: 2,048 inputs of a paragraph (4 KiB) each, whatever the context.
_EMBEDDING_PATHS = frozenset({"/v1/embeddings", "/embedding", "/embeddings", "/api/embed", "/api/embeddings"})
_EMBEDDING_BODY_LIMIT = 64 * 1024 + 2048 * 4096


def unavailable(state: ServerState) -> ApiError:
    if state.phase == "failed":
        return ApiError(503, f"the model failed to load: {state.load_error}")
    if state.closing:
        return ApiError(503, "the server is shutting down")
    return ApiError(503, "Loading model")
