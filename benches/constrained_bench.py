"""What holding generation to a grammar costs: tokens/s with and without a
grammar, on the same model, prompt and threads, and the cost of the masks.

    python benches/constrained_bench.py [--models DIR] [--threads 2] [--tokens 128] [--reps 3]

Cases, each greedy:
  free      no grammar, the end of the turn ignored (the baseline);
  string    an unclosed JSON string (nearly the whole vocabulary allowed at
            every step: the mask's worst case for width, one parse state);
  schema    a JSON Schema (an array of objects with strings, integers, enums
            and nested arrays: many states, literal keys forced).
The first constrained run of each grammar explores its parse states and
computes their masks ("cold"); later runs find them cached ("warm", what a
client sending the same schema again sees). Rates count every generated token,
forced ones included, over the generation time after the prompt.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

MODELS = ["SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"]

STRING_GBNF = r'''root ::= "\"" ([^"\\\x00-\x1F] | "\\" ["\\/bfnrt])*'''

SCHEMA = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 24},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "role": {"enum": ["engineer", "artist", "farmer", "doctor"]},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
            "active": {"type": "boolean"},
        },
        "required": ["name", "age", "role", "tags", "active"],
        "additionalProperties": False,
    },
    "minItems": 8,
}

PROMPT = "<|im_start|>user\nList the people of a small village as JSON.<|im_end|>\n<|im_start|>assistant\n"


def models_dir(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    env = os.environ.get("EMBER_TEST_MODELS")
    return Path(env) if env else Path.home() / ".cache" / "ember" / "models"


def run(model, n_tokens: int, grammar) -> tuple[float, int]:
    """(tokens/s after the prompt, tokens generated)."""
    c = model.complete(PROMPT, n_tokens, temperature=0.0, ignore_eos=True, parse_special=True, cache_prompt=False,
                       grammar=grammar)
    n = len(c.tokens)
    return (n - 1) / (c.gen_ms / 1e3) if c.gen_ms > 0 and n > 1 else 0.0, n


def bench(path: Path, threads: int, n_tokens: int, reps: int) -> None:
    from ember import Model
    from ember.structured import Grammar

    model = Model(path, n_ctx=1024, threads=threads)
    print(f"\n{path.name}  ({model.n_vocab} tokens in the vocabulary, {threads} threads, {n_tokens} tokens a run)")
    print(f"  {'case':8} {'cold t/s':>9} {'warm t/s':>9} {'± ':>6} {'vs free':>8} {'tokens':>7} {'states':>7}")
    run(model, 8, None)  # warm-up: first touches of the weights
    free = [run(model, n_tokens, None)[0] for _ in range(reps)]
    base = statistics.median(free)
    print(f"  {'free':8} {'':>9} {base:9.1f} {statistics.pstdev(free):6.1f} {'1.00x':>8} {n_tokens:7d} {'':>7}")
    for name, make in (("string", lambda: Grammar.from_gbnf(STRING_GBNF)),
                       ("schema", lambda: Grammar.from_json_schema(json.dumps(SCHEMA)))):
        g = make()
        t = time.perf_counter()
        cold, n = run(model, n_tokens, g)
        warm = [run(model, n_tokens, g)[0] for _ in range(reps)]
        w = statistics.median(warm)
        print(f"  {name:8} {cold:9.1f} {w:9.1f} {statistics.pstdev(warm):6.1f} {w / base:7.2f}x {n:7d} "
              f"{g.n_states:7d}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", help="directory holding the test models")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("files", nargs="*", help="GGUF files (default: the two test models)")
    args = ap.parse_args()
    files = [Path(f) for f in args.files] or [models_dir(args.models) / m for m in MODELS]
    for f in files:
        bench(f, args.threads, args.tokens, args.reps)


if __name__ == "__main__":
    main()
