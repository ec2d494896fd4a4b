"""A real `ember serve` process for the HTTP tests: started on a free port,
ready once /health answers 200, stopped with SIGTERM; its stderr is kept so
a test can read the per-request log lines."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

_LISTENING = re.compile(r"listening on (http://\S+)")
ROOT = Path(__file__).resolve().parents[1]


def wait_listening(lines: queue.Queue, proc: subprocess.Popen, timeout: float) -> str | None:
    """The URL from `ember serve`'s listening line among the output lines
    drained into ``lines``; None if the process ends or the time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.2)
        except queue.Empty:
            if proc.poll() is not None:
                return None
            continue
        m = _LISTENING.search(line)
        if m:
            return m.group(1).rstrip("/")
    return None


class ServerProcess:
    def __init__(self, model: str | os.PathLike | None, *extra: str, ctx: int = 2048, timeout: float = 120.0,
                 env: dict[str, str] | None = None):
        """`model` None: the flags in `extra` name it (-hf); `env` is the
        process's whole environment (default: this one's)."""
        chosen = ["-m", str(model)] if model is not None else []
        cmd = [sys.executable, "-m", "ember", "serve", *chosen, "--port", "0", "-c", str(ctx), *extra]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                                     env=env)
        self.lines: list[str] = []
        self._lines: queue.Queue = queue.Queue()
        # Both pipes drained in threads: a full pipe would block the server mid-request.
        for stream in (self.proc.stderr, self.proc.stdout):
            threading.Thread(target=self._drain, args=(stream,), daemon=True).start()
        #: the address it listens at, and where its routes are (below --api-prefix's path, where given)
        self.root = self._wait_listening(timeout)
        self.url = self.root + (extra[extra.index("--api-prefix") + 1] if "--api-prefix" in extra else "")
        self._wait_healthy(timeout)

    def _drain(self, stream) -> None:
        for line in stream:
            self.lines.append(line.rstrip("\n"))
            self._lines.put(line)

    def _wait_listening(self, timeout: float) -> str:
        url = wait_listening(self._lines, self.proc, timeout)
        if url is None:
            self.stop()
            raise RuntimeError("the server never said where it listens:\n" + "\n".join(self.lines))
        return url

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except urllib.error.HTTPError as e:
                if e.code != 503:
                    raise
            except OSError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("the server never became healthy:\n" + "\n".join(self.lines))

    def saw(self, text: str, timeout: float = 10.0) -> bool:
        """Whether a line holding `text` was printed, waiting for it a while:
        a request's log line is written after its reply is sent."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(text in line for line in self.lines):
                return True
            time.sleep(0.02)
        return False

    def stop(self, timeout: float = 15.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


# -- raw HTTP, shared by the server tests ---------------------------------------------

def http(url: str, body=None, *, method: str | None = None, headers: dict | None = None, raw: bytes | None = None):
    """(status, headers, body) of one request; HTTP errors are answers, not exceptions."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def post_ok(server, path: str, body: dict) -> dict:
    """The JSON reply of a request that must succeed."""
    status, _, raw = http(server.url + path, body)
    assert status == 200, raw
    return json.loads(raw)


def error_of(reply, status: int) -> dict:
    """The error object of a reply that must carry `status`, in the envelope's own code too."""
    got, _, body = reply
    assert got == status, body
    e = json.loads(body)["error"]
    assert e["code"] == status
    return e


def sse(body: bytes) -> list:
    """The events of a server-sent-events body, `[DONE]` kept as the string."""
    out = []
    for block in body.decode().split("\n\n"):
        if block.startswith("data: "):
            data = block[6:]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def thought_and_answer(raw: bytes, stream: bool) -> tuple[str, str]:
    """A chat completion's reasoning_content and content, whole or rebuilt
    from a stream's deltas."""
    if not stream:
        m = json.loads(raw)["choices"][0]["message"]
        return m.get("reasoning_content") or "", m.get("content") or ""
    deltas = [e["choices"][0]["delta"] for e in sse(raw) if isinstance(e, dict) and e.get("choices")]
    return ("".join(d.get("reasoning_content") or "" for d in deltas),
            "".join(d.get("content") or "" for d in deltas))
