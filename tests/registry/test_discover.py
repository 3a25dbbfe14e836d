"""`models discover`: Ollama's, LM Studio's and the Hugging Face cache's models (fake trees
built in tmp dirs with tiny GGUFs), registered in place under their familiar names."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from cli_helpers import run_cli
from fake_hub import tiny_split_gguf
from inferenceos.registry.discover import discover, ollama_name, scan
from inferenceos.registry.loadcheck import check_loadable
from inferenceos.registry.store import ModelStore
from tiny_models import write_tiny_model


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def ollama_tree(root: Path, model: Path) -> Path:
    """~/.ollama/models with llama3:8b, me/tiny:q8 and hf.co/org/repo:Q4_K_M, plus a
    broken manifest and one that names a path instead of a digest."""
    sha = _sha(model)
    (root / "blobs").mkdir(parents=True)
    (root / "blobs" / f"sha256-{sha}").write_bytes(model.read_bytes())
    manifest = {"schemaVersion": 2, "layers": [
        {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "0" * 64},
        {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{sha}"}]}
    for rel in ("registry.ollama.ai/library/llama3/8b", "registry.ollama.ai/me/tiny/q8",
                "hf.co/org/repo/Q4_K_M"):
        (root / "manifests" / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / "manifests" / rel).write_text(json.dumps(manifest))
    bad = root / "manifests/registry.ollama.ai/library/evil/latest"
    bad.parent.mkdir(parents=True)
    bad.write_text(json.dumps({"layers": [{"mediaType": "application/vnd.ollama.image.model",
                                           "digest": "sha256:../../../../etc/passwd"}]}))
    (root / "manifests/registry.ollama.ai/library/junk").mkdir()
    (root / "manifests/registry.ollama.ai/library/junk/latest").write_text("{not json")
    return root


def lmstudio_tree(root: Path, model: Path) -> Path:
    d = root / "lmstudio-community" / "Tiny-GGUF"
    d.mkdir(parents=True)
    (d / "Tiny-Q8_0.gguf").write_bytes(model.read_bytes())
    (d / "mmproj-Tiny-F16.gguf").write_bytes(model.read_bytes())  # a projector: not a model
    return root


def hf_cache_tree(root: Path, model: Path) -> Path:
    d = root / "models--TheOrg--Tiny-GGUF"
    sha = _sha(model)
    (d / "blobs").mkdir(parents=True)
    (d / "blobs" / sha).write_bytes(model.read_bytes())
    snap = d / "snapshots" / ("a" * 40)
    snap.mkdir(parents=True)
    os.symlink(f"../../blobs/{sha}", snap / "Tiny-Q4_K_M.gguf")
    return root


@pytest.fixture
def places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_llama: Path) -> Path:
    """A fake home with all three tools' trees in their default places."""
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    for var in ("OLLAMA_MODELS", "HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    ollama_tree(home / ".ollama" / "models", tiny_llama)
    lmstudio_tree(home / ".lmstudio" / "models", tiny_llama)
    hf_cache_tree(home / ".cache" / "huggingface" / "hub", tiny_llama)
    return home


def test_ollama_names() -> None:
    assert ollama_name("registry.ollama.ai", "library", "llama3", "8b") == "llama3:8b"
    assert ollama_name("registry.ollama.ai", "me", "tiny", "q8") == "me/tiny:q8"
    assert ollama_name("hf.co", "org", "repo", "Q4_K_M") == "hf.co/org/repo:Q4_K_M"


def test_discover_registers_in_place(places: Path, tmp_path: Path, tiny_llama: Path) -> None:
    store = ModelStore(tmp_path / "models")
    outcomes = discover(store)
    added = {o.found.name: o.found for o in outcomes if o.status == "added"}
    assert set(added) == {"llama3:8b", "me/tiny:q8", "hf.co/org/repo:Q4_K_M",
                          "lmstudio-community/tiny-gguf:Q8_0", "hf.co/theorg/tiny-gguf:Q4_K_M"}
    skipped = {o.found.name: o.reason for o in outcomes if o.status == "skipped"}
    assert "invalid digest" in skipped["registry.ollama.ai/library/evil/latest"]
    assert "registry.ollama.ai/library/junk/latest" in skipped
    e = store.get("llama3:8b")
    assert e.in_place and e.path == places / ".ollama/models/blobs" / f"sha256-{e.digest}"
    assert e.digest == _sha(tiny_llama) and e.architecture == "llama"
    hf = store.get("hf.co/theorg/tiny-gguf:Q4_K_M")
    assert hf.path.name == "Tiny-Q4_K_M.gguf" and hf.path.is_symlink()  # the snapshot path
    assert not store.blobs.exists()  # nothing was copied
    # a second run changes nothing; rm forgets the name and keeps the file
    assert {o.status for o in discover(store) if o.found.name in added} == {"present"}
    store.remove("llama3:8b")
    assert e.path.is_file() and store.find("llama3:8b") is None
    store.remove("me/tiny:q8")  # shares the blob digest: still never deleted
    assert e.path.is_file()


def test_discover_does_not_take_a_name_in_use(places: Path, tmp_path: Path,
                                              tiny_moe: Path) -> None:
    store = ModelStore(tmp_path / "models")
    store.import_file(tiny_moe, "llama3:8b")
    outcomes = {o.found.name: o for o in discover(store)}
    assert outcomes["llama3:8b"].status == "skipped"
    assert "taken" in outcomes["llama3:8b"].reason
    assert store.get("llama3:8b").architecture == "llama" and not store.get("llama3:8b").in_place


def test_discover_folders_given(tmp_path: Path, tiny_llama: Path) -> None:
    folder = tmp_path / "mine"
    (folder / "deep" / "er").mkdir(parents=True)
    write_tiny_model(folder / "deep" / "er" / "My-Model.Q4.gguf", "llama")
    tiny_split_gguf(folder, 2, base="Big-Q8_0")
    (folder / "notes.gguf").write_bytes(b"not a model")
    os.symlink(folder, folder / "deep" / "loop")  # a symlinked folder is not followed
    store = ModelStore(tmp_path / "models")
    outcomes = {o.found.name: o for o in discover(store, [folder])}
    assert outcomes["my-model.q4:latest"].status == "added"
    split = store.get("big-q8_0:latest")
    assert split.parts == 2 and split.path.name == "Big-Q8_0-00001-of-00002.gguf"
    assert outcomes["notes:latest"].status == "skipped"
    assert str(folder) not in outcomes["notes:latest"].reason
    # with llama.cpp's check, a file it cannot load is skipped with its reason
    bad = tmp_path / "checked" / "Bad.gguf"
    bad.parent.mkdir()
    bad.write_bytes((folder / "deep" / "er" / "My-Model.Q4.gguf").read_bytes()
                    .replace(b"llama", b"llamz"))
    checked = discover(store, [bad.parent], check=check_loadable)
    assert [(o.status, o.reason) for o in checked] == \
        [("skipped", "llama.cpp cannot load this model: unknown model architecture: 'llamz'")]
    # a folder laid out like a tool's store is read as one
    ollama = ollama_tree(tmp_path / "elsewhere", tiny_llama)
    assert "llama3:8b" in {f.name for f in scan([ollama]) if hasattr(f, "tool")}


def test_discover_and_search_cli(places: Path, tmp_path: Path) -> None:
    env = {"HOME": str(places)}
    r = run_cli("models", "discover", "--dry-run", **env)
    assert r.returncode == 0, r.stderr
    assert "would-add" in r.stdout and "llama3:8b" in r.stdout
    assert run_cli("list", "--json", **env).stdout.strip() == "[]"
    r = run_cli("models", "discover", **env)
    assert r.returncode == 0 and "5 added" in r.stdout, r.stdout + r.stderr
    r = run_cli("models", "search", "tiny-gguf", **env)
    assert r.returncode == 0
    assert "hf.co/theorg/tiny-gguf:Q4_K_M" in r.stdout and "llama3" not in r.stdout
    assert "(in place)" in r.stdout
    r = run_cli("models", "search", "nothing-like-this", **env)
    assert r.returncode == 1 and "no registered model matches" in r.stderr
    r = run_cli("rm", "llama3:8b", **env)
    assert r.returncode == 0 and "stays where it is" in r.stdout
    r = run_cli("models", "discover", str(tmp_path / "missing"), **env)
    assert r.returncode != 0 and "not a folder" in r.stderr
