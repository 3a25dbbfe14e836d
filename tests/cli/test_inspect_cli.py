"""`inferenceos inspect` as a user runs it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFWriter

from cli_helpers import run_cli

REQUIRED = {
    "architecture", "block_count", "embedding_length", "head_count", "head_count_kv",
    "context_length", "expert_count", "expert_used_count", "vocab_size", "parameters",
    "size_bytes", "layers",
}


def test_json_has_the_documented_keys(tiny_moe: Path) -> None:
    r = run_cli("inspect", str(tiny_moe), "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert set(data) >= REQUIRED
    assert data["expert_count"] == 4 and data["block_count"] == 2
    assert [layer["index"] for layer in data["layers"]] == [0, 1]
    assert all(layer["bytes"] > layer["expert_bytes"] > 0 for layer in data["layers"])
    assert len(data["sha256"]) == 64


def test_table_shows_layers_and_swa(tiny_swa: Path) -> None:
    r = run_cli("inspect", str(tiny_swa), "--no-digest", COLUMNS="160")
    assert r.returncode == 0, r.stderr
    assert "sliding window" in r.stdout and "32 on layers 0, 2" in r.stdout
    assert "Bytes per layer" in r.stdout and "token_embd" in r.stdout


def test_hostile_strings_cannot_reach_the_terminal(tmp_path: Path) -> None:
    path = tmp_path / "evil.gguf"
    w = GGUFWriter(str(path), "llama")
    w.add_name("[/]\x1b]0;pwned\x07[bold]x")  # Rich markup + an OSC title escape
    w.add_uint32("llama.block_count", 0)
    w.add_uint32("llama.embedding_length", 4)
    w.add_tensor("token_embd.weight", np.zeros((3, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    r = run_cli("inspect", str(path), "--no-digest")
    assert r.returncode == 0, r.stderr
    assert "\x1b]" not in r.stdout and "\x07" not in r.stdout
    assert "[/]" in r.stdout  # shown literally, not parsed as markup


@pytest.mark.slow
def test_gemma_inspect_matches_the_file(gemma_path: Path) -> None:
    r = run_cli("inspect", str(gemma_path), "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert (d["block_count"], d["embedding_length"], d["head_count"], d["head_count_kv"]) == (
        18, 640, 4, 1,
    )
    layer_total = sum(layer["bytes"] for layer in d["layers"])
    assert layer_total + sum(d["non_layer_bytes"].values()) == d["tensor_data_size"]
    assert d["sha256"] == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
