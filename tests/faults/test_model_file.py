"""The model file deleted, truncated or replaced while the model is loaded.

llama.cpp maps the weights: a deleted or atomically replaced file keeps its old bytes
for the loaded model (the mapping holds the old inode), and the next load finds the new
state of the path; a file truncated under the mapping kills the worker (SIGBUS on the
missing pages). Each case: a clear error, the other model unaffected, the registry
intact, and the model back without a restart once the file is."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from faults.helpers import generate, tags, unload
from server_harness import Harness, serving
from tiny_models import write_tiny_model


@pytest.fixture(scope="module")
def server(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[Harness, Path]]:
    """Models a and b, b registered in place (its path is the file under test); one
    server for the module: each test leaves b's file as it found it."""
    root = tmp_path_factory.mktemp("model-file")
    b = write_tiny_model(root / "b.gguf", "llama", seed=1)
    with serving({"a": tiny_llama, "b": b}, root) as h:
        yield h, h.catalog.resolve("b").path


@pytest.fixture
def two(server: tuple[Harness, Path]) -> tuple[Harness, Path]:
    h, _ = server
    assert generate(h, "a").status_code == 200 and generate(h, "b").status_code == 200
    return server


def _others_fine(h: Harness) -> None:
    assert generate(h, "a").status_code == 200
    assert tags(h) == ["a:latest", "b:latest"]


def test_truncated_while_loaded(two: tuple[Harness, Path]) -> None:
    h, path = two
    good = path.read_bytes()
    with open(path, "r+b") as f:
        f.truncate(1000)
    r = generate(h, "b")  # the worker touches pages past the end: SIGBUS
    assert r.status_code == 503 and "worker died" in r.json()["error"], r.text
    r = generate(h, "b")  # the restart reads the file: refused, saying why
    assert r.status_code == 500 and "truncated file" in r.json()["error"], r.text
    assert str(path) in r.json()["error"]
    _others_fine(h)
    path.write_bytes(good)  # the file is back: so is the model, no restart
    assert generate(h, "b").status_code == 200


def test_deleted_while_loaded(two: tuple[Harness, Path]) -> None:
    h, path = two
    keep = path.read_bytes()
    path.unlink()
    assert generate(h, "b").status_code == 200  # the mapping still holds the bytes
    unload(h, "b")
    r = generate(h, "b")
    assert r.status_code == 404 and "model file not found" in r.json()["error"], r.text
    _others_fine(h)
    path.write_bytes(keep)
    assert generate(h, "b").status_code == 200


@pytest.mark.parametrize("replacement", ["another-model", "garbage"])
def test_replaced_while_loaded(replacement: str, two: tuple[Harness, Path],
                               tmp_path: Path) -> None:
    """Replaced the way tools replace files (write beside, rename over)."""
    h, path = two
    keep = path.read_bytes()
    new = tmp_path / "new.gguf"
    if replacement == "garbage":
        new.write_bytes(b"GGUF" + os.urandom(4000))
    else:
        shutil.copy(write_tiny_model(tmp_path / "c.gguf", "llama", seed=2), new)
    os.replace(new, path)
    assert generate(h, "b").status_code == 200  # the loaded model is unaffected
    unload(h, "b")
    r = generate(h, "b")
    if replacement == "garbage":
        assert r.status_code == 500 and str(path) in r.json()["error"], r.text
    else:
        assert r.status_code == 200  # a valid model in the path loads (as Ollama's would)
    _others_fine(h)
    path.write_bytes(keep)
    assert generate(h, "b").status_code == 200
