"""Imports only run down the data flow (docs/architecture.md), and no module imports
itself back through others: an AST check over src/, function-level imports included
(those used to hide the cycles this test now names); `if TYPE_CHECKING:` imports are
left out (they never run).

The layers, lowest first; a module may import its own layer's and lower ones. A package
not listed here fails the test until it is placed.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = SRC / "inferenceos"

LAYERS: list[set[str]] = [
    {"errors", "paths", "atomic", "units", "sqlite_db", "logs", "interrupt", "net",
     "version", "endpoint"},
    {"model", "media"},
    {"config"},
    {"hardware"},
    {"cluster"},  # RPC workers: the worker process, their info endpoint, the probes
    {"telemetry"},
    {"plan"},
    {"engine"},
    {"registry", "tuning"},
    {"api"},
    {"server", "cli", "__main__", "__init__"},
]
# Known debts, each an import that runs the wrong way or closes a cycle today; the
# test fails on any other, and on an entry here that no longer exists (so the list
# only shrinks). Issue 27 owns them.
KNOWN_UPWARD: set[tuple[str, str]] = set()
KNOWN_CYCLES: list[set[str]] = []


def _module(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(name: str) -> bool:
    base = SRC / name.replace(".", "/")
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node of `tree` except those under `if TYPE_CHECKING:` (annotations only:
    nothing there runs, so nothing there can close a cycle at import time)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))


def _imports(path: Path) -> Iterator[str]:
    """The inferenceos modules `path` imports, anywhere in it (functions included)."""
    for node in _runtime_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.split(".")[0] == "inferenceos")
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if node.module.split(".")[0] != "inferenceos":
                continue
            subs = [f"{node.module}.{a.name}" for a in node.names]
            named = [s for s in subs if _is_module(s)]
            yield from named
            if len(named) < len(subs):  # a name defined in the module itself
                yield node.module


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        me = _module(path)
        graph[me] = {m for m in _imports(path) if m != me}
    return graph


def _layer(module: str) -> int:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else "__init__"
    for i, layer in enumerate(LAYERS):
        if top in layer:
            return i
    raise AssertionError(f"{module}: its package {top!r} is in no layer of this test")


def _upward(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    return {(a, b) for a, bs in graph.items() for b in bs if _layer(b) > _layer(a)}


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[v] = min(low[v], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(comp)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return _graph()


def test_no_import_runs_up_a_layer(graph: dict[str, set[str]]) -> None:
    upward = _upward(graph)
    new = sorted(upward - KNOWN_UPWARD)
    assert not new, "imports from a lower layer to a higher one:\n" + "\n".join(
        f"  {a} -> {b}" for a, b in new)
    assert not KNOWN_UPWARD - upward, f"paid off, remove: {sorted(KNOWN_UPWARD - upward)}"


def test_no_import_cycle(graph: dict[str, set[str]]) -> None:
    cycles = _cycles(graph)
    new = [c for c in cycles if c not in KNOWN_CYCLES]
    assert not new, "import cycles:\n" + "\n".join(f"  {sorted(c)}" for c in new)
    gone = [c for c in KNOWN_CYCLES if c not in cycles]
    assert not gone, f"paid off, remove: {gone}"


def test_the_checker_sees_a_function_level_cycle(tmp_path: Path) -> None:
    """The checker itself: a cycle hidden in a function body is still a cycle."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from inferenceos.engine import session\n")
    assert list(_imports(src)) == ["inferenceos.engine.session"]
