"""Aggregate generation throughput of `ember serve` under C concurrent clients,
and of llama.cpp's llama-server in the same run, on the same GGUF files,
thread count, slot count and context.

    python benches/serve_bench.py [-m FILE ...] [--clients 1,2,4,8] [-r 2] [-n 64]
                                  [--parallel 4] [-c 4096] [--threads T]
                                  [--llama-server PATH | --no-llama] [--cache DIR]

For each model, one server is started (ember first, then llama-server; never
both at once) and, for each client count C, R rounds are run: in a round C
threads each send one greedy /v1/completions request (`ignore_eos`, max_tokens
N) with a prompt of its own, distinct in every round so no prompt cache can
answer it whole. A round's aggregate rate is the completion tokens of all its
replies over its wall time, from the first send to the last reply; the table
gives the mean over the rounds, and the gain of C=4 over C=1 (what batching
the slots together buys).

llama-server is built once from the llama-cpp-python source package, in the
cache compare_llamacpp.py uses (a build directory of its own), with native CPU
flags; --llama-server names a binary to use instead. If it cannot be built,
the reason is printed and ember is measured alone.
Not a test: it takes minutes, and the first run builds llama.cpp.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import queue
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare_llamacpp as llamacpp  # noqa: E402  (the shared build of llama.cpp tools)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from server_process import wait_listening  # noqa: E402  (how the tests find ember's listening line)

ROOT = Path(__file__).resolve().parents[1]

# llama-server needs the server target; its web page is neither built (npm)
# nor downloaded, so the build runs offline.
SERVER_CMAKE_OPTIONS = {
    **llamacpp.CMAKE_OPTIONS,
    "LLAMA_BUILD_SERVER": "ON",
    "LLAMA_BUILD_UI": "OFF",
    "LLAMA_USE_PREBUILT_UI": "OFF",
}
SERVER_BUILD_DIR = "build-server"

TOPICS = [
    "the migration of arctic terns", "how suspension bridges carry load", "the history of the printing press",
    "fermentation in bread dough", "tides and the moon", "the rules of chess openings", "volcanic islands",
    "how compilers optimise loops", "coral reef ecosystems", "the invention of the telescope",
    "winter beekeeping", "the physics of a bicycle", "desert water harvesting", "medieval trade routes",
    "the life of a lighthouse keeper", "why the sky is blue", "paper making by hand", "glaciers and valleys",
]
STYLES = ["a short essay", "a letter to a friend", "a news report", "a children's story", "a field guide entry",
          "a travel diary page", "a lecture introduction", "a product review"]

log = llamacpp.log
_running: set["Server"] = set()


@atexit.register
def _stop_all() -> None:
    # A last resort for a server whose stop() was itself interrupted.
    for server in list(_running):
        server.proc.kill()


# -- one server process ------------------------------------------------------------
class Server:
    """A server process in a process group of its own, drained of output, ready
    once /health answers 200; stop() sends SIGTERM, then kills on a timeout."""

    def __init__(self, name: str, cmd: list[str], url: str | None = None, timeout: float = 300.0):
        self.name, self.lines = name, []
        self._lines: queue.Queue = queue.Queue()
        log("$ " + " ".join(cmd))
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     errors="replace", cwd=ROOT, start_new_session=True)
        _running.add(self)
        # Both pipes drained: a full pipe would block the server mid-request.
        for stream in (self.proc.stderr, self.proc.stdout):
            threading.Thread(target=self._drain, args=(stream,), daemon=True).start()
        try:
            self.url = url or self._wait_listening(timeout)
            self._wait_healthy(timeout)
        except BaseException:
            self.stop()
            raise

    def _drain(self, stream) -> None:
        for line in stream:
            self.lines.append(line.rstrip("\n"))
            self._lines.put(line)

    def _tail(self) -> str:
        return "\n".join(self.lines[-20:])

    def _wait_listening(self, timeout: float) -> str:
        url = wait_listening(self._lines, self.proc, timeout)
        if url is None:
            raise RuntimeError(f"{self.name} never said where it listens:\n{self._tail()}")
        return url

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}) before it was ready:\n{self._tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except urllib.error.HTTPError as e:
                if e.code != 503:  # 503: still loading
                    raise RuntimeError(f"{self.name}: /health answered {e.code}") from None
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} never became healthy:\n{self._tail()}")

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log(f"{self.name} did not stop within {timeout:.0f} s of SIGTERM: killing it")
                self.proc.kill()
                self.proc.wait()
        _running.discard(self)

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ember(model: Path, a: argparse.Namespace) -> Server:
    return Server("ember serve", [sys.executable, "-m", "ember.cli", "serve", "-m", str(model),
                                  "-np", str(a.parallel), "--port", "0", "-t", str(a.threads),
                                  "-c", str(a.ctx_size)])


def start_llama(binary: Path, model: Path, a: argparse.Namespace) -> Server:
    port = free_port()
    return Server("llama-server", [str(binary), "-m", str(model), "-np", str(a.parallel), "-cb",
                                   "-c", str(a.ctx_size), "-t", str(a.threads), "--host", "127.0.0.1",
                                   "--port", str(port)], url=f"http://127.0.0.1:{port}")


# -- the clients -------------------------------------------------------------------
def prompt(clients: int, rnd: int, client: int) -> str:
    k = clients * 131 + rnd * 17 + client
    topic, style = TOPICS[k % len(TOPICS)], STYLES[(k // len(TOPICS)) % len(STYLES)]
    return (f"Request {clients}-{rnd}-{client}: write {style} about {topic}, "
            f"mentioning the number {1000 + 37 * k} once.\n\n")


def post(url: str, route: str, body: dict, timeout: float = 600) -> dict:
    """The JSON reply of one request; a refusal is a RuntimeError naming the route."""
    req = urllib.request.Request(url + route, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"{route} answered {e.code}: {e.read()[:300]!r}") from None


def complete(url: str, text: str, n_gen: int) -> int:
    """Completion tokens of one greedy /v1/completions request."""
    body = {"prompt": text, "max_tokens": n_gen, "temperature": 0, "ignore_eos": True, "stream": False}
    return int(post(url, "/v1/completions", body)["usage"]["completion_tokens"])


def run_round(url: str, clients: int, rnd: int, n_gen: int) -> tuple[float, int, float]:
    """(aggregate t/s, completion tokens, wall seconds) of C concurrent requests."""
    start = threading.Barrier(clients + 1)
    tokens, ends, errors = [0] * clients, [0.0] * clients, []

    def client(i: int) -> None:
        try:
            start.wait()
            tokens[i] = complete(url, prompt(clients, rnd, i), n_gen)
            ends[i] = time.perf_counter()
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"a client failed: {errors[0]}")
    total, wall = sum(tokens), max(ends) - t0
    if total != clients * n_gen:
        log(f"  (expected {clients * n_gen} completion tokens, got {total})")
    return total / wall, total, wall


def measure(name: str, url: str, model: Path, a: argparse.Namespace) -> dict[int, float]:
    """Mean aggregate t/s per client count, after one untimed warm-up request."""
    complete(url, "Warm-up: say something about the weather.\n\n", min(a.n_gen, 8))
    out = {}
    for c in a.clients:
        rates = []
        for rnd in range(a.rounds):
            rate, total, wall = run_round(url, c, rnd, a.n_gen)
            rates.append(rate)
            log(f"{model.name} {name} C={c} round {rnd + 1}/{a.rounds}: {total} tokens in {wall:.2f} s "
                f"= {rate:.1f} t/s")
        out[c] = statistics.fmean(rates)
    return out


# -- the table ---------------------------------------------------------------------
def _fmt(v: float | None, width: int, suffix: str = "") -> str:
    return f"{v:{width - len(suffix)}.2f}{suffix}" if v is not None else f"{'-':>{width}}"


def print_tables(results: list[tuple[str, dict[int, float], dict[int, float] | None]], clients: list[int]) -> None:
    w = max([len("model")] + [len(name) for name, _, _ in results])
    print()
    print(f"| {'model':<{w}} | {'clients':>7} | {'ember t/s':>10} | {'llama-server t/s':>16} | {'ember/llama-server':>18} |")
    print(f"| {'-' * w} | {'-' * 6}: | {'-' * 9}: | {'-' * 15}: | {'-' * 17}: |")
    for name, ours, theirs in results:
        for c in clients:
            e = ours.get(c)
            l = theirs.get(c) if theirs else None
            ratio = e / l if e is not None and l else None
            print(f"| {name:<{w}} | {c:>7} | {_fmt(e, 10)} | {_fmt(l, 16)} | {_fmt(ratio, 18, 'x')} |")
    if 1 in clients and 4 in clients:
        print()
        print(f"| {'model':<{w}} | {'ember C=4 / C=1':>15} | {'llama-server C=4 / C=1':>22} |")
        print(f"| {'-' * w} | {'-' * 14}: | {'-' * 21}: |")
        for name, ours, theirs in results:
            e = ours[4] / ours[1] if ours.get(1) else None
            l = theirs[4] / theirs[1] if theirs and theirs.get(1) else None
            print(f"| {name:<{w}} | {_fmt(e, 15, 'x')} | {_fmt(l, 22, 'x')} |")


def _terminate(signum, frame):
    # SIGTERM unwinds like Ctrl-C, so the servers are stopped on the way out.
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--models", nargs="+", type=Path, help="GGUF files (default: the two test models)")
    ap.add_argument("--clients", default="1,2,4,8", help="comma-separated concurrent client counts (default 1,2,4,8)")
    ap.add_argument("-r", "--rounds", type=int, default=2, help="rounds per client count (default 2)")
    ap.add_argument("-n", "--n-gen", type=int, default=64, help="max_tokens of each request (default 64)")
    ap.add_argument("-np", "--parallel", type=int, default=4, help="server slots (default 4)")
    ap.add_argument("-c", "--ctx-size", type=int, default=4096, help="server context, cut among the slots (default 4096)")
    ap.add_argument("-t", "--threads", type=int, default=0, help="server threads for both (default: physical cores)")
    ap.add_argument("--llama-server", type=Path, help="an existing llama-server binary (skips the build)")
    ap.add_argument("--no-llama", action="store_true", help="measure ember alone")
    ap.add_argument("--cache", type=Path, help="where llama.cpp is built (default: ~/.cache/ember/llama-bench/VERSION)")
    ap.add_argument("--llama-cpp-python-version", default=llamacpp.LLAMA_CPP_PYTHON_VERSION,
                    help=f"llama-cpp-python source package to build from (default {llamacpp.LLAMA_CPP_PYTHON_VERSION})")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1, help="parallel jobs of the build")
    a = ap.parse_args(argv)
    try:
        a.clients = [int(c) for c in a.clients.split(",") if c.strip()]
    except ValueError:
        ap.error(f"--clients {a.clients!r}: expected comma-separated integers")
    if not a.clients or min(a.clients) < 1:
        ap.error("--clients: each count must be >= 1")
    if a.rounds < 1 or a.n_gen < 1 or a.parallel < 1:
        ap.error("-r, -n and -np must be >= 1")
    a.threads = a.threads or llamacpp.physical_cores()
    models = a.models or llamacpp.default_models()
    missing = [m for m in models if not m.is_file()]
    if missing:
        ap.error("missing model file(s): " + ", ".join(map(str, missing)) + " (python tests/fetch_test_models.py)")
    if a.llama_server and not a.llama_server.is_file():
        ap.error(f"--llama-server {a.llama_server}: no such file")
    signal.signal(signal.SIGTERM, _terminate)

    print(f"CPU: {llamacpp.cpu_summary()}", flush=True)
    binary = None
    if a.no_llama:
        pass
    elif a.llama_server:
        binary = a.llama_server
    else:
        cache = a.cache or Path.home() / ".cache" / "ember" / "llama-bench" / a.llama_cpp_python_version
        try:
            binary = llamacpp.build_llama_tool("llama-server", cache, a.llama_cpp_python_version, a.jobs,
                                               SERVER_CMAKE_OPTIONS, SERVER_BUILD_DIR)
        except SystemExit as e:
            print(f"llama-server: cannot build it ({e}); measuring ember alone", flush=True)
    print(f"llama-server: {binary or 'not measured'}", flush=True)
    print(f"servers: -np {a.parallel} -c {a.ctx_size} -t {a.threads}; requests: greedy, ignore_eos, "
          f"max_tokens {a.n_gen}; clients {','.join(map(str, a.clients))}; mean over {a.rounds} round(s)", flush=True)

    results = []
    try:
        for model in models:
            with start_ember(model, a) as server:
                ours = measure("ember", server.url, model, a)
            theirs = None
            if binary:
                try:
                    with start_llama(binary, model, a) as server:
                        theirs = measure("llama-server", server.url, model, a)
                except RuntimeError as e:
                    print(f"llama-server on {model.name}: {e}", flush=True)
            results.append((model.name, ours, theirs))
    except KeyboardInterrupt:
        log("interrupted; the servers are stopped")
        if not results:
            return 130
    print_tables(results, a.clients)
    return 0


if __name__ == "__main__":
    sys.exit(main())
