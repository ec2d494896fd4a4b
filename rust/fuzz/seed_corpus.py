"""Writes the fuzz targets' seed corpora (not committed: the inputs come from
the test models and the project's own grammars): the heads of the GGUF test
files, and GBNF grammars and JSON Schemas of the kinds clients send.

    python3 seed_corpus.py [--models DIR ...]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: A head this long holds the metadata and the tensor table of every test file.
HEAD = 4 << 20

GRAMMARS = [
    'root ::= "yes" | "no"',
    'root ::= [a-z]+ ("," [a-z]+)*',
    'root ::= object\nobject ::= "{" ws (pair ("," ws pair)*)? "}"\npair ::= string ":" ws value\n'
    'string ::= "\\"" [^"]* "\\""\nvalue ::= string | [0-9]+ | object\nws ::= [ \\t\\n]*',
    'root ::= ("a" | "b"){2,5} "c"? [^\\x00-\\x1f]*',
    'root ::= x\nx ::= "(" x ")" | ""',
]
SCHEMAS = [
    {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]},
    {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1, "maxItems": 4},
    {"anyOf": [{"type": "string", "pattern": "^[a-z]{2,4}$"}, {"type": "number"}]},
    {"type": "object", "properties": {"n": {"enum": [1, 2, "three"]}}, "additionalProperties": False},
    {"$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}}},
     "$ref": "#/$defs/node"},
]


def main() -> None:
    ap = argparse.ArgumentParser()
    home = Path(os.environ.get("HOME", "~")) / ".cache/ember"
    ap.add_argument("--models", nargs="*", type=Path,
                    default=[Path(os.environ.get("EMBER_TINY_MODELS", home / "tiny-models")),
                             Path(os.environ.get("EMBER_TEST_MODELS", home / "models"))])
    args = ap.parse_args()
    gguf = HERE / "corpus" / "gguf_reader"
    gguf.mkdir(parents=True, exist_ok=True)
    n = 0
    for folder in args.models:
        for f in sorted(folder.glob("*.gguf")) if folder.is_dir() else []:
            with open(f, "rb") as src:
                (gguf / f.name).write_bytes(src.read(HEAD))
            n += 1
    grammar = HERE / "corpus" / "grammar_compiler"
    grammar.mkdir(parents=True, exist_ok=True)
    for i, g in enumerate(GRAMMARS):
        (grammar / f"gbnf-{i}").write_text(g)
    for i, s in enumerate(SCHEMAS):
        (grammar / f"schema-{i}").write_text(json.dumps(s))
    print(f"seeded {n} GGUF heads and {len(GRAMMARS) + len(SCHEMAS)} grammars under {HERE / 'corpus'}")


if __name__ == "__main__":
    main()
