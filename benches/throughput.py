"""Prompt processing (pp) and text generation (tg) rates, as llama-bench
measures them, for ember and for llama.cpp on the same file in the same run.

    python benches/throughput.py [--models DIR] [--threads 2] [--pp 512] [--tg 128] [--reps 3]
                                 [--peer-python PYTHON]

The peer is llama.cpp through llama-cpp-python: imported here if installed, or
run by the interpreter named with --peer-python (a virtual environment where
llama-cpp-python was built from source with native CPU flags). Each figure is
the median of --reps runs after one warm-up run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

MODELS = ["SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"]

# Runs inside the peer's interpreter: prints {"pp": [seconds...], "tg": [seconds...]}.
PEER_SCRIPT = r"""
import json, sys, time
from llama_cpp import Llama
path, threads, n_pp, n_tg, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
llm = Llama(model_path=path, n_ctx=max(n_pp, n_tg) + 16, n_batch=512, n_ubatch=512, n_threads=threads,
            n_threads_batch=threads, verbose=False)
bos = llm.token_bos()
prompt = [(bos + 1 + i * 7919) % llm.n_vocab() for i in range(n_pp)]
out = {"pp": [], "tg": []}
for r in range(reps + 1):
    llm.reset()
    t = time.perf_counter(); llm.eval(prompt); dt = time.perf_counter() - t
    if r: out["pp"].append(dt)
    llm.reset()
    tok = bos
    t = time.perf_counter()
    for _ in range(n_tg):
        llm.eval([tok])
    dt = time.perf_counter() - t
    if r: out["tg"].append(dt)
print(json.dumps(out))
"""


def models_dir(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    env = os.environ.get("EMBER_TEST_MODELS")
    return Path(env) if env else Path.home() / ".cache" / "ember" / "models"


def bench_ember(path: Path, threads: int, n_pp: int, n_tg: int, reps: int) -> dict:
    from ember import _native

    m = _native.Model(str(path), max(n_pp, n_tg) + 16, threads)
    bos = m.bos_id if m.bos_id is not None else 1
    prompt = [(bos + 1 + i * 7919) % m.n_vocab for i in range(n_pp)]
    out = {"pp": [], "tg": []}
    for r in range(reps + 1):
        pp = m.bench_prompt(prompt)
        tg = m.bench_generation(bos, n_tg)
        if r:
            out["pp"].append(pp)
            out["tg"].append(tg)
    return out


def bench_peer(path: Path, threads: int, n_pp: int, n_tg: int, reps: int, python: str | None) -> dict | None:
    if python is None:
        try:
            import llama_cpp  # noqa: F401
        except ImportError:
            return None
        python = sys.executable
    r = subprocess.run([python, "-c", PEER_SCRIPT, str(path), str(threads), str(n_pp), str(n_tg), str(reps)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        print(f"peer failed on {path.name}: {r.stderr.strip()[-400:]}", file=sys.stderr)
        return None
    return json.loads(r.stdout.strip().splitlines()[-1])


def rate(n: int, seconds: list[float]) -> float:
    return n / statistics.median(seconds)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--peer-python", default=os.environ.get("EMBER_PEER_PYTHON"))
    a = ap.parse_args()
    d = models_dir(a.models)
    print(f"threads {a.threads}, pp{a.pp} / tg{a.tg}, median of {a.reps} runs, tokens/s")
    print(f"{'model':<34} {'test':<6} {'ember':>9} {'llama.cpp':>10} {'ratio':>7}")
    for name in MODELS:
        path = d / name
        if not path.is_file():
            print(f"{name}: missing (python tests/fetch_test_models.py)", file=sys.stderr)
            continue
        ours = bench_ember(path, a.threads, a.pp, a.tg, a.reps)
        peer = bench_peer(path, a.threads, a.pp, a.tg, a.reps, a.peer_python)
        for test, n in [("pp", a.pp), ("tg", a.tg)]:
            e = rate(n, ours[test])
            p = rate(n, peer[test]) if peer else None
            ps = f"{p:10.1f}" if p else f"{'-':>10}"
            ratio = f"{e / p:6.2f}x" if p else f"{'-':>7}"
            print(f"{name:<34} {test}{n:<4} {e:9.1f} {ps} {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
