"""Imports only run down the data flow (docs/architecture.md), and no module imports
itself back through others: an AST check over src/, function-level imports included
(those used to hide the cycles this test now names). `if TYPE_CHECKING:` imports never
run, so the layer check leaves them out; the cycle checks count them too (a cycle only
an annotation closes is still two modules that each need the other: place the type so
that neither does).

The layers, lowest first; a module may import its own layer's and lower ones. A package
not listed here fails the test until it is placed.
"""

from __future__ import annotations

import ast
import re
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
    {"api", "app"},  # app: the application layer the CLI calls (app/__init__.py)
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


def _nodes(tree: ast.AST, typing: bool = False) -> Iterator[ast.AST]:
    """Every node of `tree`; without `typing`, not those under `if TYPE_CHECKING:`
    (annotations only: nothing there runs, so nothing there can close a cycle at
    import time)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if (not typing and isinstance(node, ast.If)
                and "TYPE_CHECKING" in ast.unparse(node.test)):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))


def _imports(path: Path, typing: bool = False) -> Iterator[str]:
    """The inferenceos modules `path` imports, anywhere in it (functions included);
    with `typing`, those under `if TYPE_CHECKING:` too."""
    for node in _nodes(ast.parse(path.read_text()), typing):
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


def _graph(typing: bool = False) -> dict[str, set[str]]:
    """Module → the modules it imports (with `typing`, type-only imports included)."""
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        me = _module(path)
        graph[me] = {m for m in _imports(path, typing) if m != me}
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


@pytest.fixture(scope="module")
def typed_graph() -> dict[str, set[str]]:
    return _graph(typing=True)


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


def test_no_cycle_even_through_type_checking_imports(
    graph: dict[str, set[str]], typed_graph: dict[str, set[str]]
) -> None:
    """No cycle needs `if TYPE_CHECKING:` to stay importable: each type lives where
    the modules that name it can import it at run time (or is a Protocol below them)."""
    cycles = [c for c in _cycles(typed_graph) if c not in KNOWN_CYCLES]
    lines = []
    for c in cycles:
        lines.append(f"  {sorted(c)}")
        lines += [f"    {a} -> {b}" + ("" if b in graph[a] else "  (TYPE_CHECKING)")
                  for a in sorted(c) for b in sorted(typed_graph[a] & c)]
    assert not cycles, "import cycles, type-only imports counted:\n" + "\n".join(lines)


def test_the_checker_sees_a_function_level_cycle(tmp_path: Path) -> None:
    """The checker itself: a cycle hidden in a function body is still a cycle."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from inferenceos.engine import session\n")
    assert list(_imports(src)) == ["inferenceos.engine.session"]


def test_the_checker_sees_type_checking_imports(tmp_path: Path) -> None:
    """Type-only imports are edges for the cycle checks and none for the layer check."""
    src = tmp_path / "m.py"
    src.write_text("from typing import TYPE_CHECKING\n"
                   "if TYPE_CHECKING:\n    from inferenceos.engine import session\n"
                   "else:\n    from inferenceos.engine import output\n")
    assert list(_imports(src)) == ["inferenceos.engine.output"]
    assert sorted(_imports(src, typing=True)) == ["inferenceos.engine.output",
                                                   "inferenceos.engine.session"]


# Inside the engine and the server, the subpackages' rules (each package's docstring
# says them): engine module of `key` may import, of the engine, only its own subpackage
# and these; a server core module imports no dialect (app.py, which wires the routers,
# excepted).
ENGINE_SUBPACKAGE_IMPORTS: dict[str, set[str]] = {
    "llama": set(),
    "kv": {"llama", "plugins"},
    "weights": {"llama", "kv", "session"},
    "spec": {"llama", "kv", "session", "sampling", "running", "plugins"},
}


def _engine_part(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "engine" else None


def test_engine_subpackages_import_only_what_their_docstring_allows(
        typed_graph: dict[str, set[str]]) -> None:
    wrong = []
    for me, imported in typed_graph.items():
        mine = _engine_part(me)
        if mine not in ENGINE_SUBPACKAGE_IMPORTS:
            continue
        allowed = ENGINE_SUBPACKAGE_IMPORTS[mine] | {mine}
        wrong += [f"  {me} -> {m}" for m in sorted(imported)
                  if _engine_part(m) is not None and _engine_part(m) not in allowed]
    assert not wrong, "engine subpackage imports outside its rule:\n" + "\n".join(wrong)


def test_only_the_worker_subpackage_and_the_faces_import_the_worker(
        typed_graph: dict[str, set[str]]) -> None:
    """worker/ sits on top of the engine: below it, only the facade over a worker
    (engine.engine) imports it."""
    wrong = [f"  {me} -> {m}" for me, imported in typed_graph.items() for m in imported
             if m.startswith("inferenceos.engine.worker") and me.startswith("inferenceos.engine.")
             and _engine_part(me) != "worker" and me != "inferenceos.engine.engine"]
    assert not wrong, "\n".join(wrong)


def test_the_server_core_imports_no_dialect(typed_graph: dict[str, set[str]]) -> None:
    wrong = [f"  {me} -> {m}" for me, imported in typed_graph.items() for m in imported
             if m.startswith("inferenceos.server.dialects")
             and me.startswith("inferenceos.server.")
             and not me.startswith(("inferenceos.server.dialects", "inferenceos.server.ops"))
             and me != "inferenceos.server.app"]
    assert not wrong, "the server's core imports a dialect:\n" + "\n".join(wrong)


def test_architecture_doc_names_every_engine_and_server_module() -> None:
    """docs/architecture.md's picture stays true of the code: every module of the
    engine and the server (subpackages included) is named there, and every
    subpackage's __init__ has the docstring saying what it owns and may import."""
    doc = (SRC.parent / "docs" / "architecture.md").read_text()
    words = set(re.findall(r"\w+", doc))
    missing, bare = [], []
    for part in ("engine", "server"):
        for path in (PACKAGE / part).rglob("*.py"):
            if path.stem != "__init__" and path.stem not in words:
                missing.append(str(path.relative_to(PACKAGE)))
            if path.stem == "__init__" and not ast.get_docstring(ast.parse(path.read_text())):
                bare.append(str(path.relative_to(PACKAGE)))
    assert not missing, f"modules docs/architecture.md does not name: {sorted(missing)}"
    assert not bare, f"packages without a docstring: {sorted(bare)}"
