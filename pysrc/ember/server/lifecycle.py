"""The server's life: the model loaded on a thread of its own behind a
listening socket (with the start lines of what it was granted), /shutdown,
and the engine closed at the end (/health is llama-server's route)."""

from __future__ import annotations

import asyncio
import ipaddress
import threading
import warnings

from aiohttp import web

from ember.engine import CHUNK_TARGET_S
from ember.server.errors import ApiError
from ember.server.http import json_response
from ember.server.state import ServerState

__all__ = ["on_cleanup", "on_startup", "shutdown"]


def _is_loopback(remote: str | None) -> bool:
    if not remote:
        return False
    try:
        return ipaddress.ip_address(remote.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


async def shutdown(request: web.Request) -> web.Response:
    if not _is_loopback(request.remote):
        raise ApiError(403, "shutdown is accepted only from this machine (a loopback address)")
    if request.headers.get("Origin"):
        # A web page's request: a browser on this machine is loopback too, and any page could send it.
        raise ApiError(403, "shutdown is not accepted from a web page (the request carries an Origin)")
    stop = request.app.get("request_shutdown")
    if stop is None:
        raise ApiError(501, "this server was started without a way to shut it down")
    stop(f"POST /shutdown from {request.remote}")
    return json_response({"status": "shutting down"})


def load_engine(state: ServerState) -> tuple:
    """The model as the options ask for it, and its engine started (also
    how a sleeping server loads it again)."""
    from ember.engine import Checkpoints, Engine, measure_chunk
    from ember.model import Model
    from ember.server.machine import mem_available

    opts = state.opts
    model = Model(opts.model, n_ctx=opts.ctx_size, threads=opts.threads, kv_type=opts.kv_type,
                  max_batch=opts.max_batch, gpu_layers=opts.gpu_layers, device=opts.device)
    if opts.embeddings and (opts.pooling or model.pooling_type) == "rank" and not model.can_rank:
        said = "--reranking (or --pooling rank)" if opts.pooling else "the file's pooling, rank,"
        raise ValueError(f"{said} needs a reranker's classification head (cls.output.weight), which this model "
                         "lacks")
    message = opts.reasoning.reasoning_budget_message
    if message:
        # Written with the thought's close (a few tokens) in one run: refused here, not at every chat.
        n, room = len(model.tokenize(message, add_special=False, parse_special=True)), model.max_forced_run - 8
        if n > room:
            raise ValueError(f"--reasoning-budget-message is {n} tokens for this model; at most {room} are "
                             "written before the thought's close")
    host = opts.cache_ram_mib * 2**20 if opts.cache_ram_mib >= 0 else 2**62
    checkpoints = Checkpoints(opts.ctx_checkpoints, opts.checkpoint_interval, opts.checkpoint_min_step,
                              mem_available() or 0)
    slots, unified = opts.parallel, opts.kv_unified
    if opts.parallel_auto and unified and model.placement is not None:
        # A device's context is not shared: auto's slots would each take the whole of it.
        slots, unified = 1, False
    engine = Engine(model, queue_depth=opts.queue_depth, slots=slots,
                    chunk=min(measure_chunk(model), opts.prompt_chunk), host_cache_bytes=host,
                    checkpoints=checkpoints, slot_similarity=opts.slot_similarity, unified=unified)
    engine.start()
    return model, engine


def publish(app: web.Application, model, engine) -> None:
    """Makes `model` and `engine` the ones every route uses (None, None: the
    model sleeps), with what the describing routes read of them."""
    from ember.server.sleep import ModelFacts

    state: ServerState = app["state"]
    state.model, state.engine = model, engine
    if model is not None:
        state.facts = ModelFacts.of(model, engine)
    # The runner and the tests read them from the app; aiohttp frowns on
    # changing a started app, but these keys only follow the state's.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        app["model"], app["engine"] = model, engine


def _load(state: ServerState, loop: asyncio.AbstractEventLoop, app: web.Application) -> None:
    try:
        template = state.opts.chat_template
        if state.opts.chat_template_file:
            with open(state.opts.chat_template_file, encoding="utf-8") as f:
                template = f.read()
        model, engine = load_engine(state)
        _say_device(state, model, engine)
        _say_checkpoints(state, engine)
    except BaseException as e:  # noqa: BLE001 - any failure must reach the runner, not kill a thread silently
        msg = f"{type(e).__name__}: {e}" if not str(e) else str(e)
        _post(loop, _loaded, app, None, None, None, msg)
        return
    if not _post(loop, _loaded, app, model, engine, template, None):
        engine.close()  # the server stopped while the model loaded: nobody will use it


def _say_device(state: ServerState, model, engine) -> None:
    """The start line of where the model runs, when a device was asked for
    or holds it: the device and what it holds, or why it is the CPU."""
    where = model.placement
    if where is not None:
        state.log(f"ember: device: {where['name']} ({where['description']}, {where['kind']}) holds every layer and "
                  f"the output head: {_bytes(where['weight_bytes'])} of weights, {_bytes(engine.batcher.cache_bytes)} "
                  f"of cache for {engine.n_slots} slot{'s' if engine.n_slots > 1 else ''}, "
                  f"{_bytes(where['work_bytes'])} of working buffers")
    elif model.device_note:
        state.log(f"ember: device: none, the model runs on the CPU: {model.device_note}")


def _say_checkpoints(state: ServerState, engine) -> None:
    """The start line of a hybrid model's checkpoints: their size, how many,
    where they are taken, and why fewer than asked when memory would not
    hold them."""
    each = engine.checkpoint_bytes
    if not each:
        return
    c, asked = engine.checkpoints, state.opts.ctx_checkpoints
    size = f"{_bytes(each)} each (a slot's recurrent states)"
    if c.count == 0:
        why = f": {engine.checkpoints_cut}" if engine.checkpoints_cut else " (--ctx-checkpoints 0)"
        state.log(f"ember: checkpoints: none{why}; a prompt that parts from what its slot holds is read from the start")
        return
    where = "where a prompt parts from what its slot held, where the next chat turn will part"
    if c.interval:
        where += f", and every {c.interval} positions of a long prompt"
        if c.min_step:
            where += f" (at least {c.min_step} from any other)"
    total = _bytes(c.reserved(each, engine.n_slots))
    cut = f", not the {asked} asked: {engine.checkpoints_cut}" if engine.checkpoints_cut else ""
    state.log(f"ember: checkpoints: up to {c.count} per slot{cut}; {size}, {total} for every slot, counted "
              f"in the host prompt cache; taken {where}")


def _bytes(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def _post(loop: asyncio.AbstractEventLoop, fn, *args) -> bool:
    """Runs `fn(*args)` on the loop; False when the loop has already closed."""
    try:
        loop.call_soon_threadsafe(fn, *args)
        return True
    except RuntimeError:
        return False


def _loaded(app: web.Application, model, engine, template, error: str | None) -> None:
    state: ServerState = app["state"]
    if error is not None:
        # The runner says it once it sees the event, and exits non-zero.
        state.phase, state.load_error = "failed", error
        app["load_failed"].set()
        return
    state.template = template
    publish(app, model, engine)
    state.phase = "ready"
    slots = f"{engine.n_slots} slots of {engine.slot_ctx} positions" if engine.n_slots > 1 else f"context {engine.slot_ctx}"
    if engine.unified and engine.n_slots > 1:
        slots = f"{engine.n_slots} slots sharing a context of {engine.slot_ctx} positions"
    state.log(f"ember: model {state.model_id()} loaded ({slots}; prompts read {engine.chunk} tokens per pass, "
              f"so a pass beside other conversations stays near {CHUNK_TARGET_S * 1e3:.0f} ms)")
    app["ready"].set()
    if state.closing:
        engine.close(0)
    elif state.opts.sleep_idle_seconds > 0:
        app["sleeper"].start()


async def on_startup(app: web.Application) -> None:
    loop = asyncio.get_running_loop()
    # Not a daemon, for the reason the engine thread is not one: exit waits
    # for the load to return rather than killing it inside the model.
    t = threading.Thread(target=_load, args=(app["state"], loop, app), name="ember-load", daemon=False)
    t.start()


async def on_cleanup(app: web.Application) -> None:
    state: ServerState = app["state"]
    state.closing = True
    app["sleeper"].stop()
    if state.engine is not None:
        await asyncio.get_running_loop().run_in_executor(None, state.engine.close, 5.0)
