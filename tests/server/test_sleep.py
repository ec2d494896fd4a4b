"""--sleep-idle-seconds and Ollama's keep_alive (`ember.server.sleep`): an
idle server lets its model go, the routes that describe it answer as before
without loading it again, and the next request that needs it loads it and is
answered as it would have been."""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone

import pytest

from server_process import ServerProcess, http

PROMPT = {"prompt": "The capital of France is", "n_predict": 12, "temperature": 0}


def _get(server, path: str) -> dict:
    status, _, raw = http(server.url + path, method="GET")
    assert status == 200, raw
    return json.loads(raw)


def _asleep(server) -> bool:
    return _get(server, "/props")["is_sleeping"]


def _wait(server, asleep: bool, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while _asleep(server) != asleep:
        assert time.monotonic() < end, f"the server did not {'sleep' if asleep else 'wake'}"
        time.sleep(0.1)


def _rss_kib(server) -> int:
    for line in open(f"/proc/{server.proc.pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def sleepy(smollm2_path):
    # --ignore-eos: /props then lists the end tokens' bans, read from what the load recorded.
    with ServerProcess(smollm2_path, "--sleep-idle-seconds", "1", "--metrics", "--ignore-eos") as s:
        yield s


def test_an_idle_server_lets_its_model_go_and_the_next_request_brings_it_back(sleepy, smollm2_path):
    status, _, raw = http(sleepy.url + "/completion", PROMPT)
    assert status == 200, raw
    before = json.loads(raw)["content"]
    awake_rss = _rss_kib(sleepy)
    _wait(sleepy, asleep=True)
    # The weights (92 MiB of file) and the caches went back.
    assert awake_rss - _rss_kib(sleepy) > 40 * 1024, (awake_rss, _rss_kib(sleepy))
    assert any("sleeping after 1 s idle" in line for line in sleepy.lines)
    # The routes that describe the server answer from what the load recorded, and leave it asleep.
    props = _get(sleepy, "/props")
    assert props["model_path"] == str(smollm2_path) and props["total_slots"] == 4
    assert _get(sleepy, "/v1/models")["data"][0]["meta"]["n_vocab"] == 49152
    assert _get(sleepy, "/health") == {"status": "ok"}
    assert _get(sleepy, "/health?include_slots")["slots_idle"] == 4
    assert http(sleepy.url + "/metrics", method="GET")[0] == 200
    assert _get(sleepy, "/api/ps") == {"models": []}
    assert http(sleepy.url + "/health", method="HEAD")[0] == 200
    assert http(sleepy.url + "/", method="GET")[0] == 200
    assert http(sleepy.url + "/v1/responses/resp_none", method="GET")[0] == 404
    assert http(sleepy.url + "/v1/streams/lookup", {"conversation_ids": ["c1"]})[0] == 200
    assert _asleep(sleepy) and not any("awake" in line for line in sleepy.lines)
    # A request that needs the model loads it again, and is answered as before.
    status, _, raw = http(sleepy.url + "/completion", PROMPT)
    assert status == 200 and json.loads(raw)["content"] == before, raw
    assert any("awake: the model loaded again" in line for line in sleepy.lines)
    assert not _asleep(sleepy)


def test_a_request_longer_than_the_idle_time_is_not_cut(sleepy):
    # Tokenizing needs the model too: it wakes the server.
    status, _, raw = http(sleepy.url + "/tokenize", {"content": "hello"})
    assert status == 200 and not _asleep(sleepy), raw
    t0 = time.monotonic()
    body = {"prompt": "Once upon a time", "n_predict": 600, "temperature": 0, "ignore_eos": True}
    status, _, raw = http(sleepy.url + "/completion", body)
    assert status == 200 and json.loads(raw)["tokens_predicted"] == 600, raw
    assert time.monotonic() - t0 > 1.0, "the test needs a generation longer than the idle time"


def test_ollamas_keep_alive_says_how_long_the_model_stays(smollm2_path):
    with ServerProcess(smollm2_path) as s:
        # keep_alive "5m": /api/ps says when the model goes.
        status, _, raw = http(s.url + "/api/generate", {"model": "m", "prompt": "", "keep_alive": "5m"})
        assert status == 200 and json.loads(raw)["done_reason"] == "load", raw
        expires = datetime.fromisoformat(_get(s, "/api/ps")["models"][0]["expires_at"].replace("Z", "+00:00"))
        assert 280 < (expires - datetime.now(timezone.utc)).total_seconds() <= 301, expires
        for bad in ("soon", True, [1]):
            status, _, raw = http(s.url + "/api/generate", {"model": "m", "prompt": "", "keep_alive": bad})
            assert status == 400 and json.loads(raw)["error"].startswith("keep_alive: expected a duration"), raw
        # keep_alive 0 with nothing to generate: Ollama's way of letting the model go.
        status, _, raw = http(s.url + "/api/generate", {"model": "m", "prompt": "", "keep_alive": 0})
        assert status == 200 and json.loads(raw)["done_reason"] == "unload", raw
        _wait(s, asleep=True)
        # Said again to a sleeping model (`ollama stop`), on either route, it is answered without loading it.
        status, _, raw = http(s.url + "/api/generate", {"model": "m", "prompt": "", "keep_alive": "0s"})
        assert status == 200 and json.loads(raw)["done_reason"] == "unload", raw
        status, _, raw = http(s.url + "/api/chat", {"model": "m", "messages": [], "keep_alive": 0})
        assert status == 200 and json.loads(raw)["done_reason"] == "unload", raw
        assert _asleep(s) and not any("awake" in line for line in s.lines)
        # A request saying nothing of it wakes the model, and the server's own idle time (here none)
        # holds again: the model stays.
        status, _, raw = http(s.url + "/api/generate", {"model": "m", "prompt": "Hi", "stream": False,
                                                        "options": {"num_predict": 2}})
        assert status == 200, raw
        time.sleep(0.5)
        assert not _asleep(s)
        assert _get(s, "/api/ps")["models"][0]["expires_at"].startswith("9999")


def test_a_shutdown_does_not_wake_a_sleeping_model(smollm2_path):
    s = ServerProcess(smollm2_path, "--sleep-idle-seconds", "1")
    try:
        _wait(s, asleep=True)
        assert http(s.url + "/shutdown", {})[0] == 200
        assert s.proc.wait(30) == 0
        assert not any("awake" in line for line in s.lines)
    finally:
        s.stop()


def test_a_budget_message_too_long_for_one_run_fails_the_load(smollm2_path):
    from ember.server.lifecycle import load_engine
    from ember.server.options import ReasoningDefaults, ServerOptions
    from ember.server.state import ServerState

    opts = ServerOptions(model=str(smollm2_path), ctx_size=256,
                         reasoning=ReasoningDefaults(reasoning_budget_message="word " * 80))
    with pytest.raises(ValueError, match=r"--reasoning-budget-message is \d+ tokens for this model; at most 56 "):
        load_engine(ServerState(opts=opts, log=print))


@pytest.mark.parametrize("value", ["0", "-2"])
def test_a_sleep_time_of_zero_or_below_minus_one_is_refused(smollm2_path, value):
    from ember.server.cli import OptionError, parse_options

    with pytest.raises(OptionError, match=f"--sleep-idle-seconds {value}: must be -1"):
        parse_options(["-m", str(smollm2_path), "--sleep-idle-seconds", value], {})
