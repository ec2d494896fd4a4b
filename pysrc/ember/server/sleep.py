"""Sleep when idle (llama-server's --sleep-idle-seconds): after that many
seconds with no request that needs the model and nothing generating, the
engine closes and the model is let go (its weights, every slot's cache and
the host prompt cache: the memory, or the card's, goes back), and the next
request that needs it loads it again before it is served.

Which requests need it is the safe way round (`wakes`): every route wakes
the model but those that only describe the server (`/health`, `/props`, the
model lists, `/metrics`, Ollama's `/api/tags`, `/api/ps`, `/api/version` and
`/`), which read what the last load recorded (`ModelFacts`) and say
`is_sleeping` where llama-server does, and those that read what the server
stored (responses, kept streams) or stop it.

Ollama's `keep_alive` on a request sets how long the model stays loaded after
it (0: let go at once; negative: for good), as Ollama's does; an Ollama
request without one goes back to the server's own idle time.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aiohttp import web

__all__ = ["ModelFacts", "Sleeper", "keep_alive_seconds", "lets_go", "wakes"]

#: The paths a GET (or HEAD) of is served while asleep without waking the model.
_READ_ASLEEP = frozenset({"/", "/health", "/v1/health", "/props", "/models", "/v1/models", "/metrics", "/api/tags",
                          "/api/ps", "/api/version", "/openapi.json", "/v1/stream"})
#: ...and the prefixes of such paths (one model by name, a stored response).
_READ_ASLEEP_UNDER = ("/v1/models/", "/models/", "/v1/responses/", "/responses/")
#: Other requests that need no model: the shutdown, and the kept streams' lookup and stop.
_OTHERS_ASLEEP = frozenset({("POST", "/shutdown"), ("POST", "/v1/streams/lookup"), ("DELETE", "/v1/stream")})


def wakes(method: str, path: str, body: bytes | None = None) -> bool:
    """Whether a request needs the model loaded (every route but those that
    only describe the server or read what it stored, and Ollama's way of
    letting a model go: an empty prompt or no messages with keep_alive 0,
    which `body`, when the route is Ollama's generate or chat, is looked at
    for)."""
    if method in ("GET", "HEAD"):
        return path not in _READ_ASLEEP and not path.startswith(_READ_ASLEEP_UNDER)
    if path in ("/api/generate", "/api/chat") and body is not None:
        import json

        try:
            said = json.loads(body)
            keep = keep_alive_seconds(said.get("keep_alive")) if isinstance(said, dict) else False
        except ValueError:
            return True  # the route answers what is wrong with it, awake
        return not (lets_go(keep) and not any(said.get(k) for k in ("prompt", "context", "suffix", "messages")))
    return (method, path) not in _OTHERS_ASLEEP


@dataclass(frozen=True)
class ModelFacts:
    """What the routes that describe the model read, recorded at each load,
    so that they answer the same while it sleeps."""

    path: str
    name: str
    n_vocab: int
    n_ctx: int
    n_ctx_train: int
    architecture: str
    chat_template: str
    bos: str
    eos: str
    device: dict
    slot_ctx: int
    n_slots: int
    eog_ids: tuple

    @classmethod
    def of(cls, model, engine) -> "ModelFacts":
        def piece(t):
            return model.token_to_piece(t, True).decode("utf-8", "replace") if t is not None else ""

        where = model.placement
        device = ({"name": "cpu", "note": model.device_note} if where is None
                  else {**where, "cache_bytes": engine.batcher.cache_bytes})
        return cls(path=str(model.path), name=model.name, n_vocab=model.n_vocab, n_ctx=model.n_ctx,
                   n_ctx_train=model._native.n_ctx_train, architecture=model.architecture,
                   chat_template=model.chat_template or "", bos=piece(model._native.bos_id),
                   eos=piece(model._native.eos_id), device=device, slot_ctx=engine.slot_ctx, n_slots=engine.n_slots,
                   eog_ids=tuple(model._native.eog_ids))


class Sleeper:
    """Counts the requests that need the model, lets it go once they and the
    engine have been idle for the idle time, and loads it again for the next."""

    def __init__(self, app: "web.Application", idle_seconds: float | None, *, load, publish) -> None:
        """`load(state)` loads the model and starts its engine; `publish(app,
        model, engine)` makes them the routes' (None, None: asleep)."""
        self.app = app
        self.state = app["state"]
        self._load, self._publish = load, publish
        #: seconds of idleness before sleeping; None: never (unless a keep_alive says)
        self.idle_seconds = self.default_idle = idle_seconds
        self.in_flight = 0
        self.last_active = time.monotonic()
        self._turn = asyncio.Lock()
        self._watch: asyncio.Task | None = None
        #: the engine's counters as it slept (what /metrics reports while asleep, and adds to the next one's)
        self.last_snapshot: dict | None = None

    def start(self) -> None:
        """Starts watching for idleness (once the model is in)."""
        if self._watch is None:
            self._watch = asyncio.get_running_loop().create_task(self._watching())

    def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()

    def keep_alive(self, seconds: float | None | bool) -> None:
        """Ollama's keep_alive: the model stays this long after the request
        (None: for good; False, a request that gave none: the server's own)."""
        self.idle_seconds = self.default_idle if seconds is False else seconds
        if self.idle_seconds is not None:
            self.start()

    @contextlib.asynccontextmanager
    async def awake(self):
        """Holds the model loaded for the request inside (waking it first)."""
        self.in_flight += 1
        try:
            if self.state.asleep or self._turn.locked():
                async with self._turn:
                    if self.state.asleep:
                        await self._wake()
            if self.state.model is None:
                from ember.server.state import unavailable

                raise unavailable(self.state)
            yield
        finally:
            self.in_flight -= 1
            self.last_active = time.monotonic()

    def snapshot(self, now: dict | None) -> dict:
        """What /metrics reads of the engine (`Engine.snapshot`), its counters
        carried across sleeps: asleep (`now` None), the one taken as it slept."""
        last = self.last_snapshot
        if now is None or last is None:
            return now if now is not None else last
        return {**now, "passes": last["passes"] + now["passes"],
                "slot_passes": last["slot_passes"] + now["slot_passes"],
                "tokens_max": max(last["tokens_max"], now["tokens_max"])}

    def goes_at(self) -> float:
        """The wall-clock time the model is let go at if nothing comes (with an idle time)."""
        return time.time() + max(0.0, (self.idle_seconds or 0.0) - max(0.0, self._idle_for()))

    def _idle_for(self) -> float:
        """Seconds since the model was last needed; -1 while it is (a job
        that outlives its request, a background response, counts too)."""
        engine = self.state.engine
        if self.in_flight or engine is None or engine.busy or engine.waiting():
            self.last_active = time.monotonic()
            return -1.0
        return time.monotonic() - self.last_active

    async def _watching(self) -> None:
        while True:
            await asyncio.sleep(0.1 if self.idle_seconds is None or self.idle_seconds < 2 else 0.5)
            if not self._due():
                continue
            async with self._turn:
                if not self._due():  # a request may have come, or changed the idle time, meanwhile
                    continue
                try:
                    await self._sleep(self.idle_seconds)
                except Exception as e:  # noqa: BLE001 - the watch goes on; the model stays as it was
                    self.state.log(f"ember: the model could not be let go: {type(e).__name__}: {e}")

    def _due(self) -> bool:
        idle = self.idle_seconds
        return idle is not None and not self.state.asleep and not self.state.closing and self._idle_for() >= idle

    async def _sleep(self, idle: float) -> None:
        state = self.state
        engine = state.engine
        snapshot = self.snapshot(await engine.call(engine.snapshot))
        if not self._due():
            return  # a request came while the engine was asked
        self.last_snapshot = snapshot
        self._publish(self.app, None, None)
        await asyncio.get_running_loop().run_in_executor(None, engine.close, 5.0)
        del engine
        state.log(f"ember: sleeping after {idle:g} s idle: the model and its caches are let go; the next request that "
                  "needs it loads it again")

    async def _wake(self) -> None:
        state = self.state
        t0 = time.monotonic()
        loading = asyncio.get_running_loop().run_in_executor(None, self._load, state)
        try:
            model, engine = await asyncio.shield(loading)
        except asyncio.CancelledError:
            # The server stops while the model loads: the engine the load starts is closed once it is in.
            loading.add_done_callback(lambda f: f.exception() is None and f.result()[1].close(0))
            raise
        except Exception as e:  # noqa: BLE001 - the file may have gone: the request is told, the server goes on
            from ember.server.errors import ApiError

            raise ApiError(503, f"the model could not be loaded again after sleeping: {e}") from None
        if state.closing:
            engine.close(0)
            return
        self._publish(self.app, model, engine)
        state.log(f"ember: awake: the model loaded again in {time.monotonic() - t0:.1f} s")


def lets_go(seconds: float | None | bool) -> bool:
    """Whether a keep_alive read by `keep_alive_seconds` lets the model go
    at once (0; not False, a request that said nothing, though False == 0)."""
    return isinstance(seconds, float) and seconds == 0


def keep_alive_seconds(value: Any) -> float | None | bool:
    """Ollama's keep_alive as seconds (None: for good), or False when unset.
    Raises ValueError naming what is wrong."""
    if value is None:
        return False
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as \"5m\" or seconds, got {str(value).lower()}")
    if isinstance(value, (int, float)):
        return None if value < 0 else float(value)
    if isinstance(value, str):
        import re

        text = value.strip()
        parts = re.fullmatch(r"(-)?((?:\d+(?:\.\d+)?(?:h|m|s|ms))+|\d+(?:\.\d+)?)", text)
        if parts is None:
            raise ValueError(f"expected a duration such as \"5m\", \"1h30m\" or seconds, got {value!r}")
        if parts.group(1):
            return None
        body = parts.group(2)
        if re.fullmatch(r"\d+(?:\.\d+)?", body):
            return float(body)
        scale = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3}
        return sum(float(n) * scale[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", body))
    raise ValueError(f"expected a duration such as \"5m\" or seconds, got {type(value).__name__}")
