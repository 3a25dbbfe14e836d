"""The settings search of `inferenceos optimize`, recorded: what the command conducts.

`optimize_model` runs the search (tuning/search) over the model at `path`, records
every trial under one search id as it ends, and stores the best settings for this
machine and model when at least one trial was compared with the baseline (a best that
nothing was compared with is no best). Each trial also goes to the caller's
`on_trial` (a progress display).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inferenceos.tuning.search import SearchResult
    from inferenceos.tuning.trials import TrialResult


def optimize_model(
    path: Path, n_layers: int, budget: float, *, has_gpu: bool,
    on_trial: Callable[[TrialResult], None],
) -> tuple[SearchResult, bool]:
    """(the search's result, whether its best was stored); the records are flushed
    before it returns."""
    from inferenceos.tuning import records
    from inferenceos.tuning.search import optimize as search

    sid = records.new_search_id()

    def record(res: TrialResult) -> None:
        records.trial(path, sid, res)
        on_trial(res)

    result = search(path, budget_s=budget, has_gpu=has_gpu, n_layers=n_layers,
                    on_trial=record)
    stored = result.compared > 0  # a best that no trial was compared with is no best
    if stored:
        records.best(path, sid, result)
    records.flush()
    return result, stored
