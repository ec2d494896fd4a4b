"""`ember.download` on its own, against servers on loopback the test makes:
a credential goes only to the host it was given for, a server that ignores
ranges gets the file fetched whole again, and bytes held that are longer
than the server's file are not taken for it."""

from __future__ import annotations

import http.server
import json
import threading

import pytest

from ember.download import DownloadError, download, partial_path

DATA = bytes(range(256)) * 300


class _Server:
    """A loopback HTTP server of one handler; `seen` records (path, headers)."""

    def __init__(self, respond):
        self.seen: list[tuple[str, dict]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                outer.seen.append((self.path, dict(self.headers)))
                respond(self)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def _whole(h, data=DATA):
    h.send_response(200)
    h.send_header("Content-Length", str(len(data)))
    h.end_headers()
    h.wfile.write(data)


@pytest.fixture
def servers():
    made = []
    yield lambda respond: made.append(_Server(respond)) or made[-1]
    for s in made:
        s.close()


def test_a_credential_is_not_sent_on_to_another_host(servers, tmp_path):
    files = servers(_whole)
    hub = servers(lambda h: (h.send_response(302), h.send_header("Location", files.url + "/blob"),
                             h.send_header("Content-Length", "0"), h.end_headers()))
    download(hub.url + "/model.gguf", tmp_path / "m.gguf", headers={"Authorization": "Bearer secret"})
    assert (tmp_path / "m.gguf").read_bytes() == DATA
    assert hub.seen[0][1].get("Authorization") == "Bearer secret"
    assert files.seen and "Authorization" not in files.seen[0][1], files.seen


def test_a_server_that_ignores_ranges_sends_the_whole_file_and_it_is_taken_whole(servers, tmp_path):
    server = servers(_whole)
    target = tmp_path / "m.gguf"
    url = server.url + "/m.gguf"
    partial_path(target).write_bytes(b"x" * 1000)  # bytes of this URL, as a cut run leaves them
    partial_path(target).with_name(partial_path(target).name + ".json").write_text(
        json.dumps({"url": url, "validator": ""}))
    download(url, target)
    assert server.seen[0][1].get("Range") == "bytes=1000-"
    assert target.read_bytes() == DATA


def test_bytes_held_for_another_url_are_not_continued(servers, tmp_path):
    server = servers(_whole)
    target = tmp_path / "m.gguf"
    partial_path(target).write_bytes(b"x" * 1000)  # no note of where they came from
    download(server.url + "/m.gguf", target)
    assert "Range" not in server.seen[0][1]
    assert target.read_bytes() == DATA


def test_a_checksum_that_does_not_match_lands_nothing(servers, tmp_path):
    server = servers(_whole)
    target = tmp_path / "m.gguf"
    with pytest.raises(DownloadError, match="does not match the checksum listed for it"):
        download(server.url + "/m.gguf", target, sha256="0" * 64)
    assert not list(tmp_path.iterdir())


def test_a_refusal_names_the_status(servers, tmp_path):
    server = servers(lambda h: (h.send_response(403), h.send_header("Content-Length", "0"), h.end_headers()))
    with pytest.raises(DownloadError, match="the server answered 403"):
        download(server.url + "/m.gguf", tmp_path / "m.gguf")


def test_bytes_held_past_the_end_of_the_servers_file_are_fetched_again(servers, tmp_path):
    def respond(h):
        if h.headers.get("Range"):
            h.send_response(416)
            h.send_header("Content-Range", f"bytes */{len(DATA)}")
            h.send_header("Content-Length", "0")
            h.end_headers()
        else:
            _whole(h)

    server = servers(respond)
    target = tmp_path / "m.gguf"
    url = server.url + "/m.gguf"
    partial_path(target).write_bytes(b"x" * (len(DATA) + 10))
    partial_path(target).with_name(partial_path(target).name + ".json").write_text(
        json.dumps({"url": url, "validator": ""}))
    download(url, target)
    assert [h.get("Range") for _, h in server.seen] == [f"bytes={len(DATA) + 10}-", None]
    assert target.read_bytes() == DATA
