"""The connections the server holds (`ember.server.connections`, and the
body's bound in `ember.server.http`): slow or idle clients are closed after
`--timeout`, at most `--max-connections` are open, and a malformed request is
one log line and a JSON error. Every socket here is to a loopback server the
test started."""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlparse

import pytest

from server_process import ServerProcess, http

TIMEOUT = 2


@pytest.fixture(scope="module")
def server(smollm2_path):
    with ServerProcess(smollm2_path, "--timeout", str(TIMEOUT), "--max-connections", "6", ctx=256) as s:
        yield s
        assert "Traceback" not in "\n".join(s.lines)


def _connect(server) -> socket.socket:
    u = urlparse(server.url)
    return socket.create_connection((u.hostname, u.port), timeout=TIMEOUT * 5)


def _read_all(s: socket.socket) -> bytes:
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    return out


@pytest.mark.parametrize("sent", [b"", b"GET /hea", b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n"],
                         ids=["idle", "partial-line", "partial-headers"])
def test_a_request_head_that_does_not_arrive_closes_the_connection(server, sent):
    with _connect(server) as s:
        s.sendall(sent)
        t0 = time.monotonic()
        assert _read_all(s) == b""
        assert TIMEOUT - 0.5 < time.monotonic() - t0 < TIMEOUT + 3
    assert server.saw("no whole request within")


def test_a_trickled_body_is_answered_408(server):
    with _connect(server) as s:
        s.sendall(b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{\"content\":")
        t0 = time.monotonic()
        reply = s.recv(65536)  # answered at once; the connection lingers a while for what the client still sends
        assert time.monotonic() - t0 < TIMEOUT + 3
    assert reply.startswith(b"HTTP/1.1 408"), reply
    assert b"--timeout" in reply


def test_an_idle_kept_alive_connection_is_closed(server):
    with _connect(server) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        first = s.recv(65536)
        assert first.startswith(b"HTTP/1.1 200")
        t0 = time.monotonic()
        assert _read_all(s) == b""
        assert time.monotonic() - t0 < TIMEOUT + 3


def test_connections_past_the_cap_are_answered_503(server):
    held = [_connect(server) for _ in range(6)]
    try:
        time.sleep(0.2)
        with _connect(server) as extra:
            reply = _read_all(extra)
        assert reply.startswith(b"HTTP/1.1 503") and b"connections" in reply, reply
    finally:
        for s in held:
            s.close()
    time.sleep(0.3)
    assert http(server.url + "/health")[0] == 200


@pytest.mark.parametrize("raw", [b"GARBAGE\r\n\r\n", b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nBad Header\r\n\r\n",
                                 b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n"], ids=["line", "header", "long-line"])
def test_a_malformed_request_is_one_log_line_and_a_json_error(server, raw):
    n = len(server.lines)
    with _connect(server) as s:
        s.sendall(raw)
        reply = _read_all(s)
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith((b"HTTP/1.1 400", b"HTTP/1.0 400")) and b"application/json" in head, reply[:300]
    assert json.loads(body)["error"]["code"] == 400
    time.sleep(0.2)
    new = server.lines[n:]
    assert sum("malformed request" in line for line in new) == 1, new
