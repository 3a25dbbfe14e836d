"""The benchmark matrix of `inferenceos benchmark`, recorded: what the command conducts.

`measure` runs the matrix through the serving engine (tuning/matrix: llama.cpp's
defaults first, as the baseline row), records each row in telemetry as it ends, and
flushes the records before it returns. Each row also goes to the caller's `on_row` (a
progress display).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inferenceos.tuning.matrix import Point, Row


def measure(path: Path, pts: list[Point], prompt_tokens: int, gen_tokens: int, rounds: int,
            *, on_row: Callable[[Row], None]) -> list[Row]:
    """The matrix's rows for the model at `path`, the baseline first."""
    from inferenceos.tuning import records
    from inferenceos.tuning.matrix import run_matrix

    def record(row: Row) -> None:
        records.benchmark_row(path, row, prompt_tokens)
        on_row(row)

    rows = run_matrix(path, pts, prompt_tokens, gen_tokens, rounds, record)
    records.flush()
    return rows
