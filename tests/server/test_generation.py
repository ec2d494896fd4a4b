"""One request's passage through the engine as a route sees it
(`ember.server.generation`): a client that leaves, running or queued, frees
the engine, and a burst beyond the slots and queue is refused, never lost."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
import urllib.parse

import pytest

from server_process import ServerProcess, http


# -- cancellation -----------------------------------------------------------------------

def _open_stream(server, prompt: str, n: int, stream: bool = True) -> socket.socket:
    u = urllib.parse.urlsplit(server.url)
    body = json.dumps({"prompt": prompt, "n_predict": n, "ignore_eos": True, "stream": stream}).encode()
    s = socket.create_connection((u.hostname, u.port), timeout=30)
    s.sendall(b"POST /completion HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    return s


def test_client_gone_frees_engine(server):
    s = _open_stream(server, "Once upon a time", 1500)
    got = b""
    while got.count(b"data: ") < 3:
        got += s.recv(4096)
    s.close()
    t0 = time.monotonic()
    status, _, out = http(server.url + "/completion", {"prompt": "Hi", "n_predict": 4, "temperature": 0})
    took = time.monotonic() - t0
    assert status == 200 and json.loads(out)["tokens_predicted"] == 4
    # 1500 tokens would take tens of seconds here; the engine must have dropped them.
    assert took < 5, took
    time.sleep(0.3)
    assert any("client gone" in l for l in server.lines if "/completion" in l)


@pytest.fixture(scope="module")
def one_slot(smollm2_path):
    with ServerProcess(smollm2_path, "-np", "1") as s:
        yield s


def test_queued_request_cancelled_never_runs(one_slot):
    server = one_slot  # one slot: the second request waits
    running = _open_stream(server, "Once upon a time", 1500)
    running.recv(4096)
    queued = _open_stream(server, "A queued prompt", 1500, stream=False)
    time.sleep(0.5)
    queued.close()  # gone while waiting: it must never reach the model
    time.sleep(0.5)
    running.close()
    t0 = time.monotonic()
    status, _, _ = http(server.url + "/completion", {"prompt": "Hi", "n_predict": 2})
    assert status == 200 and time.monotonic() - t0 < 5
    time.sleep(0.3)
    gone = [l for l in server.lines if l.startswith("POST /completion") and "client gone" in l]
    assert any(" 0 drawn" in l for l in gone), gone


def test_a_client_gone_while_queued_never_reaches_a_slot(smollm2_path):
    # The busy request outlasts the queued client's wait and the server's look at it
    # (every 0.2 s) on a fast machine too: 1,500 tokens, seconds at any speed here.
    with ServerProcess(smollm2_path, "-np", "1", "-n", "1500") as s:
        busy = threading.Thread(target=http, args=(s.url + "/completion",
                                                   {"prompt": "Once upon a time", "n_predict": 1500, "ignore_eos": True}))
        busy.start()
        time.sleep(0.3)
        # A queued request whose client gives up before a slot frees.
        with pytest.raises(Exception):
            import urllib.request

            req = urllib.request.Request(s.url + "/completion", data=b'{"prompt": "queued and gone", "n_predict": 4}',
                                         headers={"Content-Type": "application/json"})
            urllib.request.urlopen(req, timeout=0.3)
        busy.join(120)
        # The server is still serving, and the abandoned request never ran.
        status, _, _ = http(s.url + "/completion", {"prompt": "after", "n_predict": 2})
        assert status == 200
        time.sleep(0.3)
        log = "\n".join(s.lines)
        served = [l for l in log.splitlines() if "POST /completion" in l]
        assert any(re.search(r"\b499\b|client gone", l) for l in served), served
        assert not any("client gone" in l and "drawn" in l and " 0 drawn" not in l for l in served), served
        assert all(re.search(r"slot \d", l) for l in served if " 200 " in l), served


# -- the queue ----------------------------------------------------------------------------

def test_a_burst_is_answered_or_refused_never_lost(smollm2_path):
    """Eight times the slots plus queue, at once: each request gets a 200 or a
    503 with Retry-After, none hangs, none errors."""
    with ServerProcess(smollm2_path, "-np", "2", "--queue-depth", "2", "-n", "4") as s:
        results: list[tuple[int, dict]] = []
        lock = threading.Lock()

        def one(i: int) -> None:
            status, headers, body = http(s.url + "/v1/completions", {"prompt": f"Count to {i}:", "max_tokens": 4})
            with lock:
                results.append((status, headers))

        threads = [threading.Thread(target=one, args=(i,)) for i in range(32)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert len(results) == 32
        codes = sorted(st for st, _ in results)
        assert set(codes) <= {200, 503}, codes
        assert codes.count(200) >= 4, codes
        assert all("Retry-After" in h for st, h in results if st == 503)
