"""The engine thread: requests in arrival order, events delivered to the event
loop, cancellation before and during a generation, and a bounded queue."""

from __future__ import annotations

import asyncio
import time

import pytest

from ember.engine import Engine, EngineOverloaded, EngineStopped, GenerationRequest
from ember.model import Completion, Piece
from ember.sampling import SamplingParams


@pytest.fixture
def engine(smollm2):
    e = Engine(smollm2, queue_depth=2)
    e.start()
    yield e
    e.close(timeout=10)


def greedy(model, text: str, n: int, **extra) -> GenerationRequest:
    return GenerationRequest(model.tokenize(text), n, SamplingParams(temperature=0.0, **extra))


def test_a_job_streams_the_same_tokens_as_the_model(engine, smollm2):
    async def go():
        job = engine.submit(greedy(smollm2, "The capital of France is", 12))
        events = [ev async for ev in job.events()]
        return events

    events = asyncio.run(go())
    assert isinstance(events[-1], Completion)
    pieces = [e for e in events if isinstance(e, Piece)]
    assert "".join(p.text for p in pieces) == events[-1].text
    assert events[-1].text == smollm2.generate("The capital of France is", 12, temperature=0)


def test_cancel_mid_generation_frees_the_engine_within_a_token(engine, smollm2):
    async def go():
        long = engine.submit(greedy(smollm2, "Once upon a time", 5000, ignore_eos=True))
        seen = 0
        async for ev in long.events():
            seen += 1
            if seen == 3:
                break
        long.cancel()
        t0 = time.perf_counter()
        short = engine.submit(greedy(smollm2, "Hello", 2))
        done = await asyncio.wait_for(short.result(), timeout=30)
        return done, time.perf_counter() - t0

    done, waited = asyncio.run(go())
    assert len(done.tokens) == 2
    assert waited < 5.0  # the cancelled request would have run for minutes


def test_a_job_cancelled_while_queued_never_runs(engine, smollm2):
    async def go():
        first = engine.submit(greedy(smollm2, "Once upon a time", 40, ignore_eos=True))
        queued = engine.submit(greedy(smollm2, "Hello", 4))
        queued.cancel()
        await first.result()
        third = engine.submit(greedy(smollm2, "Hi", 1))
        await third.result()
        return queued

    queued = asyncio.run(go())
    assert queued.cancelled and not queued.started.is_set()
    assert queued._events.empty()


def test_the_queue_is_bounded_and_close_refuses_new_work(engine, smollm2):
    async def go():
        jobs = [engine.submit(greedy(smollm2, "Once upon a time", 200, ignore_eos=True))]
        await jobs[0].started.wait()
        jobs += [engine.submit(greedy(smollm2, "a", 1)), engine.submit(greedy(smollm2, "b", 1))]
        with pytest.raises(EngineOverloaded):
            engine.submit(greedy(smollm2, "c", 1))
        for j in jobs:
            j.cancel()

    asyncio.run(go())
    engine.close(timeout=10)
    with pytest.raises(EngineStopped):
        engine.submit(greedy(smollm2, "d", 1), loop=asyncio.new_event_loop())


def test_engine_errors_reach_the_caller(engine, smollm2):
    async def go():
        job = engine.submit(GenerationRequest([1, 10**7], 2, SamplingParams()))
        return await job.result()

    with pytest.raises(Exception, match="out of range"):
        asyncio.run(go())


def test_tasks_run_on_the_engine_thread_between_passes(engine, smollm2):
    """The engine is the model's one owner: a task (an embedding, a slot
    file, a snapshot) runs on its thread, between two passes of a generation
    in progress, not after it; what it raises reaches the caller."""
    import threading

    def fail():
        raise ValueError("the task's own error")

    async def go():
        long = engine.submit(greedy(smollm2, "Once upon a time", 5000, ignore_eos=True))
        await long.started.wait()
        where = await asyncio.wait_for(engine.call(lambda: threading.current_thread().name), timeout=10)
        snap = await asyncio.wait_for(engine.call(engine.snapshot), timeout=10)
        with pytest.raises(ValueError, match="the task's own error"):
            await engine.call(fail)
        vector = await asyncio.wait_for(engine.call(lambda: smollm2.embed("hi", pooling="mean")), timeout=30)
        long.cancel()
        return where, snap, vector

    where, snap, vector = asyncio.run(go())
    assert where == "ember-engine"
    assert snap["busy"] == 1 and snap["slots"][0]["busy"]
    assert len(vector) == smollm2.n_embd


def test_a_task_after_close_is_refused(engine):
    engine.close(timeout=10)

    async def go():
        await engine.call(lambda: 1)

    with pytest.raises(EngineStopped):
        asyncio.run(go())
