"""A reasoning budget of N > 0 tokens, kept by stopping and continuing: the core
(`BudgetWatch`, `forced_text`, `merged_metrics`) lives in engine/reasoning.py, where
`run` uses it too; server/generation.py drives it for every dialect.
"""

from __future__ import annotations

from inferenceos.engine.reasoning import (  # noqa: F401  (the server's names for them)
    FORCED_CLOSE,
    BudgetWatch,
    forced_text,
    merged_metrics,
)
