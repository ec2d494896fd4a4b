"""Resumable streams (`ember.server.kept_streams`): a streamed reply asked
for under `X-Conversation-Id` is kept, outlives a client that leaves, and is
read again from any offset through `GET /v1/stream`; `DELETE /v1/stream`
stops its generation. The keeping itself (its cap, its expiry, its owners)
is tested on the registry alone."""

from __future__ import annotations

import asyncio
import json
import socket
import time
import urllib.parse

import pytest

from api_helpers import CHAT
from server_process import error_of, http, sse

from ember.server.kept_streams import KeptStreams, OffsetLost


# -- the registry ------------------------------------------------------------------------

def _drain(kept, offset: int) -> bytes:
    async def read():
        return b"".join([c async for c in kept.read_from(offset)])
    return asyncio.run(read())


def test_a_stream_keeps_its_last_bytes_and_says_when_an_offset_is_lost():
    streams = KeptStreams(max_bytes=10)
    kept = streams.start("c", 0)
    kept.append(b"0123456")
    kept.append(b"789abcdef")
    kept.finish()
    assert kept.total_bytes == 16 and kept.dropped == 6
    assert _drain(kept, 6) == b"6789abcdef" and _drain(kept, 12) == b"cdef" and _drain(kept, 16) == b""
    with pytest.raises(OffsetLost):
        _drain(kept, 5)
    kept.append(b"late")  # a finished stream takes nothing more
    assert kept.total_bytes == 16


def test_a_reader_follows_the_stream_live_until_it_ends():
    async def run():
        kept = KeptStreams().start("c", 0)
        kept.append(b"ab")
        got = []

        async def reader():
            async for chunk in kept.read_from(1):
                got.append(chunk)

        task = asyncio.get_running_loop().create_task(reader())
        await asyncio.sleep(0.01)
        kept.append(b"cd")
        await asyncio.sleep(0.01)
        kept.append(b"e")
        kept.finish()
        await asyncio.wait_for(task, 1)
        return got

    assert b"".join(asyncio.run(run())) == b"bcde"


def test_one_stream_an_id_and_an_owners_streams_are_its_own():
    streams = KeptStreams()
    first = streams.start("conv", 1)
    second = streams.start("conv", 1)
    assert first.cancelled and first.done and not second.cancelled
    assert streams.get("conv", 1) is second and streams.get("conv", 2) is None
    other = streams.start("conv", 2)
    assert not second.cancelled and streams.get("conv", 2) is other
    per_model = streams.start("conv::org/model", 1)
    assert streams.lookup(["conv"], 1) == [second, per_model]
    assert streams.lookup(["con"], 1) == [] and streams.lookup(["conv"], 3) == []
    streams.stop("conv", 1)
    assert second.cancelled and streams.get("conv", 1) is None


def test_finished_streams_expire_and_the_oldest_go_past_the_count(monkeypatch):
    streams = KeptStreams(max_finished=2, ttl=300)
    kept = [streams.start(f"c{i}", 0) for i in range(4)]
    for k in kept[:3]:
        k.finish()
    # Three finished, two kept: the oldest finished goes; the running one stays.
    assert [streams.get(f"c{i}", 0) for i in range(4)] == [None, kept[1], kept[2], kept[3]]
    now = time.monotonic()
    monkeypatch.setattr(time, "monotonic", lambda: now + 301)
    assert [streams.get(f"c{i}", 0) for i in range(4)] == [None, None, None, kept[3]]


# -- through the server -----------------------------------------------------------------------

def _stream_body(**extra) -> dict:
    return {"messages": CHAT, "stream": True, "temperature": 0, **extra}


def test_a_finished_stream_is_read_again_byte_for_byte(plain_server):
    url = plain_server.url
    status, headers, first = http(url + "/v1/chat/completions", _stream_body(max_tokens=8),
                                  headers={"X-Conversation-Id": "conv-1"})
    assert status == 200 and sse(first)[-1] == "[DONE]"
    status, headers, again = http(url + "/v1/stream?conv_id=conv-1", method="GET")
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    assert again == first
    status, _, tail = http(url + f"/v1/stream?conv_id=conv-1&from={len(first) - 10}", method="GET")
    assert tail == first[-10:]
    found = json.loads(http(url + "/v1/streams/lookup", {"conversation_ids": ["conv-1", "conv-none"]})[2])
    assert [(f["conversation_id"], f["is_done"], f["total_bytes"]) for f in found] == [("conv-1", True, len(first))]
    assert found[0]["completed_at"] >= found[0]["started_at"] > 0
    assert http(url + "/v1/stream?conv_id=conv-1", method="DELETE")[0] == 204
    e = error_of(http(url + "/v1/stream?conv_id=conv-1", method="GET"), 404)
    assert e["param"] == "conv_id"
    # A reply not streamed, or refused, keeps nothing.
    http(url + "/v1/chat/completions", {"messages": CHAT, "max_tokens": 2}, headers={"X-Conversation-Id": "whole"})
    http(url + "/v1/chat/completions", _stream_body(max_tokens=-5), headers={"X-Conversation-Id": "refused"})
    assert json.loads(http(url + "/v1/streams/lookup", {"conversation_ids": ["whole", "refused"]})[2]) == []


def _open(server, path: str, body: dict, conv_id: str) -> socket.socket:
    u = urllib.parse.urlsplit(server.url)
    raw = json.dumps(body).encode()
    s = socket.create_connection((u.hostname, u.port), timeout=30)
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              f"X-Conversation-Id: {conv_id}\r\nContent-Length: {len(raw)}\r\n\r\n".encode() + raw)
    return s


def test_a_stream_goes_on_when_its_client_leaves_and_is_read_again_whole(plain_server):
    url = plain_server.url
    # Long enough (a second or more here) that a generation tied to its client would be dropped.
    body = {"prompt": "Once upon a time", "n_predict": 400, "ignore_eos": True, "temperature": 0, "stream": True}
    s = _open(plain_server, "/completion", body, "left")
    got = b""
    while got.count(b"data: ") < 2:
        got += s.recv(4096)
    s.close()
    # The reply a client that stayed would have read: the same tokens, all of them.
    status, _, stayed = http(url + "/completion", body)
    assert status == 200
    want = "".join(e["content"] for e in sse(stayed))
    status, _, again = http(url + "/v1/stream?conv_id=left", method="GET")
    events = sse(again)
    assert "".join(e["content"] for e in events) == want
    assert events[-1]["stop"] is True and events[-1]["tokens_predicted"] == 400


def test_a_stop_cancels_the_generation(plain_server):
    url = plain_server.url
    body = {"prompt": "Once upon a time", "n_predict": 1500, "ignore_eos": True, "stream": True}
    s = _open(plain_server, "/completion", body, "stopped")
    got = b""
    while got.count(b"data: ") < 2:
        got += s.recv(4096)
    t0 = time.monotonic()
    assert http(url + "/v1/stream?conv_id=stopped", method="DELETE")[0] == 204
    # The stream's own reply ends soon after (its last chunk sent), long before 1,500 tokens.
    s.settimeout(10)
    while not got.endswith(b"\r\n0\r\n\r\n"):
        got += s.recv(65536)
    s.close()
    assert time.monotonic() - t0 < 5
    assert error_of(http(url + "/v1/stream?conv_id=stopped", method="GET"), 404)
    time.sleep(0.3)
    assert any("stopped (DELETE /v1/stream)" in line for line in plain_server.lines if "/completion" in line)


@pytest.mark.parametrize("query, field", [
    ("", "conv_id"),
    ("?conv_id=", "conv_id"),
    ("?conv_id=x&from=-1", "from"),
    ("?conv_id=x&from=ten", "from"),
])
def test_a_misshapen_read_is_a_400_naming_the_field(plain_server, query, field):
    assert error_of(http(plain_server.url + "/v1/stream" + query, method="GET"), 400)["param"] == field


def test_a_read_past_the_end_and_a_bad_lookup_are_400s(plain_server):
    url = plain_server.url
    status, _, first = http(url + "/v1/chat/completions", _stream_body(max_tokens=2),
                            headers={"X-Conversation-Id": "short"})
    assert status == 200
    e = error_of(http(url + f"/v1/stream?conv_id=short&from={len(first) + 1}", method="GET"), 400)
    assert e["param"] == "from"
    assert error_of(http(url + "/v1/streams/lookup", {"conversation_ids": "short"}), 400)
    assert error_of(http(url + "/v1/stream", method="DELETE"), 400)["param"] == "conv_id"
