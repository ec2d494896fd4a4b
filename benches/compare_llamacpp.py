"""ember against llama.cpp's llama-bench on the same GGUF files, the same
thread count and the same tests (ppN: read N prompt tokens; tgN: generate N
tokens), alternating one run of each so both share the machine's noise.

    python benches/compare_llamacpp.py [-m FILE ...] [--threads T] [-p 512] [-n 128] [-r 3]
                                       [-d 0,1024,4096] [-ctk f16|bf16|q8_0] [--llama-bench PATH] [--cache DIR]
                                       [--ik-llama-bench PATH]

-d measures each test after that many tokens are already in the context
(llama-bench's --n-depth, passed to it as given). --ik-llama-bench adds a
third column: ik_llama.cpp's llama-bench, built by hand, run with flash
attention on (-fa 1), its fastest path at depth. It has no -d: at a depth its
tg is `-gp DEPTH,N`, and its pp is the window read at DEPTH in the sweep of
its llama-sweep-bench, when that is built beside it (else derived from the
times of two prompts, DEPTH and DEPTH + N tokens, each from an empty cache).

llama-bench is built once from the llama-cpp-python source package (which
vendors llama.cpp) into the cache, with native CPU flags; --llama-bench names
a binary to use instead. Nothing of llama.cpp lives in this repository.

For tg the table adds the limit: the fastest decode this machine allows, the
bytes a token reads (every weight once, and the keys and values its queries see
at the test's middle token) over the bytes a second the threads re-read a
buffer of that size (memory's rate, or a last-level cache's that holds it),
both from `ember bench`'s run, and ember's share of it. For pp the limit is
the prompt's products alone: the multiply-adds of its attention's scores and
weighed values (every query head against every position its row sees) at the
most a second the threads issue in the instruction that meets the cache (the
widest fused multiply-add of floats; AVX-512 BF16's paired product for a bf16
cache where the kernels use it; none for Q8_0), and those of its weights (each
meets every token once, the head the last) at the most a second in the
instruction that takes their 8-bit activations, everything else in the pass
taken as free.

Each repetition is one `ember bench -r 1` process and one `llama-bench -r 1`
process per test; both do one untimed warm-up run of the test before the timed
one. The table gives the mean over the repetitions and the ratio ember/llama.cpp,
and each run's ratio against ik_llama.cpp where it is given (else llama.cpp).
Not a test: it takes minutes, and the first run builds llama.cpp.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
MODELS = ["SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"]

# Configure options for a CPU-only, static, llama-bench-only build. Those the
# vendored tree does not declare (renamed or removed between versions) are left out.
CMAKE_OPTIONS = {
    "CMAKE_BUILD_TYPE": "Release",
    "GGML_NATIVE": "ON",
    "LLAMA_CURL": "OFF",
    "LLAMA_OPENSSL": "OFF",
    "LLAMA_BUILD_COMMON": "ON",
    "LLAMA_BUILD_TESTS": "OFF",
    "LLAMA_BUILD_EXAMPLES": "OFF",
    "LLAMA_BUILD_SERVER": "OFF",
    "LLAMA_BUILD_APP": "OFF",
    "LLAMA_BUILD_TOOLS": "ON",
    "BUILD_SHARED_LIBS": "OFF",
}
_ALWAYS = {"CMAKE_BUILD_TYPE", "CMAKE_C_FLAGS", "CMAKE_CXX_FLAGS"}

# The vendored llama.cpp's AMX matrix path (compiled in by native flags where
# the CPU reports AMX) dies with a segmentation fault in
# ggml_backend_amx_mul_mat on both test models, on a CPU whose AMX tiles work
# (a tile multiply-add run by hand gives the right sums). There llama-bench is
# built without AMX, in a build directory of its own: its AVX-512 kernels,
# the path it has that runs.
NO_AMX_FLAGS = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- the machine ---------------------------------------------------------------
def physical_cores() -> int:
    """Distinct (physical id, core id) pairs in /proc/cpuinfo, else the logical count."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return os.cpu_count() or 1
    cores, phys = set(), "0"
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "physical id":
            phys = value
        elif key == "core id":
            cores.add((phys, value))
    return len(cores) or os.cpu_count() or 1


def cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("flags", "Features"):
                return set(value.split())
    except OSError:
        pass
    return set()


def cpu_summary() -> str:
    model, flags = "unknown CPU", cpu_flags()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
                break
    except OSError:
        pass
    wanted = ["avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
              "avx_vnni", "amx_int8", "asimd", "asimddp", "sve"]
    have = [f for f in wanted if f in flags]
    return f"{model}; {os.cpu_count()} logical CPUs, {physical_cores()} physical cores; " \
           f"flags: {' '.join(have) if have else 'none of ' + '/'.join(wanted[:6])}"


# -- llama-bench ----------------------------------------------------------------
def _lower_priority() -> None:
    os.nice(19)


def _run_build_step(cmd: list[str], cwd: Path | None = None) -> None:
    log("$ " + " ".join(cmd))
    # The build's chatter goes to stderr, so stdout carries the results alone.
    r = subprocess.run(cmd, cwd=cwd, preexec_fn=_lower_priority, stdout=sys.stderr)
    if r.returncode != 0:
        raise SystemExit(f"compare_llamacpp: failed ({r.returncode}): {' '.join(cmd)}")


def find_cmake() -> str:
    cmake = shutil.which("cmake")
    if cmake:
        return cmake
    scripts = Path(sysconfig.get_path("scripts")) / "cmake"
    if not scripts.is_file():
        log("cmake is not on PATH: installing it into this Python environment (pip install cmake)")
        _run_build_step([sys.executable, "-m", "pip", "install", "-q", "cmake"])
    if scripts.is_file():
        return str(scripts)
    cmake = shutil.which("cmake")
    if not cmake:
        raise SystemExit("compare_llamacpp: cmake is still not found after `pip install cmake`")
    return cmake


def declared_options(src: Path) -> set[str]:
    """Names that the tree's CMakeLists.txt files declare with option(...)."""
    names = set()
    for f in [src / "CMakeLists.txt", src / "ggml" / "CMakeLists.txt"]:
        if not f.is_file():
            continue
        for line in f.read_text(errors="replace").splitlines():
            line = line.strip()
            if line.startswith("option("):
                names.add(line[len("option("):].split()[0].rstrip(")"))
    return names


def build_llama_tool(target: str, cache: Path, version: str, jobs: int, options: dict[str, str] | None = None,
                     build_dir: str = "build") -> Path:
    """<cache>/<build_dir>/bin/<target>, building that llama.cpp target on first use.

    The llama-cpp-python source package is fetched and unpacked into `cache`
    once; `options` (default CMAKE_OPTIONS) configure `cache/build_dir`. Builds
    with different options need different build directories."""
    binary = cache / build_dir / "bin" / target
    if binary.is_file():
        return binary
    cache.mkdir(parents=True, exist_ok=True)
    log(f"building {target} from llama-cpp-python {version} into {cache} (once; minutes)")
    sdist = cache / f"llama_cpp_python-{version}.tar.gz"
    if not sdist.is_file():
        # --no-binary names the package alone: `:all:` would also force its build
        # tools (cmake among them) to compile from source while pip reads the metadata.
        _run_build_step([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-python",
                         f"llama-cpp-python=={version}", "-d", str(cache)])
    if not sdist.is_file():
        found = sorted(cache.glob("llama_cpp_python-*.tar.gz"))
        if not found:
            raise SystemExit(f"compare_llamacpp: no source package of llama-cpp-python {version} in {cache}")
        sdist = found[-1]
    root = cache / sdist.name[: -len(".tar.gz")]
    if not root.is_dir():
        log(f"unpacking {sdist.name}")
        with tarfile.open(sdist) as tar:
            tar.extractall(cache, filter="data") if hasattr(tarfile, "data_filter") else tar.extractall(cache)
    src = root / "vendor" / "llama.cpp"
    if not (src / "CMakeLists.txt").is_file():
        raise SystemExit(f"compare_llamacpp: {src} holds no llama.cpp source tree")
    declared = declared_options(src)
    defs = []
    for name, value in (CMAKE_OPTIONS if options is None else options).items():
        if name in _ALWAYS or name in declared:
            defs.append(f"-D{name}={value}")
        else:
            log(f"(llama.cpp at this version has no option {name}; not passed)")
    cmake = find_cmake()
    build = cache / build_dir
    _run_build_step([cmake, "-S", str(src), "-B", str(build), *defs])
    _run_build_step([cmake, "--build", str(build), "--target", target, "-j", str(jobs)])
    if not binary.is_file():
        found = list(build.rglob(target))
        found = [f for f in found if f.is_file() and os.access(f, os.X_OK)]
        if not found:
            raise SystemExit(f"compare_llamacpp: the build produced no {target} under {build}")
        return found[0]
    return binary


def build_llama_bench(cache: Path, version: str, jobs: int) -> Path:
    """<cache>/build/bin/llama-bench, building it on first use (without AMX,
    in build-noamx, where the CPU has it: see NO_AMX_FLAGS)."""
    if "amx_int8" in cpu_flags():
        options = {**CMAKE_OPTIONS, "CMAKE_C_FLAGS": NO_AMX_FLAGS, "CMAKE_CXX_FLAGS": NO_AMX_FLAGS}
        return build_llama_tool("llama-bench", cache, version, jobs, options, build_dir="build-noamx")
    return build_llama_tool("llama-bench", cache, version, jobs)


# -- one run of each -------------------------------------------------------------
def _run(cmd: list[str], what: str, stderr_too: bool = False) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        tail = (r.stderr or r.stdout).strip().splitlines()[-5:]
        raise SystemExit(f"compare_llamacpp: {what} failed ({r.returncode}): {' '.join(cmd)}\n" + "\n".join(tail))
    return r.stdout + r.stderr if stderr_too else r.stdout


def ember_rate(model: Path, n_prompt: int, n_gen: int, threads: int, depth: int = 0,
               kv: str = "f16") -> tuple[float, float | None]:
    """ember's rate, and its limit: for tg the fastest decode the machine
    allows (the bytes a token reads against the bytes a second its threads
    stream), for pp the prompt's attention and weight products at their instructions' peaks,
    as `ember bench` measures them in the same run."""
    out = _run([sys.executable, "-m", "ember", "bench", "-m", str(model), "-p", str(n_prompt), "-n", str(n_gen),
                "-t", str(threads), "-r", "1", "-d", str(depth), "-ctk", kv, "--json"], "ember bench")
    objs = [json.loads(line) for line in out.splitlines() if line.strip().startswith("{")]
    if len(objs) != 1:
        raise SystemExit(f"compare_llamacpp: ember bench printed {len(objs)} results, expected 1:\n{out}")
    return float(objs[0]["avg_ts"]), objs[0].get("limit_ts")


def llama_rate(binary: Path, model: Path, n_prompt: int, n_gen: int, threads: int, depth: int = 0, kv: str = "f16",
               flash: bool = False) -> float:
    extra = ["-d", str(depth)] if depth else []
    if kv != "f16":
        extra += ["-ctk", kv, "-ctv", kv]
    # A value cache of another type than f16 needs llama.cpp's flash attention.
    if flash or kv != "f16":
        extra += ["-fa", "1"]
    out = _run([str(binary), "-m", str(model), "-p", str(n_prompt), "-n", str(n_gen), "-t", str(threads),
                "-r", "1", "-o", "json", *extra], "llama-bench")
    start = out.find("[")
    objs = json.loads(out[start:]) if start >= 0 else []
    objs = [o for o in objs if o.get("n_prompt") == n_prompt and o.get("n_gen") == n_gen
            and o.get("n_depth", 0) == depth]
    if len(objs) != 1:
        raise SystemExit(f"compare_llamacpp: cannot find the pp{n_prompt}/tg{n_gen} result in llama-bench's output:\n{out}")
    return float(objs[0]["avg_ts"])


def ik_rate(binary: Path, model: Path, n_prompt: int, n_gen: int, threads: int, depth: int = 0,
            kv: str = "f16") -> float:
    """ik_llama.cpp's llama-bench, flash attention on. It has no -d: at a
    depth, tg is its `-gp DEPTH,N` (N tokens timed after a prompt of DEPTH)
    and pp is what its llama-sweep-bench (built beside it) times for the
    window of N tokens read at DEPTH; without that tool, pp is derived from
    two prompts, DEPTH and DEPTH + N, each read from an empty cache: N
    tokens over the difference of their times (noisy: a small difference of
    two large times)."""
    if not depth:
        return llama_rate(binary, model, n_prompt, n_gen, threads, 0, kv, flash=True)
    cache = ["-ctk", kv, "-ctv", kv] if kv != "f16" else []

    def run(args: list[str]) -> list[dict]:
        out = _run([str(binary), "-m", str(model), "-t", str(threads), "-r", "1", "-o", "json", "-fa", "1",
                    *cache, *args], "ik_llama.cpp's llama-bench")
        start = out.find("[")
        return json.loads(out[start:]) if start >= 0 else []

    if n_gen:
        objs = [o for o in run(["-p", "0", "-n", "0", "-gp", f"{depth},{n_gen}"]) if o.get("n_gen") == n_gen]
        if len(objs) != 1:
            raise SystemExit(f"compare_llamacpp: no tg{n_gen} at depth {depth} in ik_llama.cpp's output")
        return float(objs[0]["avg_ts"])
    sweep = binary.with_name("llama-sweep-bench")
    if sweep.is_file():
        # Its sweep reads a window of N prompt tokens at each depth 0, N, 2N, ... in turn.
        out = _run([str(sweep), "-m", str(model), "-t", str(threads), "-c", str(depth + n_prompt), "-ub", str(n_prompt),
                    "-b", str(n_prompt), "-fa", "1", "--output-format", "jsonl", *cache],
                   "ik_llama.cpp's llama-sweep-bench", stderr_too=True)  # it writes its results to both
        rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        at = [o for o in rows if o.get("n_kv") == depth and o.get("pp") == n_prompt]
        if len(at) != 1:
            raise SystemExit(f"compare_llamacpp: no pp{n_prompt} at n_kv {depth} in llama-sweep-bench's output:\n{out}")
        return float(at[0]["speed_pp"])
    seconds = {}
    for o in run(["-p", f"{depth},{depth + n_prompt}", "-n", "0"]):
        seconds[o.get("n_prompt")] = o["n_prompt"] / float(o["avg_ts"])
    if set(seconds) != {depth, depth + n_prompt}:
        raise SystemExit(f"compare_llamacpp: ik_llama.cpp's prompts of {depth} and {depth + n_prompt} are not both there")
    return n_prompt / (seconds[depth + n_prompt] - seconds[depth])


def default_models() -> list[Path]:
    env = os.environ.get("EMBER_TEST_MODELS")
    d = Path(env) if env else Path.home() / ".cache" / "ember" / "models"
    return [d / name for name in MODELS]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--models", nargs="+", type=Path, help="GGUF files (default: the two test models)")
    ap.add_argument("-t", "--threads", type=int, default=0, help="threads for both (default: physical cores)")
    ap.add_argument("-p", "--n-prompt", type=int, default=512, help="prompt tokens of the pp test (0: skip it)")
    ap.add_argument("-n", "--n-gen", type=int, default=128, help="generated tokens of the tg test (0: skip it)")
    ap.add_argument("-r", "--repetitions", type=int, default=3, help="alternating runs of each engine per test")
    ap.add_argument("-d", "--n-depth", default="0", help="tokens already in the context, comma-separated (0,4096)")
    ap.add_argument("-ctk", "--cache-type", default="f16", choices=["f16", "bf16", "q8_0"],
                    help="KV cache type for all")
    ap.add_argument("--ik-llama-bench", type=Path, help="ik_llama.cpp's llama-bench, run with -fa 1 as a third column")
    ap.add_argument("--llama-bench", type=Path, help="an existing llama-bench binary (skips the build)")
    ap.add_argument("--cache", type=Path, help="where llama-bench is built (default: ~/.cache/ember/llama-bench/VERSION)")
    ap.add_argument("--llama-cpp-python-version", default=LLAMA_CPP_PYTHON_VERSION,
                    help=f"llama-cpp-python source package to build from (default {LLAMA_CPP_PYTHON_VERSION})")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1, help="parallel jobs of the build")
    a = ap.parse_args(argv)
    if a.n_prompt < 0 or a.n_gen < 0 or (a.n_prompt == 0 and a.n_gen == 0):
        ap.error("-p and -n must be >= 0, and not both 0")
    if a.repetitions < 1:
        ap.error("-r must be >= 1")
    try:
        depths = [int(d) for d in a.n_depth.split(",")]
    except ValueError:
        ap.error(f"-d {a.n_depth}: expected depths such as 0,1024,4096")
    if any(d < 0 for d in depths):
        ap.error("-d: depths must be >= 0")
    if a.ik_llama_bench and not a.ik_llama_bench.is_file():
        ap.error(f"--ik-llama-bench {a.ik_llama_bench}: no such file")
    threads = a.threads or physical_cores()
    models = a.models or default_models()
    missing = [m for m in models if not m.is_file()]
    if missing:
        ap.error("missing model file(s): " + ", ".join(map(str, missing)) + " (python tests/fetch_test_models.py)")

    print(f"CPU: {cpu_summary()}", flush=True)
    if a.llama_bench:
        binary = a.llama_bench
        if not binary.is_file():
            ap.error(f"--llama-bench {binary}: no such file")
    else:
        cache = a.cache or Path.home() / ".cache" / "ember" / "llama-bench" / a.llama_cpp_python_version
        binary = build_llama_bench(cache, a.llama_cpp_python_version, a.jobs)
    from ember import _native

    print(f"llama-bench: {binary}", flush=True)
    print(f"ember kernels: {_native.simd_level()}; threads {threads}; mean t/s over {a.repetitions} alternating "
          f"run(s), each after a warm-up", flush=True)
    tests = [(a.n_prompt, 0)] * bool(a.n_prompt) + [(0, a.n_gen)] * bool(a.n_gen)
    kv = a.cache_type
    rows = []
    for model in models:
        for depth in depths:
            for n_prompt, n_gen in tests:
                name = (f"pp{n_prompt}" if n_prompt else f"tg{n_gen}") + (f" @ d{depth}" if depth else "")
                ours, theirs, ik, limits = [], [], [], []
                for rep in range(a.repetitions):
                    rate, limit = ember_rate(model, n_prompt, n_gen, threads, depth, kv)
                    ours.append(rate)
                    if limit is not None:
                        limits.append(limit)
                    theirs.append(llama_rate(binary, model, n_prompt, n_gen, threads, depth, kv))
                    line = (f"{model.name} {name} run {rep + 1}/{a.repetitions}: ember {ours[-1]:.1f} t/s, "
                            f"llama.cpp {theirs[-1]:.1f} t/s")
                    if a.ik_llama_bench:
                        ik.append(ik_rate(a.ik_llama_bench, model, n_prompt, n_gen, threads, depth, kv))
                        line += f", ik_llama.cpp -fa 1 {ik[-1]:.1f} t/s"
                    if limit is not None:
                        line += f" (limit {limit:.1f} t/s)"
                    log(line)
                e, l = statistics.fmean(ours), statistics.fmean(theirs)
                # Each run's ratio against ik_llama.cpp where it ran (else llama.cpp), side by side: on a host
                # whose speed changes between runs, the spread says what the mean hides.
                runs = " ".join(f"{o / p:.2f}" for o, p in zip(ours, ik or theirs))
                rows.append((model.name, name, e, l, e / l, statistics.fmean(ik) if ik else None,
                             statistics.fmean(limits) if limits else None, runs))

    w = max([len("model")] + [len(r[0]) for r in rows])
    tw = max(len(r[1]) for r in rows)
    ik_head = f" {'ik_llama.cpp -fa 1 t/s':>22} | {'ember/ik':>8} |" if a.ik_llama_bench else ""
    ik_rule = f" {'-' * 21}: | {'-' * 7}: |" if a.ik_llama_bench else ""
    runs_head = "ember/ik each run" if a.ik_llama_bench else "ember/llama.cpp each run"
    rw = max([len(runs_head)] + [len(r[7]) for r in rows])
    print()
    # tg's limit: the bytes a token reads over the bytes a second both threads stream;
    # pp's: the attention and weight products at their instructions' peaks.
    print(f"| {'model':<{w}} | {'test':>{tw}} | {'ember t/s':>10} | {'llama.cpp t/s':>13} | {'ember/llama.cpp':>15} |"
          + ik_head + f" {'limit t/s':>9} | {'ember/limit':>11} | {runs_head:>{rw}} |")
    print(f"| {'-' * w} | {'-' * (tw - 1)}: | {'-' * 9}: | {'-' * 12}: | {'-' * 14}: |" + ik_rule
          + f" {'-' * 8}: | {'-' * 10}: | {'-' * (rw - 1)}: |")
    for name, test, e, l, ratio, k, limit, runs in rows:
        ik_cells = f" {k:22.2f} | {e / k:7.2f}x |" if k is not None else ""
        limit_cells = f" {limit:9.1f} | {e / limit:10.0%} |" if limit else f" {'':>9} | {'':>11} |"
        print(f"| {name:<{w}} | {test:>{tw}} | {e:10.2f} | {l:13.2f} | {ratio:14.2f}x |" + ik_cells + limit_cells
              + f" {runs:>{rw}} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
