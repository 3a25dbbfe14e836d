"""The dialect core of server/ (issue 27): each route module translates its API's
request into the core's and renders the core's result; what they share lives in
dialect-neutral modules, so no route module imports a peer route module."""

from __future__ import annotations

import ast
from pathlib import Path

SERVER = Path(__file__).resolve().parent.parent / "src" / "inferenceos" / "server"
ROUTE_MODULES = sorted(SERVER.glob("*_routes.py"))


def _imported_modules(path: Path) -> set[str]:
    """Every inferenceos.server module `path` imports (functions included)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m.startswith("inferenceos.server.")}


def test_route_modules_import_no_peer_route_module() -> None:
    assert len(ROUTE_MODULES) >= 6
    for path in ROUTE_MODULES:
        peers = {m for m in _imported_modules(path)
                 if m.rsplit(".", 1)[-1].endswith("_routes")}
        assert not peers, f"{path.name} imports {sorted(peers)}"


def test_route_modules_reach_the_state_one_way() -> None:
    """`state_of(request)` (server/state.py) is the one accessor; no route module
    writes its own."""
    for path in ROUTE_MODULES:
        text = path.read_text()
        assert "def _state(" not in text, path.name
        assert "app.state.ios" not in text, path.name
