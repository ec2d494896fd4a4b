"""A soak of `ember serve`: mixed traffic for a bounded time, clients that
leave at random mid-stream, and the server's resident memory, open files and
threads sampled along the way, so a leak shows as a rise. By hand:

    python3 benches/soak.py --minutes 30 [-m MODEL] [--clients 4]

Prints one line per sample and a summary (first and last figures)."""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from server_process import ServerProcess  # noqa: E402

CHAT = [{"role": "user", "content": "Tell me about the sea, the wind and the stars."}]


def _post(url: str, body: dict, timeout: float = 120) -> int:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        e.read()
        return e.code


def _leave_mid_stream(url: str, rng: random.Random) -> None:
    host, port = url.split("//")[1].split(":")
    body = json.dumps({"messages": CHAT, "max_tokens": 200, "stream": True, "ignore_eos": True}).encode()
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        for _ in range(rng.randint(1, 6)):
            if not s.recv(4096):
                break


def client(url: str, stop: float, seed: int, counts: dict, lock: threading.Lock) -> None:
    rng = random.Random(seed)
    while time.monotonic() < stop:
        kind = rng.choice(["chat", "stream-leave", "completion", "messages", "ollama", "tokenize", "bad"])
        try:
            if kind == "chat":
                status = _post(url + "/v1/chat/completions", {"messages": CHAT, "max_tokens": rng.randint(1, 40)})
            elif kind == "stream-leave":
                _leave_mid_stream(url, rng)
                status = 0
            elif kind == "completion":
                status = _post(url + "/completion", {"prompt": "Once upon a time" * rng.randint(1, 20),
                                                     "n_predict": rng.randint(1, 30)})
            elif kind == "messages":
                status = _post(url + "/v1/messages", {"messages": CHAT, "max_tokens": rng.randint(1, 30)})
            elif kind == "ollama":
                status = _post(url + "/api/chat", {"messages": CHAT, "stream": False,
                                                   "options": {"num_predict": rng.randint(1, 30)}})
            elif kind == "tokenize":
                status = _post(url + "/tokenize", {"content": "hello " * rng.randint(1, 200)})
            else:
                status = _post(url + "/v1/chat/completions", {"messages": "not a list"})
        except OSError:
            status = -1
        with lock:
            counts[(kind, status)] = counts.get((kind, status), 0) + 1


def figures(pid: int) -> tuple[int, int, int]:
    """(resident KiB, open files, threads) of process `pid`."""
    status = Path(f"/proc/{pid}/status").read_text()
    rss = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))
    threads = int(next(line.split()[1] for line in status.splitlines() if line.startswith("Threads:")))
    return rss, len(os.listdir(f"/proc/{pid}/fd")), threads


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default=os.path.expanduser("~/.cache/ember/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--every", type=float, default=30.0, help="seconds between samples")
    args = ap.parse_args()
    with ServerProcess(args.model, "-np", "2", ctx=2048) as s:
        pid = s.proc.pid
        stop = time.monotonic() + args.minutes * 60
        counts: dict = {}
        lock = threading.Lock()
        threads = [threading.Thread(target=client, args=(s.url, stop, i, counts, lock), daemon=True)
                   for i in range(args.clients)]
        for t in threads:
            t.start()
        samples = []
        t0 = time.monotonic()
        while time.monotonic() < stop:
            samples.append((time.monotonic() - t0, *figures(pid)))
            print(f"{samples[-1][0]:7.0f} s  rss {samples[-1][1] / 1024:7.1f} MiB  fds {samples[-1][2]:4d}  "
                  f"threads {samples[-1][3]:3d}", flush=True)
            time.sleep(min(args.every, max(0.0, stop - time.monotonic())))
        for t in threads:
            t.join(180)
        time.sleep(2)
        samples.append((time.monotonic() - t0, *figures(pid)))
        log = "\n".join(s.lines)
    total = sum(counts.values())
    print(f"requests: {total}; by kind and status: "
          + ", ".join(f"{k} {st}: {n}" for (k, st), n in sorted(counts.items())))
    print(f"5xx: {sum(n for (_, st), n in counts.items() if st >= 500)}; tracebacks in the log: "
          f"{log.count('Traceback')}")
    (first, last) = samples[1] if len(samples) > 2 else samples[0], samples[-1]
    print(f"after warm-up ({first[0]:.0f} s): rss {first[1] / 1024:.1f} MiB, fds {first[2]}, threads {first[3]}; "
          f"at the end ({last[0]:.0f} s): rss {last[1] / 1024:.1f} MiB, fds {last[2]}, threads {last[3]}")


if __name__ == "__main__":
    main()
