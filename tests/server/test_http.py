"""The request body every route reads (`ember.server.http`'s capped read,
`ember.server.wire`'s decoding), on a real `ember serve` process: too large,
gzipped, or JSON that is not an object."""

from __future__ import annotations

import gzip
import json
import socket
import urllib.parse

import pytest

from api_helpers import CHAT
from server_process import error_of, http


def test_body_too_large_refused_before_read(server):
    # Announces 50 MB but sends a few bytes: the answer must come without the rest.
    u = urllib.parse.urlsplit(server.url)
    with socket.create_connection((u.hostname, u.port), timeout=10) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 50000000\r\n\r\n{\"prompt\": \"")
        reply = s.recv(4096).decode()
    assert reply.startswith("HTTP/1.1 413"), reply
    assert '"code":413' in reply


def test_gzip_body(server):
    body = gzip.compress(json.dumps({"content": "Hello world"}).encode())
    status, _, out = http(server.url + "/tokenize", raw=body, headers={"Content-Encoding": "gzip"})
    assert status == 200 and len(json.loads(out)["tokens"]) == 2


@pytest.mark.with_flags
def test_array_body_is_400(server):
    for path in ("/v1/chat/completions", "/v1/completions", "/completion", "/tokenize"):
        e = error_of(http(server.url + path, [CHAT[0]]), 400)
        assert e["type"] == "invalid_request_error" and "object" in e["message"], (path, e)


def test_a_compressed_body_is_read_whole_or_refused(server):
    """A gzip body cut before its trailer, or followed by bytes, is refused
    by name (aiohttp's own inflating let the cut one through); deflate in
    both its forms is read; an unknown encoding is a 415; a small body that
    inflates past the cap is a 413."""
    import zlib

    doc = json.dumps({"content": "Hello world"}).encode()
    whole = gzip.compress(doc)
    for raw, says in [(whole[:-4], "before its end"), (whole + b"extra", "bytes follow")]:
        status, _, out = http(server.url + "/tokenize", raw=raw, headers={"Content-Encoding": "gzip"})
        assert status == 400 and says.encode() in out, out
    raw_deflate = zlib.compressobj(wbits=-15)
    for body in (zlib.compress(doc), raw_deflate.compress(doc) + raw_deflate.flush()):
        status, _, out = http(server.url + "/tokenize", raw=body, headers={"Content-Encoding": "deflate"})
        assert status == 200 and json.loads(out)["tokens"], out
    status, _, out = http(server.url + "/tokenize", raw=doc, headers={"Content-Encoding": "br"})
    assert status == 415 and b"br" in out
    bomb = gzip.compress(b'{"content": "' + b"a" * (64 << 20) + b'"}')
    status, _, out = http(server.url + "/tokenize", raw=bomb, headers={"Content-Encoding": "gzip"})
    assert status == 413, out
