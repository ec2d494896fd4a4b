"""`ember bench`: prompt processing (ppN) and text generation (tgN) rates,
measured and printed the way llama.cpp's llama-bench does, so the figures can
sit beside its own.

``ppN`` reads N prompt tokens (logits of the last position only); ``tgN``
decodes N tokens one at a time. Both start from an empty context, or from one
that already holds D tokens (``-d``, llama-bench's ``--n-depth``: the test is
then named ``ppN @ dD``), read before the clock starts.
Each test runs once untimed, then ``repetitions`` times; the rate is tokens per
second, reported as mean ± sample standard deviation over the repetitions.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, TextIO

__all__ = ["BenchError", "TestResult", "prompt_tokens", "run_bench", "format_table", "format_jsonl"]


class BenchError(ValueError):
    """An argument `ember bench` cannot use (the command exits with status 2)."""


@dataclass
class TestResult:
    model: str
    size: int
    params: int
    kernels: str
    threads: int
    n_batch: int
    n_prompt: int
    n_gen: int
    n_depth: int = 0
    #: the KV cache's element type (llama-bench's type_k and type_v)
    kv_type: str = "f16"
    samples_ts: list[float] = field(default_factory=list)
    #: tg only: bytes a decoded token reads (weights; keys and values at the
    #: test's middle token), and the bytes a second the threads re-read a
    #: buffer of that size at best (from memory, or from a last-level cache
    #: that holds it), measured in the same run: their quotient is the
    #: fastest decode this machine allows
    weights_bytes: int | None = None
    cache_bytes: int | None = None
    stream_bytes_per_s: float | None = None
    #: pp only: the multiply-adds of the pass's attention products (scores
    #: and values), and the multiply-adds a second the threads issue at best
    #: in the instruction that meets the test's cache (none for Q8_0); the
    #: multiply-adds of its weight products, and the threads' best rate in
    #: the instruction that takes the weights' 8-bit activations; all
    #: measured in the same run. The two quotients' sum is the least time the
    #: products take, whatever else the pass does
    attention_macs: int | None = None
    product_macs_per_s: float | None = None
    weight_macs: int | None = None
    byte_macs_per_s: float | None = None

    @property
    def attention_floor_s(self) -> float | None:
        if self.attention_macs is None or not self.product_macs_per_s:
            return None
        return self.attention_macs / self.product_macs_per_s

    @property
    def products_floor_s(self) -> float | None:
        attention = self.attention_floor_s
        if attention is None or self.weight_macs is None or not self.byte_macs_per_s:
            return None
        return attention + self.weight_macs / self.byte_macs_per_s

    @property
    def limit_ts(self) -> float | None:
        """tg: the bytes a token reads at the streaming rate; pp: the
        prompt's attention and weight products, each at its instruction's
        peak, all else free."""
        if self.n_prompt:
            floor = self.products_floor_s
            return self.n_prompt / floor if floor else None
        if self.stream_bytes_per_s is None or self.weights_bytes is None or self.cache_bytes is None:
            return None
        return self.stream_bytes_per_s / (self.weights_bytes + self.cache_bytes)

    @property
    def test(self) -> str:
        name = f"pp{self.n_prompt}" if self.n_prompt else f"tg{self.n_gen}"
        return f"{name} @ d{self.n_depth}" if self.n_depth else name

    @property
    def avg_ts(self) -> float:
        return statistics.fmean(self.samples_ts)

    @property
    def stddev_ts(self) -> float:
        return statistics.stdev(self.samples_ts) if len(self.samples_ts) > 1 else 0.0

    def as_json(self) -> dict:
        return {
            "model": self.model,
            "test": self.test,
            "n_prompt": self.n_prompt,
            "n_gen": self.n_gen,
            "n_depth": self.n_depth,
            "type_k": self.kv_type,
            "type_v": self.kv_type,
            "threads": self.threads,
            "kernels": self.kernels,
            "n_batch": self.n_batch,
            "model_size": self.size,
            "model_n_params": self.params,
            "samples_ts": self.samples_ts,
            "avg_ts": self.avg_ts,
            "stddev_ts": self.stddev_ts,
            **({} if self.limit_ts is None else {
                "weights_bytes": self.weights_bytes,
                "cache_bytes": self.cache_bytes,
                "stream_bytes_per_s": self.stream_bytes_per_s,
                "limit_ts": self.limit_ts,
            } if self.n_gen else {
                "attention_macs": self.attention_macs,
                "product_macs_per_s": self.product_macs_per_s,
                "attention_floor_s": self.attention_floor_s,
                "weight_macs": self.weight_macs,
                "byte_macs_per_s": self.byte_macs_per_s,
                "products_floor_s": self.products_floor_s,
                "limit_ts": self.limit_ts,
            }),
        }


def prompt_tokens(n: int, n_vocab: int, bos: int | None) -> list[int]:
    """``n`` prompt ids spread over the vocabulary (llama-bench draws random
    ids; a fixed stride keeps runs comparable)."""
    start = (bos if bos is not None else 1) + 1
    return [(start + i * 7919) % n_vocab for i in range(n)]


def parse_depths(raw: str) -> list[int]:
    """-d's comma-separated depths (llama-bench's list form)."""
    try:
        depths = [int(x) for x in raw.split(",")]
    except ValueError:
        raise BenchError(f"-d/--n-depth: expected depths such as 0,1024,4096 (got {raw!r})") from None
    if any(d < 0 for d in depths):
        raise BenchError(f"-d/--n-depth must be >= 0 (got {raw})")
    return list(dict.fromkeys(depths))


def check_args(n_prompt: int, n_gen: int, repetitions: int, threads: int, batch: int) -> None:
    if n_prompt < 0:
        raise BenchError(f"-p/--n-prompt must be >= 0 (got {n_prompt})")
    if n_gen < 0:
        raise BenchError(f"-n/--n-gen must be >= 0 (got {n_gen})")
    if n_prompt == 0 and n_gen == 0:
        raise BenchError("nothing to measure: -p and -n are both 0")
    if repetitions < 1:
        raise BenchError(f"-r/--repetitions must be >= 1 (got {repetitions})")
    if threads < 0:
        raise BenchError(f"-t/--threads must be >= 0 (got {threads}; 0 picks the physical cores)")
    if batch < 1:
        raise BenchError(f"-b/--batch-size must be >= 1 (got {batch})")


def _model_facts(path: Path) -> tuple[int, int]:
    """(bytes of tensor data, number of parameters) from the file's header."""
    from ember import _native

    info = _native.inspect(str(path), 0)
    size = sum(t[3] for t in info["tensors"])
    params = sum(math.prod(t[2]) for t in info["tensors"])
    return size, params


def run_bench(
    path: Path,
    n_prompt: int,
    n_gen: int,
    repetitions: int,
    threads: int = 0,
    batch: int = 512,
    on_result: Callable[[TestResult], None] | None = None,
    depths: list[int] | None = None,
    kv_type: str = "f16",
    gpu_layers: int | str | None = None,
    device: str | None = None,
    note: Callable[[str], None] | None = None,
) -> list[TestResult]:
    """Measures the tests (ppN unless ``n_prompt`` is 0, tgN unless ``n_gen`` is 0)
    at each depth and returns their results, handing each to ``on_result`` as
    it finishes. ``gpu_layers`` and ``device`` put the model on a device as
    `ember.Model` takes them; where it runs on the CPU all the same, ``note``
    hears why."""
    from ember import _native
    from ember.devices import request
    from ember.errors import EmberError

    check_args(n_prompt, n_gen, repetitions, threads, batch)
    depths = depths or [0]
    if kv_type not in ("f16", "bf16", "f32", "q8_0"):
        raise BenchError(f"-ctk/--cache-type: expected f16, bf16, f32 or q8_0 (got {kv_type!r})")
    path = Path(path)
    if not path.is_file():
        raise BenchError(f"model file {path}: no such file")
    size, params = _model_facts(path)
    try:
        where = request(gpu_layers, device)
        model = _native.Model(str(path), max(depths) + max(n_prompt, n_gen, 1), threads, kv_type, batch, where.device,
                              where.layers, where.strict)
    except EmberError as e:
        raise BenchError(str(e)) from None
    placed = model.placement()
    if model.device_note and note is not None:
        note(f"the model runs on the CPU: {model.device_note}")
    base = dict(
        model=path.name, size=size, params=params, kernels=placed["name"] if placed else _native.simd_level(),
        threads=model.threads, n_batch=batch, kv_type=kv_type,
    )
    bos = model.bos_id
    tests: list[tuple[TestResult, Callable[[], float]]] = []
    # The peaks of attention's and the weights' products, for pp's limit at
    # every depth (the host's: none on a device).
    peak = model.product_rate() if n_prompt and not placed else None
    byte_peak = model.byte_product_rate() if peak is not None else None
    for depth in depths:
        # The held tokens start with the BOS; the measured ones follow them.
        held = prompt_tokens(depth, model.n_vocab, bos)
        if n_prompt:
            ids = prompt_tokens(depth + n_prompt, model.n_vocab, bos)[depth:] if depth else \
                prompt_tokens(n_prompt, model.n_vocab, bos)
            floor = {}
            if not placed:  # the host's peak says nothing of a device's
                floor = dict(attention_macs=sum(model.attention_work(depth, n_prompt)), product_macs_per_s=peak,
                             weight_macs=model.weight_work(n_prompt), byte_macs_per_s=byte_peak)
            tests.append((TestResult(n_prompt=n_prompt, n_gen=0, n_depth=depth, **floor, **base),
                          lambda ids=ids, held=held: model.bench_prompt(ids, held)))
        if n_gen:
            first = bos if bos is not None else prompt_tokens(1, model.n_vocab, None)[0]
            limit = {}
            if not placed:  # the host's streaming rate says nothing of a device's
                weights, cache = model.token_bytes(depth + n_gen // 2)
                # The rate of re-reading as many bytes as a token reads: memory's,
                # or a large last-level cache's where they fit it.
                limit = dict(weights_bytes=weights, cache_bytes=cache,
                             stream_bytes_per_s=model.stream_rate(weights + cache))
            tests.append((TestResult(n_prompt=0, n_gen=n_gen, n_depth=depth, **limit, **base),
                          lambda first=first, held=held: model.bench_generation(first, n_gen, held)))
    results = []
    for result, measure in tests:
        n = result.n_prompt or result.n_gen
        measure()  # warm-up, untimed
        for _ in range(repetitions):
            result.samples_ts.append(n / measure())
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results


def _human_size(n: int) -> str:
    for unit in ("KiB", "MiB", "GiB"):
        n /= 1024
        if n < 1024 or unit == "GiB":
            return f"{n:.2f} {unit}"
    return str(n)


def _human_params(n: int) -> str:
    if n >= 1e9:
        return f"{n / 1e9:.2f} B"
    return f"{n / 1e6:.2f} M"


_COLUMNS = ["model", "size", "params", "kernels", "threads", "test", "t/s"]
_RIGHT = {"size", "params", "threads", "test", "t/s"}


def _row(r: TestResult) -> list[str]:
    return [
        r.model, _human_size(r.size), _human_params(r.params), r.kernels, str(r.threads), r.test,
        f"{r.avg_ts:.2f} ± {r.stddev_ts:.2f}",
    ]


def _widths(results: list[TestResult], model_name: str) -> list[int]:
    widths = [len(c) for c in _COLUMNS]
    widths[0] = max(widths[0], len(model_name))
    for r in results:
        widths = [max(w, len(v)) for w, v in zip(widths, _row(r))]
    return widths


def _line(cells: list[str], widths: list[int]) -> str:
    out = []
    for c, w, name in zip(cells, widths, _COLUMNS):
        out.append(c.rjust(w) if name in _RIGHT else c.ljust(w))
    return "| " + " | ".join(out) + " |"


def format_table(results: list[TestResult]) -> str:
    """A markdown table, one row per test, as llama-bench prints it."""
    widths = _widths(results, results[0].model if results else "")
    sep = "| " + " | ".join(("-" * (w - 1) + ":") if n in _RIGHT else "-" * w for w, n in zip(widths, _COLUMNS)) + " |"
    return "\n".join([_line(_COLUMNS, widths), sep] + [_line(_row(r), widths) for r in results])


def format_jsonl(result: TestResult) -> str:
    return json.dumps(result.as_json(), ensure_ascii=False)


def main_bench(path: Path, n_prompt: int, n_gen: int, repetitions: int, threads: int, batch: int, as_json: bool,
               out: TextIO = sys.stdout, depths: list[int] | None = None, kv_type: str = "f16",
               gpu_layers: int | str | None = None, device: str | None = None) -> int:
    """Runs the tests and prints them: a table (after the last test), or a JSON
    object per line as each test finishes."""

    def emit(r: TestResult) -> None:
        if as_json:
            print(format_jsonl(r), file=out, flush=True)

    results = run_bench(path, n_prompt, n_gen, repetitions, threads, batch, on_result=emit, depths=depths,
                        kv_type=kv_type, gpu_layers=gpu_layers, device=device,
                        note=lambda line: print(f"ember bench: {line}", file=sys.stderr))
    if not as_json:
        print(format_table(results), file=out, flush=True)
    return 0
