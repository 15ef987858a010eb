"""The layering of ``node/`` and ``gossip/``, read from the source: who may import whom.

The import graph is built from the AST of every module (imports under ``TYPE_CHECKING`` and
inside functions count too: a cycle a type checker sees is a cycle a reader sees), with relative
imports resolved. An import of ``a.b.c`` counts as an edge to the deepest module of the two
packages that the name reaches (``a.b.c`` if it is a module, else ``a.b``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("gossip", "node")


@cache
def modules() -> dict[str, Path]:
    """Every module of the two packages by dotted name (a package by its ``__init__``)."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _imported(name: str, path: Path, tree: ast.Module) -> Iterator[str]:
    """The dotted names ``tree`` imports (relative ones resolved against ``name``)."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            for alias in node.names:
                yield f"{module}.{alias.name}"  # ``from a import b``: b may be a module
            yield module


def _resolve(dotted: str) -> str | None:
    """The deepest module of ours that ``dotted`` names, or None for anything else."""
    known = modules()
    parts = dotted.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in known:
            return candidate
        parts.pop()
    return None


@cache
def graph() -> dict[str, frozenset[str]]:
    """Module -> the modules of ours it imports (itself and its own package excluded: a module
    that imports its package's ``__init__`` is not a cycle worth naming)."""
    edges = {}
    for name, path in modules().items():
        tree = ast.parse(path.read_text(), str(path))
        targets = {_resolve(d) for d in _imported(name, path, tree)}
        edges[name] = frozenset(
            t for t in targets if t is not None and t != name and not name.startswith(t + ".")
        )
    return edges


def find_cycle(edges: dict[str, frozenset[str]]) -> list[str] | None:
    """One cycle of ``edges`` as a path that ends where it starts, or None (depth-first)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(edges.get(n, ())):
            if state.get(m) == 1:
                return [*stack[stack.index(m) :], m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(edges):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def imports_between(source: str, target: str) -> list[str]:
    """Every edge from a module in ``source`` (a package or module) into ``target``."""

    def within(m: str, p: str) -> bool:
        return m == p or m.startswith(p + ".")

    return sorted(
        f"{a} -> {b}"
        for a, targets in graph().items()
        if within(a, source)
        for b in targets
        if within(b, target)
    )


def test_the_graph_sees_the_packages() -> None:
    """The walk finds the modules and their edges (else every rule below holds vacuously)."""
    edges = graph()
    assert "node.daemon.node" in edges
    assert "gossip.replicas" in edges
    assert "node.daemon.service" in edges["node.daemon.assembly"]
    assert "gossip.replicas" in edges["node.daemon.inbound"]


def test_find_cycle_finds_one() -> None:
    edges = {"a": frozenset({"b"}), "b": frozenset({"c"}), "c": frozenset({"a"}), "d": frozenset()}
    assert find_cycle(edges) == ["a", "b", "c", "a"]
    assert find_cycle({"a": frozenset({"b"}), "b": frozenset()}) is None


def test_no_import_cycle() -> None:
    cycle = find_cycle(dict(graph()))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_core_imports_nothing_of_the_shell() -> None:
    assert imports_between("gossip", "node") == []


def test_lower_layers_import_nothing_of_the_daemon_cli_or_simulator() -> None:
    found = [
        edge
        for lower in ("node.security", "node.telemetry", "node.transport")
        for upper in ("node.daemon", "node.cli", "node.sim")
        for edge in imports_between(lower, upper)
    ]
    assert found == []


def test_the_daemon_imports_nothing_of_the_cli_or_simulator() -> None:
    assert (
        imports_between("node.daemon", "node.cli") + imports_between("node.daemon", "node.sim")
        == []
    )
