"""The server's vocabulary-only load (server/vocab.py) makes a prompt's ids exactly as
the model worker's `LoadedModel.tokenize` does (engine/llama/tokens.py, shared): the
ids an Ollama reply reports as its `context` are the ones the worker generated from."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferenceos.engine.session import LoadedModel
from inferenceos.plan.llama_params import LlamaParams
from inferenceos.server.vocab import Vocab


@pytest.mark.parametrize("text", ["abc", "<s>abc", "", "héllo <s> wörld"])
@pytest.mark.parametrize("add_special", [True, False])
def test_the_servers_ids_are_the_workers(tiny_llama: Path, text: str,
                                         add_special: bool) -> None:
    vocab = Vocab(tiny_llama)
    with LoadedModel(tiny_llama, LlamaParams(n_ctx=64, n_batch=64, n_threads=1)) as lm:
        worker = lm.tokenize(text, add_special=add_special)
    ids = vocab.prompt_ids(text, add_special)
    assert ids == worker
    if text.startswith("<s>") and add_special:  # a BOS the text wrote is not doubled
        assert ids[0] == vocab.bos and ids[1] != vocab.bos
