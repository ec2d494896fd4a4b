"""Where the tests' files lie, for test modules at any depth of tests/: the
repository's root, tests/ itself, and tests/fixtures (the tiny models'
builders, the chat templates, the recorded embeddings)."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
FIXTURES = TESTS / "fixtures"
