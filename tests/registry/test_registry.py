"""Registry: strict names and digests, the blob store and its SQLite index."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferenceos.errors import GGUFFormatError, ModelNotFoundError
from inferenceos.registry.catalog import Catalog
from inferenceos.registry.names import InvalidNameError, canonical, parse_digest, parse_name
from inferenceos.registry.store import ModelStore, name_for_file


@pytest.mark.parametrize("text, expected", [
    ("gemma3-270m", "gemma3-270m:latest"),
    ("Gemma3-270M:Q4_K_M", "gemma3-270m:Q4_K_M"),
    ("me/tiny:v1.2", "me/tiny:v1.2"),
])
def test_names_are_canonicalised(text: str, expected: str) -> None:
    assert canonical(text) == expected


@pytest.mark.parametrize("text", [
    "", "../etc/passwd", "a/../../b", "a/b/c", "/abs", "a:b:c", "a b", "a\x00b",
    "a..b", "-lead", "trail-", "x" * 300, "sha256:../../x", "a:../b", "ü", "a/",
])
def test_bad_names_are_refused(text: str) -> None:
    with pytest.raises(InvalidNameError):
        parse_name(text)


def test_digests_are_strict() -> None:
    hex_ = "a" * 64
    assert parse_digest(f"sha256:{hex_}") == hex_
    assert parse_digest(f"sha256-{hex_}") == hex_
    for bad in ("sha256:" + "a" * 63, "sha256:../../../../etc/passwd", "md5:" + hex_,
                "sha256:" + "A" * 64, f"sha256:{hex_}/x"):
        with pytest.raises(InvalidNameError):
            parse_digest(bad)


def test_blob_path_stays_in_the_blob_dir(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    assert store.blob_path("b" * 64).parent == store.blobs
    with pytest.raises(InvalidNameError):
        store.blob_path("../" + "b" * 61)


def test_name_for_file() -> None:
    assert name_for_file(Path("/x/My_Model.Q4 K.gguf")) == "my_model.q4-k:latest"
    assert name_for_file(Path("/x/...gguf")) == "model:latest"


def test_import_list_copy_remove(tmp_path: Path, tiny_llama: Path) -> None:
    store = ModelStore(tmp_path / "models")
    e = store.import_file(tiny_llama, "tiny")
    assert e.name == "tiny:latest" and e.path.is_file()
    assert e.path.read_bytes() == tiny_llama.read_bytes()
    assert e.path.name == f"sha256-{e.digest}" and e.architecture == "llama"
    c = store.copy("tiny", "other:v2")
    assert c.digest == e.digest and [m.name for m in store.list()] == ["other:v2", "tiny:latest"]
    store.remove("tiny")
    assert e.path.is_file()  # still used by other:v2
    store.remove("other:v2")
    assert not e.path.exists() and store.list() == []
    with pytest.raises(ModelNotFoundError):
        store.remove("other:v2")


def test_reimport_shares_the_blob_and_link_mode(tmp_path: Path, tiny_llama: Path) -> None:
    store = ModelStore(tmp_path / "models")
    a = store.import_file(tiny_llama, "a", link=True)
    b = store.import_file(tiny_llama, "b")
    assert a.path == b.path
    assert len(list(store.blobs.iterdir())) == 1  # no leftover partial files


def test_import_refuses_non_gguf(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    store = ModelStore(tmp_path / "models")
    with pytest.raises(GGUFFormatError):
        store.import_file(bad)
    assert store.list() == []


def test_pull_without_network_says_so(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="not from Ollama's library"):
        ModelStore(tmp_path).pull("llama3:8b")


def test_catalog_resolves_aliases_then_registry(tmp_path: Path, tiny_llama: Path,
                                                tiny_moe: Path) -> None:
    store = ModelStore(tmp_path / "models")
    store.import_file(tiny_moe, "moe")
    catalog = Catalog(store, [tiny_llama])
    assert catalog.resolve("tiny-llama").path == tiny_llama.resolve()
    assert catalog.resolve("moe:latest").architecture == "llama"
    assert [m.name for m in catalog.names()] == ["tiny-llama:latest", "moe:latest"]
    with pytest.raises(ModelNotFoundError):
        catalog.resolve("nope")
    with pytest.raises(InvalidNameError):
        catalog.resolve(str(tiny_llama))  # a client can never name a path


def test_index_survives_a_new_store_object(tmp_path: Path, tiny_llama: Path) -> None:
    ModelStore(tmp_path).import_file(tiny_llama, "tiny")
    assert ModelStore(tmp_path).get("tiny").size == tiny_llama.stat().st_size


def test_a_mistyped_name_through_the_server_gets_did_you_mean(tmp_path: Path,
                                                              tiny_llama: Path) -> None:
    """What an API client reads (the catalog's message): the closest names, whether
    registered or served from a file."""
    store = ModelStore(tmp_path / "models")
    store.import_file(tiny_llama, "qwen-coder")
    with pytest.raises(ModelNotFoundError, match=r"did you mean 'qwen-coder:latest'\?"):
        Catalog(store).resolve("qwen-codr")
    served = Catalog(store, [tiny_llama])
    with pytest.raises(ModelNotFoundError) as info:
        served.resolve("tiny-lama")
    assert "did you mean 'tiny-llama:latest'?" in str(info.value)
    assert "this server serves: tiny-llama:latest" in str(info.value)
    with pytest.raises(ModelNotFoundError) as info:
        store.get("qwen-cod")
    assert str(info.value) == "model 'qwen-cod:latest' not found; did you mean 'qwen-coder:latest'?"
