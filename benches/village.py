"""golem's village: what state checkpoints are worth to a hybrid model on one
slot, for `ember serve` and llama.cpp's llama-server in the same run, on the
same GGUF file with the same flags.

    python benches/village.py [-m FILE] [--sheet 1200] [--rounds 2] [--threads T]
                              [--llama-server PATH | --no-llama] [--cache DIR]

Five characters take turns on a single slot (`-np 1`). Each is asked a
prompt that starts with the same long sheet (the village and its people)
and then says what is happening now, which is new every time. A recurrent
state cannot be cut back to where the sheet ends, so without checkpoints
every turn is read from zero; with them, a turn after the first two
resumes from the copy taken where the sheet ends. Each server runs with
`--ctx-checkpoints 0` and with its default, and the table gives the prompt
tokens it read (the replies' `timings.prompt_n`) and the time of all the
turns, one after another.

The default model is the random-weight Qwen3.5-shaped file that
benches/make_bench_models.py writes (qwen35-0.8b.q4_0.gguf). llama-server
is built as serve_bench.py builds it. Not a test: it takes minutes.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare_llamacpp as llamacpp  # noqa: E402
import serve_bench  # noqa: E402  (the server processes and the llama-server build)

log = llamacpp.log

PEOPLE = ["the miller", "the baker", "the smith", "the weaver", "the shepherd"]
PLACES = ["the mill race", "the square", "the forge", "the loom house", "the high pasture", "the old bridge",
          "the chapel", "the orchard", "the well", "the granary"]
HABITS = ["rises before dawn", "keeps a ledger of every favour", "sings while working", "distrusts strangers",
          "trades in gossip", "fears the river in spring", "hoards copper coins", "tells the same three stories"]


def sheet(words: int) -> str:
    """The village and its people: one long text every turn starts with."""
    lines = ["The sheet of the village of Hollowmere. Every character below must stay true to it.", ""]
    i = 0
    while sum(len(line.split()) for line in lines) < words:
        who, where = PEOPLE[i % len(PEOPLE)], PLACES[(i * 3) % len(PLACES)]
        habit = HABITS[(i * 5) % len(HABITS)]
        lines.append(f"Note {i + 1}: {who} is often seen near {where}, {habit}, and owes {i % 7 + 1} "
                     f"favours to {PEOPLE[(i + 2) % len(PEOPLE)]}.")
        i += 1
    return "\n".join(lines) + "\n\n"


def now(who: int, rnd: int) -> str:
    """What is happening now: new for every turn."""
    return (f"Now, on day {rnd + 1}, a peddler arrives at {PLACES[(who + rnd) % len(PLACES)]} with news of "
            f"{['a flood', 'a wedding', 'a fever', 'a fair', 'a theft'][(who * 2 + rnd) % 5]}. "
            f"Speaking as {PEOPLE[who]}, answer the peddler in one sentence.\n{PEOPLE[who].title()}:")


def ask(url: str, text: str, n_gen: int) -> dict:
    body = {"prompt": text, "n_predict": n_gen, "temperature": 0, "cache_prompt": True, "stream": False}
    return serve_bench.post(url, "/completion", body, timeout=1800)


def village(name: str, url: str, a: argparse.Namespace) -> dict:
    """Every turn of every round, one after another: prompt tokens read,
    the time of all turns, and the median turn."""
    text = sheet(a.sheet)
    read, waits = [], []
    for rnd in range(a.rounds):
        for who in range(len(PEOPLE)):
            t0 = time.perf_counter()
            reply = ask(url, text + now(who, rnd), a.n_gen)
            waits.append(time.perf_counter() - t0)
            read.append(int(reply["timings"]["prompt_n"]))
            log(f"{name} round {rnd + 1} {PEOPLE[who]}: read {read[-1]} of {reply['tokens_evaluated']} "
                f"prompt tokens in {waits[-1]:.2f} s")
    return {"read": sum(read), "later": statistics.median(read[2:]), "total": sum(waits),
            "median": statistics.median(waits)}


def run(start, name: str, extra: list[str], a: argparse.Namespace) -> dict | None:
    try:
        with start(extra) as server:
            return village(name, server.url, a)
    except RuntimeError as e:
        print(f"{name}: {e}", flush=True)
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_model = Path.home() / ".cache" / "ember" / "bench-models" / "qwen35-0.8b.q4_0.gguf"
    ap.add_argument("-m", "--model", type=Path, default=default_model)
    ap.add_argument("--sheet", type=int, default=900, help="words of the shared sheet (default 900)")
    ap.add_argument("--rounds", type=int, default=2, help="turns of each of the five characters (default 2)")
    ap.add_argument("-n", "--n-gen", type=int, default=8, help="tokens drawn per turn (default 8)")
    ap.add_argument("-c", "--ctx-size", type=int, default=8192)
    ap.add_argument("--threads", type=int, default=0, help="threads of both servers (default: physical cores)")
    ap.add_argument("--llama-server", type=Path, help="an existing llama-server binary (skips the build)")
    ap.add_argument("--no-llama", action="store_true", help="measure ember alone")
    ap.add_argument("--cache", type=Path, help="where llama.cpp is built (default ~/.cache/ember/llama-bench/VERSION)")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1, help="parallel jobs of the build")
    a = ap.parse_args(argv)
    if not a.model.is_file():
        ap.error(f"--model {a.model}: no such file (python benches/make_bench_models.py writes the default)")
    if a.rounds < 1 or a.n_gen < 1 or a.sheet < 1:
        ap.error("--rounds, -n and --sheet must be >= 1")
    a.threads = a.threads or llamacpp.physical_cores()
    signal.signal(signal.SIGTERM, serve_bench._terminate)

    print(f"CPU: {llamacpp.cpu_summary()}", flush=True)
    binary = None
    if a.llama_server:
        binary = a.llama_server
    elif not a.no_llama:
        cache = a.cache or Path.home() / ".cache" / "ember" / "llama-bench" / llamacpp.LLAMA_CPP_PYTHON_VERSION
        try:
            binary = llamacpp.build_llama_tool("llama-server", cache, llamacpp.LLAMA_CPP_PYTHON_VERSION, a.jobs,
                                               serve_bench.SERVER_CMAKE_OPTIONS, serve_bench.SERVER_BUILD_DIR)
        except SystemExit as e:
            print(f"llama-server: cannot build it ({e}); measuring ember alone", flush=True)
    print(f"model: {a.model}; servers: -np 1 -c {a.ctx_size} -t {a.threads}; five characters x {a.rounds} "
          f"round(s), a sheet of {a.sheet} words, {a.n_gen} tokens drawn greedily per turn", flush=True)

    common = ["-np", "1", "-c", str(a.ctx_size), "-t", str(a.threads)]

    def ember(extra: list[str]):
        return serve_bench.Server("ember serve", [sys.executable, "-m", "ember.cli", "serve", "-m", str(a.model),
                                                  "--port", "0", *common, *extra])

    def llama(extra: list[str]):
        port = serve_bench.free_port()
        return serve_bench.Server("llama-server", [str(binary), "-m", str(a.model), "--host", "127.0.0.1",
                                                   "--port", str(port), *common, *extra],
                                  url=f"http://127.0.0.1:{port}")

    rows = []
    try:
        for label, extra in (("--ctx-checkpoints 0", ["--ctx-checkpoints", "0"]), ("default", [])):
            rows.append((f"ember, {label}", run(ember, f"ember {label}", extra, a)))
            if binary:
                rows.append((f"llama-server, {label}", run(llama, f"llama-server {label}", extra, a)))
    except KeyboardInterrupt:
        log("interrupted; the servers are stopped")
    print()
    print("| server, checkpoints | prompt tokens read | median read, turns 3+ | all turns (s) | median turn (s) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for label, r in rows:
        if r is None:
            print(f"| {label} | - | - | - | - |")
        else:
            print(f"| {label} | {r['read']} | {r['later']:.0f} | {r['total']:.1f} | {r['median']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
