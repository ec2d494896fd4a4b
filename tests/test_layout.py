"""The package's layout, read from its sources: no module of pysrc/ember
imports, at any depth of a file (a function's own imports included), a
module that imports it back, so each layer can be read without the ones
above it."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "pysrc"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Each module of the package, and the package's modules it imports."""
    files = {module_name(p): p for p in ROOT.rglob("*.py")}
    # The compiled module, by its stub.
    files.update({module_name(p): p for p in ROOT.rglob("*.pyi") if module_name(p) not in files})
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name in files}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for a in node.names:
                    sub = f"{node.module}.{a.name}"
                    if sub in files:
                        deps.add(sub)
                    elif node.module in files:
                        deps.add(node.module)
        graph[name] = deps - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    done: set[str] = set()
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        if m in path:
            return path[path.index(m):] + [m]
        if m in done:
            return None
        path.append(m)
        for d in sorted(graph.get(m, ())):
            if (cycle := visit(d)) is not None:
                return cycle
        path.pop()
        done.add(m)
        return None

    for m in sorted(graph):
        if (cycle := visit(m)) is not None:
            return cycle
    return None


def test_the_graph_sees_the_imports_it_must():
    g = import_graph()
    assert "ember.server.state" in g["ember.server.protocols.openai"]
    assert "ember.server.protocols" in g["ember.server.app"]
    assert "ember._native" in g["ember.model"]


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_module_imports_one_that_imports_it_back():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_chat_core_needs_nothing_of_the_server():
    """`ember.chat` is what the server and `ember.Model.chat` both run: none
    of it, at any depth of its imports, reaches `ember.server`."""
    g = import_graph()
    seen, todo = set(), [m for m in g if m == "ember.chat" or m.startswith("ember.chat.")]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += g.get(m, ())
    assert not [m for m in seen if m.startswith("ember.server")], sorted(seen)
    assert "ember.chat.prompt" in seen and "ember.chat.tools" in g["ember.chat.prompt"]
