"""The chat page at `/` over HTTP: a browser's request gets the page and an
Ollama client's probe its line; the page's files are public and nothing
else is; --no-webui and --path. (The page at work in a browser:
test_webui_browser.py.)"""

from __future__ import annotations

import json
import os

import pytest

from server_process import ServerProcess, http

HTML = {"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}


def test_a_browser_gets_the_page_and_a_client_probing_the_root_gets_ollama_s_line(plain_server):
    for accept in (HTML, {"Accept": "*/*"}):  # a browser, and curl as llama-server's users call it
        status, headers, body = http(plain_server.url + "/", headers=accept)
        assert status == 200 and headers["Content-Type"].startswith("text/html")
        assert b'<script src="/webui/app.js"' in body
        policy = headers["Content-Security-Policy"]
        assert "script-src 'self'" in policy and "connect-src 'self'" in policy and "frame-ancestors 'none'" in policy
    # Ollama's clients ask for JSON (its Python client) or name nothing.
    for accept in ({}, {"Accept": "application/json"}, {"Accept": "text/plain"}):
        status, headers, body = http(plain_server.url + "/", headers=accept)
        assert status == 200 and body == b"Ollama is running (ember)", (accept, body)


@pytest.mark.parametrize("name, kind", [("app.js", "text/javascript"), ("style.css", "text/css"),
                                        ("vendor/marked.min.js", "text/javascript"),
                                        ("vendor/purify.js", "text/javascript"),
                                        ("vendor/marked.LICENSE", "text/plain")])
def test_the_page_s_files_ship_with_the_package(plain_server, name, kind):
    status, headers, body = http(plain_server.url + "/webui/" + name)
    assert status == 200 and headers["Content-Type"].startswith(kind) and len(body) > 500


@pytest.mark.parametrize("path", ["/webui/__init__.py", "/webui/../cli.py", "/webui/%2e%2e/cli.py",
                                  "/webui/vendor", "/webui/index.html.bak"])
def test_only_the_page_s_own_files_are_served(plain_server, path):
    assert http(plain_server.url + path)[0] == 404


@pytest.fixture(scope="module")
def keyed(smollm2_path):
    with ServerProcess(smollm2_path, "--api-key", "sekrit") as s:
        yield s


def test_with_a_key_the_page_is_public_and_the_api_is_not(keyed):
    assert http(keyed.url + "/", headers=HTML)[0] == 200
    assert http(keyed.url + "/webui/app.js")[0] == 200
    assert http(keyed.url + "/props")[0] == 401
    assert http(keyed.url + "/webui/nothing.js")[0] == 401, "a path that is not the page's is the key's first"
    assert http(keyed.url + "/", headers={"Accept": "application/json"})[0] == 401, "the probe is an API route"
    assert http(keyed.url + "/props", headers={"Authorization": "Bearer sekrit"})[0] == 200


def test_no_webui_leaves_only_the_line(smollm2_path):
    with ServerProcess(smollm2_path, "--no-webui") as s:
        for accept in (HTML, {"Accept": "*/*"}):  # 404, as llama-server's --no-webui
            assert http(s.url + "/", headers=accept)[0] == 404
        status, _, body = http(s.url + "/", headers={"Accept": "application/json"})
        assert status == 200 and body == b"Ollama is running (ember)"
        assert http(s.url + "/webui/app.js")[0] == 404


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("site")
    www = root / "www"
    (www / "docs").mkdir(parents=True)
    (www / "index.html").write_text("<h1>mine</h1>")
    (www / "docs" / "a.txt").write_text("a text")
    (www / ".env").write_text("SECRET=1")
    (root / "outside.txt").write_text("not to be served")
    os.symlink(root / "outside.txt", www / "link.txt")
    return www


def test_path_serves_the_user_s_files_and_nothing_beyond_them(smollm2_path, site):
    with ServerProcess(smollm2_path, "--path", str(site), "--api-key", "k") as s:
        status, headers, body = http(s.url + "/", headers=HTML)
        assert status == 200 and body == b"<h1>mine</h1>" and headers["Content-Type"].startswith("text/html")
        assert http(s.url + "/docs/a.txt")[2] == b"a text"
        for path in ("/.env", "/link.txt", "/docs/../../outside.txt", "/docs/%2e%2e/%2e%2e/outside.txt",
                     "/docs/", "/webui/app.js", "/missing.html"):
            status, _, body = http(s.url + path)
            assert status in (401, 404) and b"not to be served" not in body and b"SECRET" not in body, path
        # The API is still the key's.
        assert http(s.url + "/v1/models")[0] == 401
        models = http(s.url + "/v1/models", headers={"Authorization": "Bearer k"})
        assert models[0] == 200 and json.loads(models[2])["object"] == "list"
