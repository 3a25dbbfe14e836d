"""The CLI is a thin shell (docs/architecture.md): no function in src/inferenceos/cli/
is over 60 lines, counted from its `def` to its last line (decorators left out; a
signature of many Annotated parameters counts: those belong in the shared option
modules). A long command conducts what the application layer should: a command parses
its options into the shared groups, calls a helper or the API, and renders.
"""

from __future__ import annotations

import ast
from pathlib import Path

CLI = Path(__file__).resolve().parents[2] / "src" / "inferenceos" / "cli"
LIMIT = 60


def _lengths() -> dict[str, int]:
    """Every function and method in cli/*.py (nested ones too), by 'file:name', with its
    length in lines; the longest of a name when a file has two."""
    found: dict[str, int] = {}
    for path in sorted(CLI.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                key = f"{path.name}:{node.name}"
                found[key] = max(found.get(key, 0), node.end_lineno - node.lineno + 1)
    return found


def test_no_cli_function_is_over_the_limit() -> None:
    over = {k: n for k, n in _lengths().items() if n > LIMIT}
    assert not over, f"functions in cli/ over {LIMIT} lines (split them): {over}"


def test_the_walk_sees_the_commands() -> None:
    """The walk reads the CLI's files: a broken path would pass the check vacuously."""
    assert "run_cmd.py:run" in _lengths()
