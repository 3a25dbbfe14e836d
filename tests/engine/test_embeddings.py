"""engine/embeddings.py: the embedding context beside a LoadedModel's main one."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferenceos.engine.session import LoadedModel
from inferenceos.errors import UsageError
from inferenceos.plan.llama_params import LlamaParams


def test_embeddings_survive_a_sleep_and_wake(tiny_llama: Path) -> None:
    with LoadedModel(tiny_llama, LlamaParams(n_ctx=256, n_threads=1)) as lm:
        before = lm.embed_many(["abc abc", [5, 6, 7]])
        lm.free_context()  # a warm model: both contexts gone, the weights kept
        assert lm._embedder._ctx is None
        lm.open_context()
        after = lm.embed_many(["abc abc", [5, 6, 7]])
        for a, b in zip(after, before, strict=True):
            assert a == pytest.approx(b, abs=1e-5)
        assert sum(v * v for v in before[0]) == pytest.approx(1.0)
        with pytest.raises(UsageError, match="outside the vocabulary"):
            lm.embed_many([[lm.n_vocab]])
