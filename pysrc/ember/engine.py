"""The engine thread: the one owner of the model in a server.

HTTP handlers never run the model. They submit a `GenerationRequest` and read
its events (`Piece`s, then the `Completion`) from an asyncio queue that the
engine thread fills through `loop.call_soon_threadsafe`, which wakes the event
loop through its own self-pipe: no thread per request, no polling.

The engine holds a fixed set of slots (`_native.Batcher`). Each turn of its
loop places waiting requests in free slots, in arrival order, then runs one
pass over every busy slot: a slot reading its prompt contributes a chunk of
it, a decoding slot its next token, so N conversations share one read of the
weights. A request whose client went away is dropped before it reaches a
slot, or stopped within one pass once it has.
"""

from __future__ import annotations

import asyncio
import os
import queue
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import AsyncIterator, Sequence

from ember.errors import EmberError
from ember import _native
from ember.model import Completion, CompletionBuilder, Model, Piece, PromptProgress
from ember.sampling import SamplingParams

__all__ = ["Checkpoints", "Engine", "GenerationRequest", "Job", "EngineOverloaded", "EngineStopped"]


class EngineOverloaded(EmberError):
    """The queue of waiting requests is full."""


class EngineStopped(EmberError):
    """The engine is shutting down and takes no more work."""


@dataclass
class GenerationRequest:
    """A generation the engine is asked for: prompt token ids, a length limit
    and the options it runs under."""

    prompt: list[int]
    max_tokens: int
    params: SamplingParams = field(default_factory=SamplingParams)
    #: the slot the client asked for (llama-server's id_slot), or None for the engine's choice
    slot: int | None = None
    #: whose prompt it is: a slot's cache is reused only for its owner's (0: everyone's)
    owner: int = 0
    #: send `PromptProgress` events while the prompt is read (llama-server's return_progress)
    progress: bool = False


class Job:
    """One request's passage through the engine, seen from the event loop."""

    def __init__(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop):
        self.request = request
        self._loop = loop
        self._events: asyncio.Queue = asyncio.Queue()
        self._cancelled = threading.Event()
        self.started = asyncio.Event()
        #: the slot that answers it, once placed; whether it waited for one
        self.slot: int | None = None
        self.waited = False
        #: prompt tokens the slot already held, once placed
        self.n_cached: int | None = None
        #: how the prompt met what the slot held (for the log line)
        self.resume: str | None = None
        #: prompt tokens read or found in the cache so far (engine side, for `PromptProgress`)
        self.read = 0

    def cancel(self) -> None:
        """Stops the job: before it starts, it never reaches the model; after,
        the engine ends it before the next token."""
        self._cancelled.set()

    def abandon(self, exc: BaseException) -> None:
        """Cancels the job and wakes its reader with ``exc`` (loop side only): a
        reader whose client went away must not wait on a job the engine will skip."""
        self._cancelled.set()
        self._events.put_nowait(exc)

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    # Engine side.
    def _deliver(self, event) -> None:
        try:
            self._loop.call_soon_threadsafe(self._events.put_nowait, event)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self._cancelled.set()

    def _mark_started(self) -> None:
        try:
            self._loop.call_soon_threadsafe(self.started.set)
        except RuntimeError:
            self._cancelled.set()

    # Loop side.
    async def events(self) -> AsyncIterator[Piece | Completion]:
        """The job's pieces, then its completion; an engine error is raised here."""
        while True:
            ev = await self._events.get()
            if isinstance(ev, BaseException):
                raise ev
            yield ev
            if isinstance(ev, Completion):
                return

    async def result(self) -> Completion:
        done = None
        async for ev in self.events():
            done = ev
        assert isinstance(done, Completion)
        return done


@dataclass(frozen=True)
class Checkpoints:
    """How a hybrid model's slots checkpoint their recurrent states
    (llama-server's --ctx-checkpoints and --checkpoint-min-step,
    --ctx-checkpoints-interval as ik_llama.cpp spells it)."""

    #: at most this many per slot (0: none)
    count: int = 32
    #: a long prompt is checkpointed every this many positions (0: never)
    interval: int = 1024
    #: interval checkpoints keep at least this far from any other
    min_step: int = 0
    #: the free host memory (0: unknown); they take half of it at most
    free_bytes: int = 0

    def reserved(self, each: int, slots: int) -> int:
        return self.count * each * slots

    def granted(self, each: int, slots: int, host_budget: int) -> tuple["Checkpoints", str | None]:
        """The count that fits, and why it is fewer than asked (None when
        not): every slot's checkpoints come out of the host prompt cache's
        budget, and out of half the free memory at most."""
        if self.count == 0:
            return self, None
        limits = []
        if 0 < host_budget < 2**60:
            limits.append((host_budget, f"the host prompt cache's {host_budget / 2**20:.0f} MiB"))
        if self.free_bytes:
            limits.append((self.free_bytes // 2, f"half the free memory ({self.free_bytes / 2**20:.0f} MiB)"))
        if not limits:
            return self, None
        limit, where = min(limits)
        fits = limit // (each * slots)
        if fits >= self.count:
            return self, None
        why = (f"{self.count} per slot would take {self.reserved(each, slots) / 2**20:.1f} MiB, "
               f"more than {where}")
        return Checkpoints(int(fits), self.interval, self.min_step, self.free_bytes), why


_STOP = object()


class _Task:
    """Work the engine thread runs between passes, for a caller on an event loop."""

    def __init__(self, fn, args: tuple, loop: asyncio.AbstractEventLoop):
        self.fn, self.args, self._loop = fn, args, loop
        self.future: asyncio.Future = loop.create_future()

    def run(self) -> None:
        try:
            result = self.fn(*self.args)
        except Exception as e:  # the caller's to handle, as a call of its own would be
            self._deliver(e)
            return
        self._settle(lambda: self.future.set_result(result))

    def _deliver(self, exc: BaseException) -> None:
        self._settle(lambda: self.future.set_exception(exc))

    def _settle(self, how) -> None:
        def settle():
            if not self.future.done():
                how()
        try:
            self._loop.call_soon_threadsafe(settle)
        except RuntimeError:  # the loop is closed: nobody is waiting
            pass

#: How long one pass may take while it reads a prompt chunk beside other
#: conversations' tokens: their next token waits that long at most.
CHUNK_TARGET_S = 0.15

#: How long an idle engine waits for more requests to join the first pass.
JOIN_WAIT_S = 0.002


def measure_chunk(model: Model, target_s: float = CHUNK_TARGET_S) -> int:
    """Prompt tokens per slot per pass: the largest power of two (16 at
    least, the model's pass size at most) whose pass, measured here on this
    machine, takes about ``target_s``."""
    ids = [(1 + i * 7919) % model.n_vocab for i in range(min(64, model.max_batch))]
    # Warms the caches and the pool; where even 16 tokens take the whole
    # target (a slow device), that is the chunk, with no longer pass timed.
    if model._native.bench_prompt(ids[:16]) >= target_s:
        return 16
    n = len(ids)
    secs = min(model._native.bench_prompt(ids) for _ in range(2))
    rate = n / secs if secs > 0 else float(model.max_batch) / target_s
    chunk = 16
    while chunk * 2 <= model.max_batch and chunk * 2 <= rate * target_s:
        chunk *= 2
    return chunk


class Engine:
    def __init__(self, model: Model, *, queue_depth: int = 64, slots: int = 1, chunk: int | None = None,
                 host_cache_bytes: int = 0, checkpoints: Checkpoints | None = None, slot_similarity: float = 0.1,
                 unified: bool = False):
        """`unified`: the slots share the model's context, each holding up to
        all of it while together they hold no more (llama-server's
        `--kv-unified`); else each keeps its share."""
        self.model = model
        self.queue_depth = queue_depth
        self.n_slots = max(1, slots)
        self.unified = unified
        #: positions each slot holds at most: the context is cut (or shared), not multiplied
        self.slot_ctx = model.n_ctx if unified else max(1, model.n_ctx // self.n_slots)
        self.chunk = min(chunk or model.max_batch, model.max_batch)
        # The slots' caches are laid out for the model's pass size, not the
        # measured chunk, so a slot saved here restores in a server that
        # measured another.
        self.batcher = _native.Batcher(model._native, self.n_slots, self.slot_ctx, model.max_batch, unified)
        self.batcher.set_chunk(self.chunk)
        self.batcher.set_slot_similarity(slot_similarity)
        #: bytes of one checkpoint of a slot's recurrent states (0: the model has none)
        self.checkpoint_bytes = self.batcher.checkpoint_bytes
        #: what the slots' checkpoints were granted, and why fewer than asked (None: as asked)
        self.checkpoints, self.checkpoints_cut = Checkpoints(count=0), None
        host_cache_bytes = max(0, host_cache_bytes)
        if checkpoints is not None and self.checkpoint_bytes:
            self.checkpoints, self.checkpoints_cut = checkpoints.granted(
                self.checkpoint_bytes, self.n_slots, host_cache_bytes)
            host_cache_bytes -= self.checkpoints.reserved(self.checkpoint_bytes, self.n_slots)
            c = self.checkpoints
            self.batcher.set_checkpoints(c.count, c.interval, c.min_step)
        self.batcher.set_host_cache(max(0, host_cache_bytes))
        #: what was submitted: jobs and tasks, in arrival order
        self._jobs: queue.Queue = queue.Queue()
        #: jobs taken from the queue, waiting for a slot (engine thread only)
        self._line: deque[Job] = deque()
        # Not a daemon: the interpreter must not finalize while this thread is
        # inside the model (a daemon thread re-entering a finalizing
        # interpreter is killed by a forced unwind, which aborts the process).
        # It ends by itself once the main thread is gone.
        self._thread = threading.Thread(target=self._run, name="ember-engine", daemon=False)
        self._closing = False
        self._active: dict[int, tuple[Job, CompletionBuilder]] = {}
        #: jobs whose asked-for slot was busy, in arrival order (engine thread only)
        self._deferred: list[Job] = []
        self.busy = False
        self.n_processed = 0
        #: positions the busy slots hold in their KV caches
        self.kv_tokens = 0
        #: forward passes run, the slots they served added up, and the most tokens one pass read (/metrics)
        self.n_passes = 0
        self.n_slot_passes = 0
        self.n_tokens_max = 0
        self._debug = os.environ.get("EMBER_DEBUG_BATCHES") == "1"

    def start(self) -> None:
        self._thread.start()

    def waiting(self) -> int:
        return self._jobs.qsize() + len(self._line) + len(self._deferred)

    @property
    def n_busy(self) -> int:
        """Slots answering a request."""
        return len(self._active)

    def submit(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop | None = None) -> Job:
        if self._closing:
            raise EngineStopped("the server is shutting down")
        # Free slots take requests at once (the engine thread may not have
        # picked them up yet): only what is left over counts against the depth.
        free = self.n_slots - len(self._active)
        waiting = self.waiting()
        if waiting >= self.queue_depth + max(free, 0):
            raise EngineOverloaded(f"{waiting} requests are already waiting (queue depth {self.queue_depth})")
        job = Job(request, loop or asyncio.get_running_loop())
        job.waited = len(self._active) >= self.n_slots or waiting > 0 or request.slot in self._active
        self._jobs.put(job)
        return job

    async def call(self, fn, *args):
        """Runs ``fn(*args)`` on the engine thread between two passes and
        returns what it returns (or raises what it raises): the engine is the
        model's one owner, so embeddings, slot files and snapshots of its
        state go through it as tasks, as llama-server's do."""
        if self._closing:
            raise EngineStopped("the server is shutting down")
        task = _Task(fn, args, asyncio.get_running_loop())
        self._jobs.put(task)
        return await task.future

    def end_thought(self, job: Job) -> bool:
        """(Engine thread: run it through `call`.) Ends `job`'s thought at its
        next draw, where it still runs in its slot with a thought budget."""
        slot = job.slot
        held = self._active.get(slot) if slot is not None else None
        return held is not None and held[0] is job and self.batcher.end_thought(slot)

    def snapshot(self) -> dict:
        """What /metrics and /slots read, taken on the engine thread (through `call`)."""
        b = self.batcher
        return {"busy": self.n_busy, "waiting": self.waiting(), "kv_tokens": self.kv_tokens,
                "passes": self.n_passes, "slot_passes": self.n_slot_passes, "tokens_max": self.n_tokens_max,
                "slots": [{"busy": b.is_busy(i), "cached": b.cached_tokens(i), "checkpoints": b.checkpoints(i)}
                          for i in range(self.n_slots)]}

    def close(self, timeout: float | None = None) -> None:
        """Takes no more work; the requests in progress end after the pass
        under way, and they and the waiting ones are told why (their readers
        get EngineStopped, to end their replies in their own shape)."""
        self._closing = True
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if isinstance(job, Job):
                job.cancel()
            if job is not _STOP:
                job._deliver(EngineStopped("the server is shutting down"))
        self._jobs.put(_STOP)
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _take(self, timeout: float) -> bool:
        """Takes what was submitted, waiting up to ``timeout`` for the first:
        tasks run at once, jobs join the line. False once told to stop."""
        while True:
            try:
                item = self._jobs.get(timeout=timeout) if timeout > 0 else self._jobs.get_nowait()
            except queue.Empty:
                return True
            timeout = 0.0
            if item is _STOP:
                return False
            if isinstance(item, _Task):
                item.run()
            else:
                self._line.append(item)

    def _admit(self) -> bool:
        """Places waiting requests in free slots; False once told to stop."""
        idle = not self._active and not self._line and not self._deferred
        if not self._take(0.25 if idle else 0.0):
            return False
        if idle and self._line and not self._take(JOIN_WAIT_S):
            # Requests sent together arrive a little apart: the first pass
            # waits a moment for the others to join it.
            return False
        # A job that asked for a busy slot takes it as soon as it frees, before
        # newer jobs; it holds back none of the jobs behind it meanwhile.
        for job in list(self._deferred):
            if job.cancelled or job.request.slot not in self._active:
                self._deferred.remove(job)
                self._place(job, job.request.slot)
        while len(self._active) < self.n_slots and self._line:
            job = self._line.popleft()
            if job.cancelled:
                continue
            want = job.request.slot
            if want is not None and want in self._active:
                self._deferred.append(job)
                continue
            self._place(job, want if want is not None else self.batcher.choose_slot(job.request.prompt,
                                                                                  job.request.owner))
        return bool(self._active or self._line or self._deferred) or threading.main_thread().is_alive()

    def _place(self, job: Job, slot: int) -> None:
        """Starts `job` in free slot `slot` (a cancelled job is only counted)."""
        if job.cancelled:
            self.n_processed += 1
            return
        req = job.request
        try:
            build = self.model.start_in(self.batcher, slot, req.prompt, req.max_tokens, req.params, req.owner)
        except Exception as e:  # a refused request (too long, bad option) reaches its client
            job._deliver(e)
            self.n_processed += 1
            return
        job.slot, job.n_cached, job.resume = slot, build.done.n_cached, build.resume
        self._active[slot] = (job, build)
        job._mark_started()
        if req.progress:
            job.read = build.done.n_cached
            job._deliver(PromptProgress(len(req.prompt), job.read, job.read, 0.0))

    def _run(self) -> None:
        try:
            while self._admit():
                for slot, (job, _) in list(self._active.items()):
                    if job.cancelled:
                        self.batcher.cancel(slot)
                        del self._active[slot]
                        self.n_processed += 1
                self.busy = bool(self._active)
                if not self._active:
                    self.kv_tokens = 0
                    continue
                t0 = time.perf_counter()
                events = self.batcher.step()
                served = self.batcher.last_pass()
                self.n_passes += 1
                self.n_slot_passes += len(served)
                self.n_tokens_max = max(self.n_tokens_max, sum(n for _, n, _ in served))
                for slot, n, reading in served:
                    job, build = self._active.get(slot, (None, None))
                    if reading and job is not None and job.request.progress:
                        job.read += n
                        job._deliver(PromptProgress(len(job.request.prompt), build.done.n_cached, job.read,
                                                    (time.perf_counter() - build.t_start) * 1e3))
                if self._debug:
                    parts = ", ".join(f"slot {s} {'prompt' if p else 'decode'} {n}" for s, n, p in served)
                    print(f"ember: pass [{parts}] in {(time.perf_counter() - t0) * 1e3:.1f} ms, {len(events)} drew",
                          file=sys.stderr, flush=True)
                # Bookkeeping first, deliveries after: a client that reads its
                # last event must find its slot already free in /metrics.
                deliveries: list[tuple[Job, object]] = []
                for ev in events:
                    slot = ev.slot
                    if slot not in self._active:
                        # A run of tokens a grammar forced goes on past where a stop
                        # string or a line rule ended its completion: the rest is dropped.
                        continue
                    job, build = self._active[slot]
                    try:
                        if ev.error is not None:
                            out, finished = [ev.error], True
                        elif ev.token is None:
                            out, finished = build.finish(), True
                        else:
                            out, finished = build.draw(ev.token, ev.text, ev.stop, ev.logprob, ev.top)
                    except Exception as e:  # a bug must reach the client as a 500, not hang it
                        out, finished = [e], True
                    deliveries += [(job, ev) for ev in out]
                    if finished:
                        if self.batcher.is_busy(slot):  # ended by a stop string
                            self.batcher.cancel(slot)
                        del self._active[slot]
                        self.n_processed += 1
                self.kv_tokens = sum(self.batcher.cached_tokens(s) for s in self._active)
                self.busy = bool(self._active)
                _deliver_pass(deliveries)
        finally:
            for job in [j for j, _ in self._active.values()] + self._deferred + list(self._line):
                job._deliver(EngineStopped("the server is shutting down"))
            self._active.clear()
            self._deferred.clear()
            self._line.clear()
            while True:
                try:
                    item = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if isinstance(item, (Job, _Task)):
                    item._deliver(EngineStopped("the server is shutting down"))
            self.busy = False
            self.kv_tokens = 0


def _deliver_pass(deliveries: list[tuple[Job, object]]) -> None:
    """A pass's events to their readers, with one wake-up per event loop (one
    per pass in a server) instead of one per event: each wake-up is a write
    to the loop's self-pipe and a turn of the loop, taken from the cores the
    next pass runs on."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Job, object]]] = {}
    for job, ev in deliveries:
        by_loop.setdefault(job._loop, []).append((job, ev))
    for loop, items in by_loop.items():
        try:
            loop.call_soon_threadsafe(_put_events, items)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            for job, _ in items:
                job._cancelled.set()


def _put_events(items: list[tuple[Job, object]]) -> None:
    for job, ev in items:
        job._events.put_nowait(ev)


def stop_list(stop: str | Sequence[str] | None) -> list[str]:
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else list(stop)
