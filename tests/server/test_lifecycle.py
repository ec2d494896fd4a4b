"""The server's life (`ember.server.lifecycle`), in-process: the answers while
the model is still loading and once it is ready, and a failed load answered
with 503s."""

from __future__ import annotations

import asyncio
import threading

from api_helpers import CHAT


def test_answers_while_loading_then_ready(smollm2_path, monkeypatch):
    from aiohttp.test_utils import TestClient, TestServer

    import ember.model
    from ember.server.app import create_app
    from ember.server.options import ServerOptions

    release = threading.Event()
    real = ember.model.Model

    class BlockingModel(real):
        def __init__(self, *a, **kw):
            assert release.wait(60), "the test never released the load"
            super().__init__(*a, **kw)

    monkeypatch.setattr(ember.model, "Model", BlockingModel)

    async def go():
        app = create_app(ServerOptions(model=str(smollm2_path), port=0, ctx_size=256), log=lambda line: None)
        async with TestClient(TestServer(app)) as c:
            try:
                await asyncio.sleep(0.2)  # the load thread is now blocked in the constructor
                loading = []
                for path in ("/v1/models", "/health", "/v1/health"):
                    r = await c.get(path)
                    loading.append((path, r.status, await r.json()))
                r = await c.post("/v1/chat/completions", json={"messages": CHAT})
                loading.append(("/v1/chat/completions", r.status, await r.json()))
            finally:
                release.set()
            await asyncio.wait_for(app["ready"].wait(), 60)
            ready = []
            for path in ("/v1/models", "/health"):
                r = await c.get(path)
                ready.append((path, r.status, await r.json()))
            return loading, ready

    loading, ready = asyncio.run(go())
    expected = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
    for path, status, body in loading:
        assert status == 503, (path, body)
        assert body["error"]["type"] == "unavailable_error"
        assert "loading" in body["error"]["message"].lower(), (path, body)
    # /health: the README's status word beside the error envelope.
    assert loading[1][2] == {"status": "loading model", **expected} and loading[2][2] == loading[1][2]
    (_, ms, mb), (_, hs, hb) = ready
    assert ms == 200 and mb["data"][0]["id"] == "Smollm2 135M 8k Lc100K Mix1 Ep2"
    assert hs == 200 and hb == {"status": "ok"}


def test_load_failure_answers_503(tmp_path):
    from aiohttp.test_utils import TestClient, TestServer

    from ember.server.app import create_app
    from ember.server.options import ServerOptions

    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"not a model")

    async def go():
        app = create_app(ServerOptions(model=str(bogus), port=0), log=lambda line: None)
        async with TestClient(TestServer(app)) as c:
            await asyncio.wait_for(app["load_failed"].wait(), 30)
            health = await c.get("/health")
            models = await c.get("/v1/models")
            return health.status, await health.json(), models.status, await models.json()

    hs, hb, ms, mb = asyncio.run(go())
    assert hs == 500 and hb["status"] == "error" and "failed to load" in hb["error"]["message"]
    assert ms == 503 and "failed to load" in mb["error"]["message"]
