"""Ollama `/api/show` capabilities through the real `ollama` client, as Ollama lists
them: "insert" for a model with FIM tokens (Qwen2.5-Coder: llama.cpp finds them by
their texts, the GGUF has no fim_*_token_id keys), "thinking" for a template with a
reasoning section (tests/thinking_model.py), neither for a plain chat model. No model
is loaded: the answer comes from the headers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import ollama
import pytest

from inferenceos.model.fim import has_fim
from server_harness import Harness, serving
from thinking_model import thinking_qwen


@pytest.fixture(scope="module")
def server(qwen05_path: Path, tiny_llama: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    thinker = thinking_qwen(qwen05_path, qwen05_path.parent)
    models = {"qwen": qwen05_path, "thinker": thinker, "tiny": tiny_llama}
    with serving(models, tmp_path_factory.mktemp("show-caps")) as h:
        yield h


def test_insert_and_thinking_are_listed_as_ollama_does(server: Harness) -> None:
    client = ollama.Client(host=server.url, timeout=60)
    qwen = client.show("qwen").capabilities or []
    thinker = client.show("thinker").capabilities or []
    tiny = client.show("tiny").capabilities or []
    assert "insert" in qwen and "thinking" not in qwen
    assert "insert" in thinker and "thinking" in thinker
    assert thinker.index("completion") < thinker.index("insert") < thinker.index("thinking")
    assert "insert" not in tiny and "thinking" not in tiny


def test_fim_from_metadata_keys_or_token_texts(qwen05_path: Path, tiny_llama: Path) -> None:
    assert has_fim(qwen05_path) and not has_fim(tiny_llama)
