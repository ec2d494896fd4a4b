"""A model hub on loopback, for the tests of `-hf` and `ember pull`: an
aiohttp app speaking the routes `huggingface_hub` calls (a repository's
listing with its files' checksums, HEAD and ranged GET of a file), serving
files the test gives it. It can cut a download after some bytes (the next
requests resume it) and list a wrong checksum; it records the ranges asked
for. No test reaches a real hub."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from dataclasses import dataclass, field

from aiohttp import web


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Cut:
    """The file's bytes stop at `at` for the next `times` downloads."""

    at: int
    times: int


@dataclass
class MockHub:
    #: repository -> file name -> bytes
    repos: dict[str, dict[str, bytes]]
    #: (repository, file) -> a sha256 the listing gives instead of the right one
    wrong_sha256: dict[tuple[str, str], str] = field(default_factory=dict)
    cuts: dict[tuple[str, str], Cut] = field(default_factory=dict)
    #: (file, Range header or None) of every GET of a file
    gets: list[tuple[str, str | None]] = field(default_factory=list)
    url: str = ""

    def commit(self, repo: str) -> str:
        return hashlib.sha1(repo.encode()).hexdigest()

    def _listing(self, request: web.Request) -> web.Response:
        repo = f"{request.match_info['owner']}/{request.match_info['name']}"
        files = self.repos.get(repo)
        if files is None:
            return web.json_response({"error": "Repository not found"}, status=404,
                                     headers={"X-Error-Code": "RepoNotFound"})
        siblings = []
        for name, data in sorted(files.items()):
            s = {"rfilename": name, "size": len(data), "blobId": git_blob_id(data)}
            if name.endswith(".gguf"):
                sha = self.wrong_sha256.get((repo, name), hashlib.sha256(data).hexdigest())
                s["lfs"] = {"sha256": sha, "size": len(data), "pointerSize": 134}
            siblings.append(s)
        return web.json_response({"id": repo, "modelId": repo, "sha": self.commit(repo), "private": False,
                                  "siblings": siblings, "tags": ["gguf"]})

    def _file(self, request: web.Request) -> tuple[str, str, bytes] | None:
        repo = f"{request.match_info['owner']}/{request.match_info['name']}"
        name = request.match_info["path"]
        data = self.repos.get(repo, {}).get(name)
        return (repo, name, data) if data is not None else None

    def _headers(self, repo: str, name: str, data: bytes) -> dict:
        etag = hashlib.sha256(data).hexdigest() if name.endswith(".gguf") else git_blob_id(data)
        h = {"X-Repo-Commit": self.commit(repo), "ETag": f'"{etag}"', "Accept-Ranges": "bytes"}
        if name.endswith(".gguf"):
            h["X-Linked-Etag"] = f'"{etag}"'
            h["X-Linked-Size"] = str(len(data))
        return h

    async def _head(self, request: web.Request) -> web.Response:
        found = self._file(request)
        if found is None:
            return web.Response(status=404, headers={"X-Error-Code": "EntryNotFound"})
        repo, name, data = found
        return web.Response(headers={**self._headers(repo, name, data), "Content-Length": str(len(data))})

    async def _get(self, request: web.Request) -> web.StreamResponse:
        found = self._file(request)
        if found is None:
            return web.Response(status=404, headers={"X-Error-Code": "EntryNotFound"})
        repo, name, data = found
        rng = request.headers.get("Range")
        self.gets.append((name, rng))
        if rng and request.headers.get("If-Range", self._headers(repo, name, data)["ETag"]) != \
                self._headers(repo, name, data)["ETag"]:
            rng = None  # the file changed since the bytes held were sent: all of it again, as HTTP says
        start = int(rng.split("=")[1].split("-")[0]) if rng else 0
        resp = web.StreamResponse(status=206 if rng else 200, headers=self._headers(repo, name, data))
        resp.content_length = len(data) - start
        if rng:
            resp.headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        await resp.prepare(request)
        cut = self.cuts.get((repo, name))
        if cut is not None and cut.times > 0:
            cut.times -= 1
            for at in range(start, max(start, cut.at), 1 << 16):  # as a network delivers it: piece by piece
                await resp.write(data[at:min(at + (1 << 16), cut.at)])
                await asyncio.sleep(0.001)
            await asyncio.sleep(0.05)
            request.transport.close()  # the connection drops mid-file
            return resp
        await resp.write(data[start:])
        await resp.write_eof()
        return resp

    def app(self) -> web.Application:
        app = web.Application()
        for suffix in ("", "/revision/{rev}"):
            app.router.add_get("/api/models/{owner}/{name}" + suffix, lambda r: asyncio.sleep(0, self._listing(r)))
        app.router.add_route("HEAD", "/{owner}/{name}/resolve/{rev}/{path:.+}", self._head)
        app.router.add_get("/{owner}/{name}/resolve/{rev}/{path:.+}", self._get, allow_head=False)
        return app

    def __enter__(self) -> "MockHub":
        started = threading.Event()
        self._loop = asyncio.new_event_loop()

        async def serve():
            self._runner = web.AppRunner(self.app(), access_log=None)
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
            started.set()

        def run():
            self._loop.run_until_complete(serve())
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        assert started.wait(10), "the mock hub did not start"
        return self

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
