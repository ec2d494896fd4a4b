"""llama.cpp's own server test suite (tools/server/tests in llama-cpp-python's
source package) run against ember-server and against llama-server, with the
suite's hub models mapped to the two local test models, and the two results
set side by side: how many tests pass on each, and every test one passes and
the other fails.

    python3 benches/llama_server_suite.py --source DIR/llama_cpp_python-0.3.36 \\
        --llama-server BUILD/bin/llama-server [--files test_basic.py ...] [-k EXPR]
        [--save OUT.json] [--llama-results EARLIER.json]

Needs the suite's requirements beside ember's test extras (prometheus-client,
wget, filelock, requests). The suite starts a server per test through
LLAMA_SERVER_BIN_PATH; this file is that program too (`--as-server`): it
replaces the suite's model flags (`--hf-repo`, `--hf-file`, `--model-url`)
with `-m` and a local file (Gemma 3 270M for the suite's Gemma, SmolLM2 for
the rest) and runs the server asked for with everything else as given.
Nothing reaches a hub. Most of the suite's assertions hold its own models'
words; those fail on both servers alike, and the comparison says so.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = Path(os.environ.get("EMBER_TEST_MODELS") or Path.home() / ".cache" / "ember" / "models")
SMOLLM2 = MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3 = MODELS / "gemma-3-270m-q4_k_m.gguf"
#: The files the issue names, in the suite's unit/ folder.
FILES = ["test_basic.py", "test_chat_completion.py", "test_completion.py", "test_tokenize.py", "test_security.py",
         "test_metrics.py", "test_ignore_eos.py", "test_stream.py", "test_slot_save.py", "test_compat_anthropic.py",
         "test_compat_oai_responses.py", "test_tool_call.py"]
_MODEL_FLAGS = {"--hf-repo", "-hf", "-hfr", "--hf-file", "-hff", "--model-url", "-mu", "--model", "-m"}


def mapped_args(args: list[str]) -> list[str]:
    """The server's arguments with the suite's model replaced by a local one."""
    out, model = [], SMOLLM2
    it = iter(args)
    for a in it:
        if a in _MODEL_FLAGS:
            value = next(it, "")
            if "gemma" in value.lower():
                model = GEMMA3
            continue
        out.append(a)
    return ["-m", str(model), *out]


def as_server(which: str, llama_server: str, args: list[str]) -> int:
    argv = mapped_args(args)
    if which == "ember":
        cmd = [sys.executable, "-m", "ember", "serve", *argv]
    else:
        cmd = [llama_server, *argv]
    os.execvp(cmd[0], cmd)
    return 127


def run_suite(which: str, source: Path, llama_server: str, files: list[str], keyword: str | None,
              work: Path) -> dict[str, str]:
    """Each test's outcome (passed, failed, error, skipped) on one server."""
    # Laid out as in llama.cpp's tree: the suite names chat templates by their path from it
    # (../../../models/templates/...).
    tree = work / f"suite-{which}"
    suite = tree / "tools" / "server" / "tests"
    shutil.copytree(source / "vendor" / "llama.cpp" / "tools" / "server" / "tests", suite)
    (tree / "models").symlink_to(source / "vendor" / "llama.cpp" / "models", target_is_directory=True)
    # The suite starts every preset once first, only to fetch its model from the hub; the mapped
    # models are local, so that step goes (for both servers alike).
    conftest = suite / "conftest.py"
    conftest.write_text(conftest.read_text().replace("ServerPreset.load_all()", "pass  # models mapped to local files"))
    wrapper = work / f"server-{which}"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} {Path(__file__).resolve()} --as-server {which} "
                       f"--llama-server {llama_server} -- \"$@\"\n")
    wrapper.chmod(0o755)
    report = work / f"{which}.xml"
    env = {**os.environ, "LLAMA_SERVER_BIN_PATH": str(wrapper), "LLAMA_CACHE": str(work / "cache")}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
           *[f"unit/{f}" for f in files]]
    if keyword:
        cmd += ["-k", keyword]
    print(f"{which}: {' '.join(cmd[3:])}", flush=True)
    subprocess.run(cmd, cwd=suite, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    outcomes = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        kinds = [child.tag for child in case]
        outcomes[name] = ("failed" if "failure" in kinds else "error" if "error" in kinds
                          else "skipped" if "skipped" in kinds else "passed")
        if outcomes[name] in ("failed", "error"):
            node = next(c for c in case if c.tag in ("failure", "error"))
            outcomes[name] += ": " + re.sub(r"\s+", " ", (node.get("message") or "")[:160])
    return outcomes


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--as-server", choices=["ember", "llama"], help=argparse.SUPPRESS)
    p.add_argument("--source", type=Path, help="llama-cpp-python's unpacked source package")
    p.add_argument("--llama-server", default="llama-server", help="llama.cpp's llama-server binary")
    p.add_argument("--files", nargs="*", default=FILES, help="the suite's test files (default: the issue's twelve)")
    p.add_argument("-k", dest="keyword", help="pytest's -k, to run a part")
    p.add_argument("--save", type=Path, help="write both servers' outcomes to this JSON file")
    p.add_argument("--llama-results", type=Path,
                   help="llama-server's outcomes from an earlier --save, instead of running it again")
    p.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.as_server:
        return as_server(a.as_server, a.llama_server, a.rest)
    if a.source is None:
        p.error("--source is required")
    results = {}
    if a.llama_results:
        results["llama"] = json.loads(a.llama_results.read_text())["llama"]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for w in ("llama", "ember"):
            if w not in results:
                results[w] = run_suite(w, a.source, a.llama_server, a.files, a.keyword, work)
    if a.llama_results:  # the earlier run's tests that this run's selection holds
        results["llama"] = {n: o for n, o in results["llama"].items() if n in results["ember"]}
    if a.save:
        a.save.write_text(json.dumps(results, indent=1, sort_keys=True))
    names = sorted(set(results["llama"]) | set(results["ember"]))

    def passed(w: str) -> set[str]:
        return {n for n in names if results[w].get(n) == "passed"}

    for w, label in (("llama", "llama-server"), ("ember", "ember-server")):
        print(f"{label}: {len(passed(w))} of {len(results[w])} passed")
    for title, only in (("passed on llama-server, not on ember", passed("llama") - passed("ember")),
                        ("passed on ember, not on llama-server", passed("ember") - passed("llama"))):
        print(f"\n{title} ({len(only)}):")
        for n in sorted(only):
            other = "ember" if title.startswith("passed on llama") else "llama"
            print(f"  {n}: {results[other].get(n, 'not run')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
