"""SSE pings (llama-server's --sse-ping-interval and sse_ping_interval): a
streamed reply kept waiting for its first token (here, queued behind another
request on the one slot) starts its stream and sends an SSE comment each
interval, so that its client's connection is kept; what goes wrong after that
travels in the stream, in the route's envelope."""

from __future__ import annotations

import json
import threading
import time

import pytest

from server_process import ServerProcess, http, sse

LONG = {"prompt": "Once upon a time", "n_predict": 500, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(smollm2_path):
    with ServerProcess(smollm2_path, "-np", "1", "--sse-ping-interval", "1", ctx=1024) as s:
        yield s


def _behind_a_long_request(server, body: dict) -> bytes:
    """`body` streamed while a long request holds the only slot."""
    done = threading.Event()

    def hold():
        status, _, raw = http(server.url + "/completion", LONG)
        assert status == 200, raw
        done.set()

    t = threading.Thread(target=hold)
    t.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    status, _, raw = http(server.url + "/v1/chat/completions", body)
    waited = time.monotonic() - t0
    t.join()
    assert status == 200, raw
    assert waited > 1.2, f"the test needs the stream to wait past its interval ({waited:.1f} s)"
    return raw


def test_a_stream_waiting_for_its_first_token_is_pinged(server):
    raw = _behind_a_long_request(server, {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
                                          "temperature": 0, "stream": True})
    text = raw.decode()
    assert text.startswith(": ping\n\n"), text[:80]
    # Then the reply as ever: its chunks and the end, the comments ignored by SSE readers.
    events = sse(raw)
    assert events[-1] == "[DONE]" and any(isinstance(e, dict) and e.get("choices") for e in events)


def test_a_request_may_turn_its_pings_off(server):
    raw = _behind_a_long_request(server, {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
                                          "temperature": 0, "stream": True, "sse_ping_interval": -1})
    assert b": ping" not in raw and raw.startswith(b"data: "), raw[:80]


def test_an_error_after_the_pings_travels_in_the_stream(smollm2_path):
    # The server stops while the stream waits: its job is told so once the stream has started.
    with ServerProcess(smollm2_path, "-np", "1", "--sse-ping-interval", "1", "--shutdown-timeout", "0") as s:
        # The slot held past the shutdown, however slow the machine.
        held = threading.Thread(target=lambda: http(s.url + "/completion", {**LONG, "n_predict": 4000}))
        held.start()
        time.sleep(0.3)
        out: dict = {}

        def stream():
            out["reply"] = http(s.url + "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                                                "max_tokens": 4, "stream": True})

        t = threading.Thread(target=stream)
        t.start()
        time.sleep(3.0)  # two pings or more at an interval of 1 s, even where the request is slow to arrive
        http(s.url + "/shutdown", {})
        t.join(30)
        held.join(30)
    status, _, raw = out["reply"]
    assert status == 200 and raw.startswith(b": ping"), raw[:80]
    errors = [e for e in sse(raw) if isinstance(e, dict) and "error" in e]
    assert errors and "shutting down" in errors[0]["error"]["message"], raw[-300:]


def test_a_bad_interval_is_refused(server):
    status, _, raw = http(server.url + "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                                                 "sse_ping_interval": -5})
    assert status == 400 and json.loads(raw)["error"]["param"] == "sse_ping_interval", raw
