"""ember on a GPU against ember on the CPU, and against llama.cpp on the same
device where a GPU build of its llama-bench is given: pp (a prompt of -p
tokens) and tg (-n tokens decoded after it), in tokens a second.

    python benches/gpu_bench.py [-m FILE ...] [-p 512] [-n 128] [-d 0] [-ctk f16|q8_0] [--device NAME]
                                [--llama-bench PATH_TO_A_VULKAN_OR_CUDA_BUILD]

Each pp and tg is measured from an empty cache, or after -d tokens already
in it, as llama-bench's are, with a cache of -ctk's type (keys and values
alike: llama-bench gets -ctk and -ctv, and -fa 1, which its quantized
values need).

ember's figures come from `rust/model/examples/device_bench.rs` (built here
with cargo, release), which runs the device pass and the CPU pass on the same
file in one process. llama-bench runs with -ngl 99 (every layer on the
device). On Mesa's lavapipe (a Vulkan device on the CPU) the figures only say
that the path runs. Not a test: it takes minutes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from compare_llamacpp import _run, default_models, physical_cores

ROOT = Path(__file__).resolve().parent.parent


def device_bench(model: Path, pp: int, tg: int, depth: int, kv: str, device: str | None) -> dict:
    cmd = ["cargo", "run", "--quiet", "--release", "-p", "ember-model", "--example", "device_bench", "--",
           str(model), "-p", str(pp), "-n", str(tg), "-d", str(depth), "-ctk", kv, "--json"]
    if device:
        cmd += ["--device", device]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"gpu_bench: device_bench failed on {model.name}:\n{out.stderr.strip()[-2000:]}")
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--models", nargs="+", type=Path, help="GGUF files (default: the two test models)")
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("-d", "--n-depth", type=int, default=0, help="tokens already in the cache")
    ap.add_argument("-ctk", "--cache-type", default="f16", choices=["f16", "q8_0"],
                    help="the cache's type, keys and values alike (default f16)")
    ap.add_argument("--device", help="the device to run on (Vulkan0, ...; default: the first card)")
    ap.add_argument("--llama-bench", type=Path, help="a GPU build of llama.cpp's llama-bench, run with -ngl 99")
    a = ap.parse_args(argv)
    if a.n_prompt < 1 or a.n_gen < 1 or a.n_depth < 0:
        ap.error("-p and -n must be >= 1, -d >= 0")
    if a.llama_bench and not a.llama_bench.is_file():
        ap.error(f"--llama-bench {a.llama_bench}: no such file")
    models = a.models or default_models()
    missing = [m for m in models if not m.is_file()]
    if missing:
        ap.error("missing model file(s): " + ", ".join(map(str, missing)) + " (python tests/fetch_test_models.py)")
    rows = []
    for model in models:
        r = device_bench(model, a.n_prompt, a.n_gen, a.n_depth, a.cache_type, a.device)
        peer = {}
        if a.llama_bench:
            for test, (p, n) in (("pp", (a.n_prompt, 0)), ("tg", (0, a.n_gen))):
                peer[test] = llama_rate_on_device(a.llama_bench, model, p, n, a.n_depth, a.cache_type)
        rows.append((model.name, r, peer))
        print(f"{model.name}: {json.dumps(r)}", file=sys.stderr, flush=True)
    device = rows[0][1]["device"] + " (" + rows[0][1]["description"] + ")"
    print(f"device: {device}; CPU threads {rows[0][1]['threads']}")
    head = "| model | test | ember on the device t/s | ember on the CPU t/s |"
    print(head + (" llama.cpp on the device t/s | ember/llama.cpp |" if a.llama_bench else ""))
    print("| --- | --- | ---: | ---: |" + (" ---: | ---: |" if a.llama_bench else ""))
    for name, r, peer in rows:
        for test, n in (("pp", r["pp"]), ("tg", r["tg"])):
            ours = r[f"device_{test}_ts"]
            at = (f" @ d{a.n_depth}" if a.n_depth else "") + (f" ({a.cache_type} cache)" if a.cache_type != "f16" else "")
            line = f"| {name} | {test}{n}{at} | {ours:.1f} | {r[f'cpu_{test}_ts']:.1f} |"
            if peer:
                line += f" {peer[test]:.1f} | {ours / peer[test]:.2f}x |"
            print(line)
    return 0


def llama_rate_on_device(binary: Path, model: Path, n_prompt: int, n_gen: int, depth: int, kv: str) -> float:
    cache = ["-ctk", kv, "-ctv", kv, "-fa", "1"] if kv != "f16" else []
    out = _run([str(binary), "-m", str(model), "-p", str(n_prompt), "-n", str(n_gen), "-d", str(depth), "-ngl", "99",
                "-t", str(physical_cores()), "-r", "3", "-o", "json", *cache], "llama-bench")
    objs = [o for o in json.loads(out[out.find("["):]) if o.get("n_prompt") == n_prompt and o.get("n_gen") == n_gen]
    if len(objs) != 1:
        raise SystemExit(f"gpu_bench: no pp{n_prompt}/tg{n_gen} result in llama-bench's output:\n{out}")
    return float(objs[0]["avg_ts"])


if __name__ == "__main__":
    sys.exit(main())
