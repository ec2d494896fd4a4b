"""One request's passage through the engine, as a route sees it: the
prompt's checks, the submission, the events with the client watched, and
the figures its reply and the log line give."""

from __future__ import annotations

import asyncio
import contextlib
import time

from aiohttp import web

from ember.model import Completion, Piece, PromptProgress
from ember.sampling import SamplingParams
from ember.server.errors import ApiError, exceed_context, from_engine_error
from ember.server.http import envelope_of, finite, sse_start
from ember.server.kept_streams import begin_kept, end_kept, kept_response
from ember.server.state import ServerState

__all__ = ["Choices", "ClientGone", "Generation"]


class ClientGone(Exception):
    """The peer closed the connection: the job was cancelled."""


class Generation:
    """One request's job in the engine, seen by its handler: prompt checks,
    submission, events with the client watched, and the stats the log line and
    /metrics read. Use as ``async with``: leaving early cancels the job."""

    def __init__(self, request: web.Request, prompt: list[int], max_tokens: int, params: SamplingParams,
                 slot: int | None = None, *, watch_client: bool = True, progress: bool = False,
                 context: tuple[str, int] | None = None):
        """`progress`: the events include `PromptProgress` while the prompt is read. `context`: the
        field and size of a context the request asks for (Ollama's `num_ctx`): below a slot's, the
        prompt must fit it and the reply ends where it is full; above, a slot's is what there is."""
        from ember.engine import GenerationRequest

        self.request = request
        self.state: ServerState = request.app["state"]
        model = self.state.model
        if not prompt:
            raise ApiError(400, "prompt: empty", param="prompt")
        n_ctx = self.state.slot_ctx
        if len(prompt) >= n_ctx:
            raise exceed_context(len(prompt), n_ctx)
        bad = next((t for t in prompt if not 0 <= t < model.n_vocab), None)
        if bad is not None:
            raise ApiError(400, f"prompt: token id {bad} is outside the vocabulary (0..{model.n_vocab - 1})", param="prompt")
        if context is not None and context[1] < n_ctx:
            field, asked = context
            if len(prompt) >= asked:
                raise ApiError(400, f"{field}: the prompt's {len(prompt)} tokens leave no room in the context of "
                               f"{asked} asked for", param=field)
            if not 0 <= max_tokens <= asked - len(prompt):
                max_tokens = asked - len(prompt)
        if max_tokens < 0:  # -1: until the context is full, which the engine reports as "context"
            max_tokens = n_ctx
        if params.next_turn is not None:
            # The chat layer's next turn, rendered: where its tokens leave
            # this prompt's is where the slot keeps a checkpoint.
            parting = _shared_prefix(prompt, model.chat_text_ids(params.next_turn))
            if parting > 0:
                params.checkpoint_hints.append(parting)
        self.prompt = prompt
        self.max_tokens = max_tokens
        self.params = params
        self.completion: Completion | None = None
        self.cancelled = False
        #: the engine ended the job with an error (the shutdown's, when `cut_by_shutdown`)
        self.failed = False
        self.cut_by_shutdown = False
        self.n_drawn = 0
        self.t0 = time.perf_counter()
        self._req = GenerationRequest(prompt, max_tokens, params, slot, owner=request.get("owner", 0),
                                      progress=progress)
        #: the latest prompt progress, and when the first token came (for the timings of a reply under way)
        self.progress: PromptProgress | None = None
        self._t_first: float | None = None
        self.job = None
        self._watch: asyncio.Task | None = None
        #: a background job outlives its request: its client is not watched
        self._watch_client = watch_client
        self._stream = None
        self._first = None

    async def __aenter__(self) -> "Generation":
        try:
            self.job = self.state.engine.submit(self._req)
        except Exception as e:
            raise from_engine_error(e)
        self.request["generation"] = self
        if self._watch_client:
            self._watch = asyncio.get_running_loop().create_task(self._watch_peer())
        return self

    async def __aexit__(self, et, ev, tb) -> None:
        if self._watch is not None:
            self._watch.cancel()
        if self.completion is None:
            # An engine error met inside the stream was answered there: the job
            # failed, its client did not leave.
            self.cancelled = not self.failed and (
                et is None or issubclass(et, (ClientGone, asyncio.CancelledError, ConnectionError)))
            self.job.cancel()
        else:
            m = self.state.metrics
            m.requests += 1
            m.prompt_tokens += self.completion.n_prompt - self.completion.n_cached
            m.prompt_tokens_cached += self.completion.n_cached
            m.prompt_seconds += self.completion.prompt_ms / 1e3
            m.predicted_tokens += len(self.completion.tokens)
            m.predicted_seconds += self.completion.gen_ms / 1e3
        if isinstance(ev, ClientGone):
            raise ConnectionResetError("client gone") from None

    async def _watch_peer(self) -> None:
        # aiohttp need not cancel a handler whose peer left; a queued job would then
        # wait for the model, so the connection is watched while nothing is written.
        # A kept stream (`ember.server.kept_streams`) outlives its client: only a stop ends it.
        while True:
            await asyncio.sleep(0.2)
            kept = self.request.get("kept_stream")
            if kept is not None:
                gone = kept.cancelled
            else:
                t = self.request.transport
                gone = t is None or t.is_closing()
            if gone:
                self.job.abandon(ClientGone())
                return

    async def stream(self, request: web.Request, write) -> web.StreamResponse:
        """The job's reply as server-sent events, as every streaming route
        sends one: the first event awaited before the headers (a request the
        engine refuses is still answered with its status), the stream
        started, the route's `write(resp)` sending its items, an error met
        on the way sent as the stream's next item (in its API's envelope),
        then the end."""

        @contextlib.asynccontextmanager
        async def begun():
            async with self:
                await self.first_event()
                yield

        return await _sse_reply(request, begun(), write)

    async def whole(self) -> Completion:
        """Runs the job to its end and returns its completion, for a reply
        answered whole (its pieces are in the completion's text)."""
        async with self:
            async for _ in self.events():
                pass
        return self.completion

    async def first_event(self) -> None:
        """Waits for the job's first event (it comes once the prompt is read):
        a stream starts only after, so a request the engine refuses is still
        answered with a status and its error envelope, not a stream event.
        But a stream kept waiting past its ping interval (a long prompt, a
        queue) starts then, with an SSE comment every interval, as
        llama-server's pings keep a client's connection; what goes wrong
        after that travels in the stream."""
        self._stream = self._events()
        interval = self.params.sse_ping_interval
        if interval is None:
            interval = self.state.opts.sse_ping_interval
        if not self.request.get("sse_pending") or interval <= 0:
            self._first = await anext(self._stream)
            return
        first = asyncio.ensure_future(anext(self._stream))
        try:
            while not (await asyncio.wait({first}, timeout=interval))[0]:
                resp = self.request.get("sse") or await sse_start(self.request, kept_response(self.request))
                await resp.write(b": ping\n\n")
        except BaseException:
            first.cancel()
            raise
        self._first = first.result()

    async def events(self):
        """The job's pieces and completion; engine errors raised as ApiErrors."""
        stream = self._stream or self._events()
        if self._first is not None:
            first, self._first = self._first, None
            yield first
        async for ev in stream:
            yield ev

    async def _events(self):
        try:
            async for ev in self.job.events():
                if isinstance(ev, Completion):
                    self.completion = ev
                elif isinstance(ev, PromptProgress):
                    self.progress = ev
                elif ev.token is not None:
                    self.n_drawn += 1
                    if self._t_first is None:
                        self._t_first = time.perf_counter()
                yield ev
        except ClientGone:
            raise
        except Exception as e:
            from ember.engine import EngineStopped

            self.failed, self.cut_by_shutdown = True, isinstance(e, EngineStopped)
            raise from_engine_error(e, n_prompt=len(self.prompt), n_ctx=self.state.slot_ctx)

    @property
    def n_cached(self) -> int:
        if self.completion is not None:
            return self.completion.n_cached
        return (self.job.n_cached if self.job is not None else None) or 0

    def timings(self) -> dict:
        # As llama-server: prompt_n counts the prompt tokens read, cache_n those reused.
        c = self.completion
        if c is not None:
            n_p, n_g, p_ms, g_ms = len(self.prompt) - c.n_cached, len(c.tokens), c.prompt_ms, c.gen_ms
        elif self._t_first is not None:  # under way: as the loop saw it (the finished reply's are the engine's)
            n_p, n_g = len(self.prompt) - self.n_cached, self.n_drawn
            p_ms, g_ms = (self._t_first - self.t0) * 1e3, (time.perf_counter() - self._t_first) * 1e3
        else:  # the prompt being read
            pr = self.progress
            n_p, n_g, p_ms, g_ms = (pr.processed - pr.cache, 0, pr.time_ms, 0.0) if pr else (0, 0, 0.0, 0.0)
        # The first token is drawn from the prompt's last pass, so the rate is over the steps after it.
        steps = n_g - 1
        return {
            "cache_n": self.n_cached,
            "prompt_n": n_p,
            "prompt_ms": p_ms,
            "prompt_per_token_ms": p_ms / n_p if n_p else 0.0,
            "prompt_per_second": n_p * 1e3 / p_ms if p_ms > 0 else 0.0,
            "predicted_n": n_g,
            "predicted_ms": g_ms,
            "predicted_per_token_ms": g_ms / steps if steps > 0 else 0.0,
            "predicted_per_second": steps * 1e3 / g_ms if steps > 0 and g_ms > 0 else 0.0,
        }


class _SideBySide:
    """Several generations answered side by side, entered together (each
    subclass's `__aenter__` says how) and left together."""

    gens: list[Generation]

    def __init__(self) -> None:
        self._stack = contextlib.AsyncExitStack()

    async def _enter(self, body) -> None:
        """Runs `body()` (entering the generations) inside the stack, which
        unwinds whatever was entered when it fails."""
        await self._stack.__aenter__()
        try:
            await body()
        except BaseException as e:
            if not await self._stack.__aexit__(type(e), e, e.__traceback__):
                raise

    async def __aexit__(self, et, ev, tb):
        return await self._stack.__aexit__(et, ev, tb)

    async def events(self):
        """(index, event) of every generation, as they come."""
        async for pair in interleaved(self.gens):
            yield pair

    async def stream(self, request: web.Request, write) -> web.StreamResponse:
        """The reply as server-sent events (see `Generation.stream`; on entry
        the first events have come)."""
        return await _sse_reply(request, self, write)


def piece_logprobs(model, p: Piece, k: int) -> dict:
    """A drawn token's log-probability and its `k` likeliest rivals', in the
    shape OpenAI's chat completions and Ollama's replies share."""

    def entry(token: int, logprob: float | None) -> dict:
        raw = model.token_to_piece(token)
        return {"token": raw.decode("utf-8", "replace"), "logprob": finite(logprob), "bytes": list(raw)}

    return {**entry(p.token, p.logprob), "top_logprobs": [entry(t, lp) for t, lp in (p.top or [])[:k]]}


def chosen_slot(request: web.Request, id_slot: int, generations: int) -> int | None:
    """llama-server's `id_slot`: the slot a request asked for (None: the
    server's choice, -1), checked against the slots there are, the caller's
    scope (choosing a slot is an admin's) and the request's generations
    (a slot holds one)."""
    if id_slot == -1:
        return None
    if id_slot >= 0 and "admin" not in request.get("scopes", ("admin",)):
        raise ApiError(403, "id_slot: choosing a slot needs the admin scope", param="id_slot",
                       type="permission_error")
    n_slots = request.app["state"].engine.n_slots
    if not 0 <= id_slot < n_slots:
        raise ApiError(400, f"id_slot: no slot {id_slot} (there are {n_slots}; -1 lets the server choose)",
                       param="id_slot")
    if generations > 1:
        raise ApiError(400, f"id_slot: names one slot, and the request asks for {generations} generations",
                       param="id_slot")
    return id_slot


class Choices(_SideBySide):
    """OpenAI's `n`: answers to one prompt, each its own generation with its
    own seed (the request's plus its index, or a fresh one). The first reads
    the prompt; each other starts in a copy of its slot (`Batcher.fork`), so
    the prompt is read once. They are answered side by side, so `n` may not
    exceed the slots; past the free ones, they wait as any request waits.
    Use as ``async with``: on entry the prompt has been read."""

    def __init__(self, request: web.Request, prompt: list[int], max_tokens: int, params: SamplingParams, n: int,
                 *, progress: bool = False, slot: int | None = None):
        slots = request.app["state"].facts.n_slots
        if n > slots:
            raise ApiError(400, f"n: {n} choices are answered side by side, a slot each; this server has {slots} "
                           "(-np)", param="n")
        self.request, self.prompt, self.max_tokens = request, prompt, max_tokens
        self.params = []
        for i in range(n):
            p = params.copy()
            p.seed = None if params.seed is None else (params.seed + i) % 2**64
            self.params.append(p)
        if n > 1:
            # A hybrid's copies resume from its recurrent state where the prompt's last token begins.
            self.params[0].checkpoint_hints.append(len(prompt) - 1)
        # Progress is reported for one choice only: the others are forked once the prompt is read.
        self.gens = [Generation(request, prompt, max_tokens, self.params[0], slot, progress=progress and n == 1)]
        super().__init__()

    @property
    def n(self) -> int:
        return len(self.params)

    async def __aenter__(self) -> "Choices":
        async def body():
            first = await self._stack.enter_async_context(self.gens[0])
            await first.first_event()
            if self.n > 1:
                await _fork_from(first, self.n - 1)
            for p in self.params[1:]:
                g = Generation(self.request, self.prompt, self.max_tokens, p)
                await self._stack.enter_async_context(g)
                self.gens.append(g)

        await self._enter(body)
        return self


class Prompts(_SideBySide):
    """llama-server's /completion of several prompts: a generation each, side
    by side (past the free slots they wait as any request waits). Use as
    ``async with``: on entry every one's first event has come, so a prompt
    the engine refuses is answered with its status before any stream."""

    def __init__(self, gens: list[Generation]):
        self.gens = gens
        super().__init__()

    async def __aenter__(self) -> "Prompts":
        async def body():
            for g in self.gens:
                await self._stack.enter_async_context(g)
            for g in self.gens:
                await g.first_event()

        await self._enter(body)
        return self


async def interleaved(gens: list[Generation]):
    """(index, event) of several generations, in the order they come."""
    if len(gens) == 1:
        async for ev in gens[0].events():
            yield 0, ev
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, g: Generation) -> None:
        try:
            async for ev in g.events():
                queue.put_nowait((i, ev, None))
        except Exception as e:  # handed to the reader, which raises it in the route
            queue.put_nowait((i, None, e))
            return
        queue.put_nowait((i, None, None))

    tasks = [asyncio.get_running_loop().create_task(pump(i, g)) for i, g in enumerate(gens)]
    try:
        left = len(gens)
        while left:
            i, ev, err = await queue.get()
            if err is not None:
                raise err
            if ev is None:
                left -= 1
            else:
                yield i, ev
    finally:
        for t in tasks:
            t.cancel()


async def _sse_reply(request: web.Request, begun, write) -> web.StreamResponse:
    """Within `begun` (the jobs entered and the first event come), the
    stream started, `write(resp)` sending the route's items, an error met on
    the way sent as the stream's next item in its API's envelope; then the end.
    Kept for its client to read again when the request asked for it."""
    begin_kept(request)
    request["sse_pending"] = True  # a long wait for the first event starts the stream, to ping it
    try:
        try:
            async with begun:
                resp = request.get("sse") or await sse_start(request, kept_response(request))
                try:
                    await write(resp)
                except ApiError as e:
                    await envelope_of(request).in_stream(resp, e)
        except ApiError as e:
            resp = request.get("sse")
            if resp is None:
                raise  # the stream had not started: the error is the reply
            await envelope_of(request).in_stream(resp, e)  # it had, to ping: the error ends it
        await resp.write_eof()
        return resp
    finally:
        end_kept(request)


async def _fork_from(first: Generation, count: int) -> None:
    """Copies the slot that read the prompt into up to `count` free slots
    (empty ones first), where the engine then places the other choices: a
    slot holding the whole prompt is its first pick. With fewer free, the
    rest wait and read the prompt themselves."""
    engine = first.state.engine
    batcher = engine.batcher

    def fork() -> None:
        src = first.job.slot
        if src is None:
            return
        free = [s for s in range(engine.n_slots) if s != src and not batcher.is_busy(s)]
        free.sort(key=lambda s: batcher.cached_tokens(s) > 0)
        for s in free[:count]:
            batcher.fork(src, s)

    await engine.call(fork)


def _shared_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
