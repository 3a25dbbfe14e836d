"""Ollama's `options` → sampling and load overrides (server/options.py), as Ollama reads
them: zero threads is "let the runtime decide", not a refusal."""

from __future__ import annotations

import pytest

from inferenceos.errors import UsageError
from inferenceos.server.options import ollama_options


def test_num_thread_zero_leaves_the_plan_its_threads() -> None:
    _, overrides = ollama_options({"num_thread": 0, "num_ctx": 512})
    assert "threads" not in overrides and overrides["n_ctx"] == 512
    _, overrides = ollama_options({"num_thread": 3})
    assert overrides["threads"] == 3


@pytest.mark.parametrize("options", [{"num_thread": -1}, {"num_ctx": 0}, {"num_ctx": 8},
                                     {"num_batch": 0}])
def test_impossible_load_options_are_refused(options: dict[str, int]) -> None:
    with pytest.raises(UsageError):
        ollama_options(options)
