"""The server, the in-process API and `ember bench` with the model on a Vulkan device
(Mesa's lavapipe in CI, which reads a few tokens a second: the prompts are
llama.cpp's short golden ones and the draws few). Greedy tokens equal
llama.cpp's recorded ones on these prompts, two slots answered together; a
device fault fails that pass's requests with a 500 naming it, and the next
request is answered.

Without a device these tests say so and skip, unless EMBER_REQUIRE_GPU is
set (CI sets it): then they fail."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import pytest

from paths import FIXTURES, TESTS


def _device_name() -> str:
    from ember import _native

    names = [d["name"] for d in _native.list_devices()]
    if not names:
        if os.environ.get("EMBER_REQUIRE_GPU"):
            pytest.fail("EMBER_REQUIRE_GPU is set, and no Vulkan device is listed")
        pytest.skip("no Vulkan device here")
    return names[0]


def _golden_cases() -> list[dict]:
    """Short prompts (4 and 7 tokens) with llama.cpp's greedy tokens."""
    cases = json.loads((TESTS / "golden" / "smollm2-135m-instruct-q4_1.json").read_text())["cases"]
    return [cases[6], cases[8]]


def test_the_in_process_model_on_the_device(smollm2_path):
    import ember
    from ember.errors import DeviceError, InvalidRequestError

    name = _device_name()
    model = ember.Model(smollm2_path, n_ctx=64, device=name, max_batch=16)
    where = model.placement
    assert where["name"] == name and where["weight_bytes"] > 50 * 2**20, where
    assert model.device_note is None
    case = _golden_cases()[0]
    done = list(model.stream_completion(case["prompt_ids"], 4, temperature=0, ignore_eos=True))[-1]
    assert done.tokens == case["greedy_ids"][:4], "greedy tokens on the device and llama.cpp's"
    # Every layer or none: a count below the model's is refused, as is a
    # cache type the device does not hold; a device that is not there is a
    # DeviceError naming the ones that are.
    with pytest.raises(InvalidRequestError, match="gpu_layers 10: ember runs every layer of a model on the device "
                                                  "or none, and this model has 30"):
        ember.Model(smollm2_path, n_ctx=64, gpu_layers=10, device=name)
    for kv in ("f32", "bf16"):
        with pytest.raises(InvalidRequestError,
                           match=f"a KV cache of type {kv} is held on the CPU only; on a device the cache is f16 or q8_0"):
            ember.Model(smollm2_path, n_ctx=64, kv_type=kv, device=name)
    # A q8_0 cache is held on the device too, quantized as the CPU's is: the
    # greedy tokens are the CPU's with a q8_0 cache.
    on_device = ember.Model(smollm2_path, n_ctx=64, kv_type="q8_0", device=name, max_batch=16)
    on_cpu = ember.Model(smollm2_path, n_ctx=64, kv_type="q8_0", device="none", max_batch=16)
    greedy = [list(m.stream_completion(case["prompt_ids"], 4, temperature=0, ignore_eos=True))[-1].tokens
              for m in (on_device, on_cpu)]
    assert on_device.placement["name"] == name and on_cpu.placement is None
    assert greedy[0] == greedy[1], "greedy tokens with a q8_0 cache on the device and on the CPU"
    with pytest.raises(DeviceError, match='no device named "Vulkan99"; the devices are: '):
        ember.Model(smollm2_path, n_ctx=64, device="Vulkan99")
    cpu = ember.Model(smollm2_path, n_ctx=64, device="none", gpu_layers="all")
    assert cpu.placement is None and cpu.device_note is None


def test_a_model_without_device_kernels_is_refused_by_name_and_noted_otherwise():
    """A model with a matrix type the device has no product for (a Q8_K
    output head, which the CPU reads) on a named device is refused, naming
    the tensor; asked for by -ngl alone it runs on the CPU, and the note
    says why."""
    import ember
    from ember.errors import DeviceError

    sys.path.insert(0, str(FIXTURES))
    import make_tiny_models

    path = make_tiny_models.ensure("llamaq8k")
    name = _device_name()
    with pytest.raises(DeviceError, match=f"the model cannot run on {name}: tensor output.weight: type Q8_K has no "
                                          "device kernel yet"):
        ember.Model(path, n_ctx=64, device=name)
    model = ember.Model(path, n_ctx=64, gpu_layers="all")
    assert model.placement is None and model.device_note
    assert len(model.complete([1, 2, 3], max_tokens=2, ignore_eos=True).tokens) == 2


def test_asking_for_the_first_card_runs_on_the_cpu_without_one(smollm2_path):
    """gpu_layers alone takes a card; a software device is no card (it runs
    slower than the CPU's own kernels), so with only lavapipe the model runs
    on the CPU and says why."""
    import ember
    from ember import _native

    devices = _native.list_devices()
    if any(d["kind"] != "CPU (software)" for d in devices):
        pytest.skip("a card is here")
    model = ember.Model(smollm2_path, n_ctx=64, gpu_layers="all")
    assert model.placement is None
    if devices:
        assert "runs on the CPU itself, slower than ember's CPU kernels; name it with --device" in model.device_note
    else:
        assert model.device_note == "no Vulkan device found (install a Vulkan driver, or run on the CPU)"


def test_the_server_on_the_device(smollm2_path):
    from aiohttp.test_utils import TestClient, TestServer

    from ember.server.app import create_app
    from ember.server.options import ServerOptions

    name = _device_name()
    cases = _golden_cases()
    lines: list[str] = []

    async def completion(c, case, n=4):
        r = await c.post("/completion", json={"prompt": case["prompt_ids"], "n_predict": n, "temperature": 0,
                                               "return_tokens": True, "ignore_eos": True})
        return r.status, await r.json()

    async def go():
        opts = ServerOptions(model=str(smollm2_path), port=0, ctx_size=128, parallel=2, device=name, max_batch=16,
                             prompt_chunk=16)
        app = create_app(opts, log=lines.append)
        async with TestClient(TestServer(app)) as c:
            await asyncio.wait_for(app["ready"].wait(), 300)
            props = await (await c.get("/props")).json()
            together = await asyncio.gather(*(completion(c, case) for case in cases))
            passes = await app["engine"].call(app["engine"].snapshot)
            app["model"]._native.inject_device_fault("injected by the test")
            failed = await completion(c, cases[0], 2)
            after = await completion(c, cases[1])
            return props, together, passes, failed, after

    props, together, passes, failed, after = asyncio.run(go())
    device = props["device"]
    assert device["name"] == name and device["weight_bytes"] > 0 and device["cache_bytes"] > 0, device
    said = [line for line in lines if line.startswith("ember: device: ")]
    assert said and said[0].startswith(f"ember: device: {name} (") and "holds every layer and the output head" in said[0]
    for (status, body), case in zip(together, cases):
        assert status == 200, body
        assert body["tokens"] == case["greedy_ids"][:4], "greedy tokens on the device and llama.cpp's"
    assert passes["slot_passes"] > passes["passes"], "the two slots shared passes"
    status, body = failed
    assert status == 500, body
    assert "the device was lost: injected by the test" in body["error"]["message"], body
    status, body = after
    assert status == 200 and body["tokens"] == cases[1]["greedy_ids"][:4], body


def test_bench_on_the_device(smollm2_path):
    import subprocess
    import sys

    name = _device_name()
    run = lambda *a: subprocess.run([sys.executable, "-m", "ember", "bench", "-m", str(smollm2_path), *a],  # noqa: E731
                                    capture_output=True, text=True, timeout=300)
    r = run("-p", "16", "-n", "4", "-r", "1", "--device", name, "--json")
    assert r.returncode == 0, r.stderr
    objs = [json.loads(line) for line in r.stdout.strip().splitlines()]
    assert [o["test"] for o in objs] == ["pp16", "tg4"]
    for o in objs:
        assert o["kernels"] == name and o["avg_ts"] > 0, o
        assert "limit_ts" not in o, "the host's streaming limit is not a device's"
    # A q8_0 cache on the device, as llama-bench's -ctk asks for one.
    r = run("-p", "16", "-n", "2", "-r", "1", "--device", name, "-ctk", "q8_0", "--json")
    assert r.returncode == 0, r.stderr
    objs = [json.loads(line) for line in r.stdout.strip().splitlines()]
    assert [(o["test"], o["type_k"], o["type_v"], o["kernels"]) for o in objs] == [
        ("pp16", "q8_0", "q8_0", name), ("tg2", "q8_0", "q8_0", name)], objs
    for args, needle in ((["-ngl", "gl"], "gpu_layers: expected a number of layers"),
                         (["--device", "Vulkan99"], 'no device named "Vulkan99"'),
                         (["-ngl", "3", "--device", name], "gpu_layers 3: ember runs every layer")):
        r = run("-p", "16", "-n", "0", "-r", "1", *args)
        assert r.returncode == 2 and needle in r.stderr, (args, r.stderr)
        # (Mesa may add lines of its own about the environment.)
        said = [line for line in r.stderr.splitlines() if line.startswith("ember bench: ")]
        assert len(said) == 1 and needle in said[0] and "Traceback" not in r.stderr, r.stderr
