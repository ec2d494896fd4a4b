"""The engine thread: the one owner of the model in a server.

HTTP handlers never run the model. They submit a `GenerationRequest` and read
its events (`Piece`s, then the `Completion`) from an asyncio queue that the
engine thread fills through `loop.call_soon_threadsafe`, which wakes the event
loop through its own self-pipe: no thread per request, no polling. Requests
run one at a time in arrival order (slots and batching come later); a request
whose client went away is dropped before it reaches the model, or stopped
within one token once it has.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from dataclasses import dataclass, field
from typing import AsyncIterator, Sequence

from ember.errors import EmberError
from ember.model import Completion, Model, Piece

__all__ = ["Engine", "GenerationRequest", "Job", "EngineOverloaded", "EngineStopped"]


class EngineOverloaded(EmberError):
    """The queue of waiting requests is full."""


class EngineStopped(EmberError):
    """The engine is shutting down and takes no more work."""


@dataclass
class GenerationRequest:
    """What `Model.stream_completion` takes: prompt token ids and its keywords."""

    prompt: list[int]
    max_tokens: int
    options: dict = field(default_factory=dict)


class Job:
    """One request's passage through the engine, seen from the event loop."""

    def __init__(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop):
        self.request = request
        self._loop = loop
        self._events: asyncio.Queue = asyncio.Queue()
        self._cancelled = threading.Event()
        self.started = asyncio.Event()

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


_STOP = object()


class Engine:
    def __init__(self, model: Model, *, queue_depth: int = 64):
        self.model = model
        self.queue_depth = queue_depth
        self._jobs: queue.Queue = queue.Queue()
        # Not a daemon: the interpreter must not finalize while this thread is
        # inside the model (a daemon thread re-entering a finalizing
        # interpreter is killed by a forced unwind, which aborts the process).
        # It ends by itself once the main thread is gone.
        self._thread = threading.Thread(target=self._run, name="ember-engine", daemon=False)
        self._closing = False
        self.busy = False
        self.n_processed = 0
        #: positions the running request holds in its KV cache (0 when idle)
        self.kv_tokens = 0

    def start(self) -> None:
        self._thread.start()

    def waiting(self) -> int:
        return self._jobs.qsize()

    def submit(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop | None = None) -> Job:
        if self._closing:
            raise EngineStopped("the server is shutting down")
        if self._jobs.qsize() >= self.queue_depth:
            raise EngineOverloaded(f"{self._jobs.qsize()} requests are already waiting (queue depth {self.queue_depth})")
        job = Job(request, loop or asyncio.get_running_loop())
        self._jobs.put(job)
        return job

    def close(self, timeout: float | None = None) -> None:
        """Takes no more work; the request in progress ends before its next
        token, the waiting ones are cancelled."""
        self._closing = True
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not _STOP:
                job.cancel()
                job._deliver(EngineStopped("the server is shutting down"))
        self._current_cancel()
        self._jobs.put(_STOP)
        if self._thread.is_alive():
            self._thread.join(timeout)

    _current: Job | None = None

    def _current_cancel(self) -> None:
        job = self._current
        if job is not None:
            job.cancel()

    def _run(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=0.25)
            except queue.Empty:
                if not threading.main_thread().is_alive():
                    return
                continue
            if job is _STOP:
                return
            if job.cancelled:
                continue
            self._current = job
            self.busy = True
            job._mark_started()
            try:
                req = job.request
                self.kv_tokens = len(req.prompt)
                for ev in self.model.stream_completion(req.prompt, req.max_tokens, **req.options):
                    if job.cancelled and isinstance(ev, Piece):
                        break
                    if isinstance(ev, Piece) and ev.token is not None:
                        self.kv_tokens += 1
                    job._deliver(ev)
            except EmberError as e:
                job._deliver(e)
            except Exception as e:  # a bug must reach the client as a 500, not hang it
                job._deliver(e)
            finally:
                self._current = None
                self.busy = False
                self.kv_tokens = 0
                self.n_processed += 1


def stop_list(stop: str | Sequence[str] | None) -> list[str]:
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else list(stop)
