"""`ember bench`, run as a user runs it: a subprocess, with tiny sizes."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest


def ember(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ember", *args], capture_output=True, text=True, timeout=timeout)


def test_bench_prints_a_llama_bench_table(smollm2_path):
    from ember import _native

    r = ember("bench", "-m", str(smollm2_path), "-p", "16", "-n", "4", "-r", "1", "-t", "1")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 4, r.stdout
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == ["model", "size", "params", "kernels", "threads", "test", "t/s"]
    assert set(lines[1]) <= set("|-: ")
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    assert [row[5] for row in rows] == ["pp16", "tg4"]
    for row in rows:
        assert len(row) == len(header)
        assert row[0] == smollm2_path.name
        assert row[1].endswith("MiB") and row[2].endswith(" M")
        assert row[3] == _native.simd_level()
        assert row[4] == "1"
        mean, _, stddev = row[6].partition(" ± ")
        assert float(mean) > 0 and float(stddev) >= 0


def test_bench_json_lines(smollm2_path):
    r = ember("bench", "-m", str(smollm2_path), "-p", "16", "-n", "4", "-r", "2", "--json")
    assert r.returncode == 0, r.stderr
    objs = [json.loads(line) for line in r.stdout.strip().splitlines()]
    assert [o["test"] for o in objs] == ["pp16", "tg4"]
    assert [(o["n_prompt"], o["n_gen"]) for o in objs] == [(16, 0), (0, 4)]
    for o in objs:
        assert o["model"] == smollm2_path.name
        assert o["threads"] >= 1 and o["kernels"]
        assert len(o["samples_ts"]) == 2 and all(s > 0 for s in o["samples_ts"])
        assert o["avg_ts"] > 0 and o["stddev_ts"] >= 0


def test_zero_skips_a_test(smollm2_path):
    r = ember("bench", "-m", str(smollm2_path), "-p", "0", "-n", "2", "-r", "1", "--json")
    assert r.returncode == 0, r.stderr
    assert [json.loads(line)["test"] for line in r.stdout.strip().splitlines()] == ["tg2"]


def test_depth_and_cache_type_as_llama_bench_names_them(smollm2_path):
    """-d: the tests start from a context holding that many tokens (read
    untimed), named "ppN @ dD" as llama-bench's; -ctk: the cache's type."""
    r = ember("bench", "-m", str(smollm2_path), "-p", "8", "-n", "2", "-r", "1", "-d", "0,32", "-ctk", "q8_0", "--json")
    assert r.returncode == 0, r.stderr
    objs = [json.loads(line) for line in r.stdout.strip().splitlines()]
    assert [o["test"] for o in objs] == ["pp8", "tg2", "pp8 @ d32", "tg2 @ d32"]
    assert [o["n_depth"] for o in objs] == [0, 0, 32, 32] and {o["type_k"] for o in objs} == {"q8_0"}


def test_tg_gives_the_bytes_a_token_reads_and_the_limit_they_set(smollm2_path, gemma3_path):
    """A tg result carries what a decoded token reads (every weight once, the
    token table only where it is the output head too; the keys and values
    its queries see at the test's middle token, a sliding window's at most)
    and the threads' streaming rate: their quotient is the limit."""
    from ember import _native

    for path, depth, kv in [(smollm2_path, 32, "q8_0"), (gemma3_path, 1024, "f16")]:
        r = ember("bench", "-m", str(path), "-p", "0", "-n", "2", "-r", "1", "-d", str(depth), "-ctk", kv, "--json")
        assert r.returncode == 0, r.stderr
        (o,) = [json.loads(line) for line in r.stdout.strip().splitlines()]
        info = _native.inspect(str(path), 0)
        names = {t[0] for t in info["tensors"]}
        tied = "output.weight" not in names
        weights = sum(t[3] for t in info["tensors"] if tied or t[0] != "token_embd.weight")
        assert o["weights_bytes"] == weights
        meta = dict(info["metadata"])
        arch = meta["general.architecture"]
        n_layer, n_kv = meta[f"{arch}.block_count"], meta[f"{arch}.attention.head_count_kv"]
        hk = meta.get(f"{arch}.attention.key_length") or meta[f"{arch}.embedding_length"] // meta[f"{arch}.attention.head_count"]
        row = 2 * (n_kv * hk // 32 * 34 if kv == "q8_0" else n_kv * hk * 2)
        seen = depth + 1 + 1  # the test's middle token of two sees the depth, the first drawn and itself
        if arch == "gemma3":
            # Every sixth layer global, the others the window's last positions.
            window = meta["gemma3.attention.sliding_window"]
            n_global = n_layer // 6
            assert window < seen
            assert o["cache_bytes"] == (n_global * seen + (n_layer - n_global) * window) * row
        else:
            assert o["cache_bytes"] == n_layer * seen * row
        assert o["stream_bytes_per_s"] > 1e8
        assert o["limit_ts"] == pytest.approx(o["stream_bytes_per_s"] / (o["weights_bytes"] + o["cache_bytes"]))


def test_pp_gives_the_products_and_the_limit_they_set(smollm2_path, gemma3_path):
    """A pp result carries the multiply-adds of its attention products (each
    query head against every position its row sees, a sliding window's at
    most, once for the scores and once for the values) and the threads' peak
    rate in the instruction that meets the cache; and the multiply-adds of
    its weight products (each weight of a block against each token, the head
    against the last) with the threads' peak rate in the instruction that
    takes the weights' 8-bit activations: the prompt over the two quotients'
    sum is the limit. A Q8_0 cache, whose attention products are of two
    kinds, gives none."""
    from ember import _native

    # Gemma 3's rows at 509-516 straddle its window of 512.
    for path, depth, kv in [(smollm2_path, 40, "f16"), (gemma3_path, 508, "bf16")]:
        r = ember("bench", "-m", str(path), "-p", "8", "-n", "0", "-r", "1", "-d", str(depth), "-ctk", kv, "--json")
        assert r.returncode == 0, r.stderr
        (o,) = [json.loads(line) for line in r.stdout.strip().splitlines()]
        meta = dict(_native.inspect(str(path), 0)["metadata"])
        arch = meta["general.architecture"]
        n_layer, n_head = meta[f"{arch}.block_count"], meta[f"{arch}.attention.head_count"]
        hk = meta.get(f"{arch}.attention.key_length") or meta[f"{arch}.embedding_length"] // n_head
        hv = meta.get(f"{arch}.attention.value_length") or hk
        rows = range(depth + 1, depth + 9)  # the positions each of the 8 rows sees, up to its own
        if arch == "gemma3":
            window = meta["gemma3.attention.sliding_window"]
            n_global = n_layer // 6
            assert rows[0] < window < rows[-1]
            seen = n_global * sum(rows) + (n_layer - n_global) * sum(min(window, p) for p in rows)
        else:
            seen = n_layer * sum(rows)
        assert o["attention_macs"] == seen * n_head * (hk + hv)
        assert o["product_macs_per_s"] > 1e8
        assert o["attention_floor_s"] == pytest.approx(o["attention_macs"] / o["product_macs_per_s"])
        # Matrices: a norm's weights are a vector, and meet no product.
        matrices = {name: math.prod(shape) for name, _, shape, _ in _native.inspect(str(path), 0)["tensors"]
                    if len(shape) >= 2}
        head = "output.weight" if "output.weight" in matrices else "token_embd.weight"
        block = sum(n for name, n in matrices.items() if name.startswith("blk."))
        assert block > 0
        assert o["weight_macs"] == 8 * block + matrices[head]
        assert o["byte_macs_per_s"] > 1e8
        assert o["products_floor_s"] == pytest.approx(o["attention_floor_s"] + o["weight_macs"] / o["byte_macs_per_s"])
        assert o["limit_ts"] == pytest.approx(8 / o["products_floor_s"])
    r = ember("bench", "-m", str(smollm2_path), "-p", "8", "-n", "0", "-r", "1", "-ctk", "q8_0", "--json")
    assert r.returncode == 0, r.stderr
    (o,) = [json.loads(line) for line in r.stdout.strip().splitlines()]
    assert "limit_ts" not in o and "attention_macs" not in o


@pytest.mark.parametrize(
    "args, needle",
    [
        (["-d", "-4"], "-d/--n-depth must be >= 0"),
        (["-d", "1k"], "-d/--n-depth: expected depths"),
        (["-ctk", "q4_0"], "-ctk/--cache-type"),
        (["-p", "-1"], "-p/--n-prompt"),
        (["-n", "-5"], "-n/--n-gen"),
        (["-r", "0"], "-r/--repetitions"),
        (["-t", "-2"], "-t/--threads"),
        (["-p", "0", "-n", "0"], "nothing to measure"),
        (["-p", "many"], "invalid int value"),
        (["--no-such-flag"], "unrecognized arguments"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(smollm2_path, args, needle):
    r = ember("bench", "-m", str(smollm2_path), *args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert needle in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert r.stdout == ""


def test_a_missing_model_file_exits_2(tmp_path):
    missing = tmp_path / "missing.gguf"
    r = ember("bench", "-m", str(missing), "-p", "16", "-n", "4", "-r", "1")
    assert r.returncode == 2
    assert str(missing) in r.stderr and "no such file" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
