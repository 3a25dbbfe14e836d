"""A registry entry's projector: imported and pulled with its model (real SQLite, real
files, a fake Hub on loopback), kept by cp, removed with its last name, older databases
migrated, resolved for run/serve, shown by `models show` and Ollama's /api/show."""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import httpx
import ollama
import pytest

import inferenceos.sqlite_db as sqlite_db
from cli_helpers import run_cli
from fake_hub import FakeHub, tiny_gguf, tiny_projector
from inferenceos.api import resolve, resolve_projector
from inferenceos.errors import ModelNotFoundError, UsageError
from inferenceos.model.projector_files import find_projector
from inferenceos.registry import store as store_mod
from inferenceos.registry.catalog import Catalog
from inferenceos.registry.discover import discover
from inferenceos.registry.hub import PullEvent, pull, pull_events
from inferenceos.registry.store import ModelStore
from server_harness import serving

REPO = "TheOrg/Tiny-VL-GGUF"
NAME = "hf.co/theorg/tiny-vl-gguf"


def _no_check(_: Path) -> None:
    """Hub pulls here skip llama.cpp's load check (test_hub.py covers it)."""


@pytest.fixture
def vl_folder(tmp_path: Path, tiny_llama: Path) -> Path:
    """`Tiny-VL-Q4_K_M.gguf` and its projector `mmproj-Tiny-VL-f16.gguf`, side by side."""
    d = tmp_path / "vl"
    d.mkdir()
    shutil.copyfile(tiny_llama, d / "Tiny-VL-Q4_K_M.gguf")
    tiny_projector(d / "mmproj-Tiny-VL-f16.gguf")
    return d


@pytest.fixture
def store(tmp_path: Path) -> ModelStore:
    return ModelStore(tmp_path / "models")


def blobs(store: ModelStore) -> list[str]:
    return sorted(p.name for p in store.blobs.iterdir())


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- the store ---------------------------------------------------------------------------


def test_import_takes_the_projector_beside_and_rm_removes_it_last(
        store: ModelStore, vl_folder: Path) -> None:
    proj = vl_folder / "mmproj-Tiny-VL-f16.gguf"
    e = store.import_file(vl_folder / "Tiny-VL-Q4_K_M.gguf", "vl")
    assert e.projector_digest == sha(proj) and e.projector_location is None
    assert e.projector == store.blob_path(sha(proj)) and e.projector.read_bytes() == \
        proj.read_bytes()
    c = store.copy("vl", "vl:tagged")  # `cp`/tag keeps it
    assert c.projector == e.projector
    other = store.import_file(vl_folder / "Tiny-VL-Q4_K_M.gguf", "same-projector",
                              projector=proj)
    assert other.projector == e.projector and len(blobs(store)) == 2  # shared blobs
    store.remove("vl")
    store.remove("vl:tagged")
    assert e.projector.is_file()  # still used by same-projector
    store.remove("same-projector")
    assert blobs(store) == []


def test_import_without_or_with_a_named_projector(store: ModelStore, vl_folder: Path,
                                                  tiny_llama: Path) -> None:
    model = vl_folder / "Tiny-VL-Q4_K_M.gguf"
    assert store.import_file(model, "text", projector=None).projector is None
    with pytest.raises(UsageError, match="not a multimodal projector"):
        store.import_file(model, "bad", projector=tiny_llama)
    assert store.find("bad") is None
    named = tiny_projector(vl_folder.parent / "elsewhere.gguf", weights="f32")
    e = store.import_file(model, "named", projector=named)
    assert e.projector is not None and e.projector.read_bytes() == named.read_bytes()
    # a model that fails its checks stores no projector either
    bad = vl_folder / "broken.gguf"
    bad.write_bytes(b"GGUF")
    lone = tiny_projector(vl_folder.parent / "lone.gguf", seed=5)
    with pytest.raises(Exception, match=r"broken\.gguf"):
        store.import_file(bad, "broken", projector=lone)
    assert not store.blob_path(sha(lone)).exists() and store.find("broken") is None


def test_importing_a_projector_as_a_model_says_what_it_is(store: ModelStore,
                                                          vl_folder: Path) -> None:
    with pytest.raises(UsageError, match="mmproj-Tiny-VL-f16.gguf is a multimodal projector "
                                         r"\(mmproj\), not a model"):
        store.import_file(vl_folder / "mmproj-Tiny-VL-f16.gguf")
    assert store.list() == []


def test_the_tiny_vlm_pair_finds_its_projector(tiny_vlm_pair: tuple[Path, Path],
                                               store: ModelStore) -> None:
    """The real pair mtmd loads (tests/tiny_vlm.py): `model.gguf` + `mmproj.gguf`."""
    model, mmproj = tiny_vlm_pair
    assert find_projector(model) == mmproj
    e = store.import_file(model, "tiny-vlm")
    assert e.projector is not None and e.projector.read_bytes() == mmproj.read_bytes()


def test_a_projector_that_vanished_is_not_resolved(store: ModelStore,
                                                   vl_folder: Path) -> None:
    e = store.import_file(vl_folder / "Tiny-VL-Q4_K_M.gguf", "vl")
    assert Catalog(store).resolve("vl").mmproj == e.projector
    assert e.projector is not None
    e.projector.unlink()
    assert Catalog(store).resolve("vl").mmproj is None  # text still works


def test_register_in_place_and_set_projector(store: ModelStore, vl_folder: Path) -> None:
    model, proj = vl_folder / "Tiny-VL-Q4_K_M.gguf", vl_folder / "mmproj-Tiny-VL-f16.gguf"
    e = store.register_in_place(model, "here", sha(model), "folder", projector=proj)
    assert e.projector == proj.absolute() and e.projector_digest is None
    store.remove("here")
    assert proj.is_file() and model.is_file()  # files in place are never deleted
    e = store.register_in_place(model, "here", sha(model), "folder")
    assert e.projector is None
    # an entry from before projectors: resolved with the one beside its file
    assert Catalog(store).resolve("here").mmproj == proj
    assert store.set_projector("here", location=proj).projector == proj.absolute()
    assert store.set_projector("here").projector is None
    with pytest.raises(ModelNotFoundError):
        store.set_projector("nope", location=proj)


def test_a_version_2_registry_is_migrated(tmp_path: Path, tiny_llama: Path) -> None:
    """A registry written before projectors existed opens, keeps its models, and takes
    projectors afterwards."""
    root = tmp_path / "old"
    root.mkdir()
    conn = sqlite_db.connect(root / "registry.db")
    sqlite_db.migrate(conn, store_mod._MIGRATIONS[:2])
    with conn:
        conn.execute("INSERT INTO models (name, digest, size, source, architecture, "
                     "file_type, parameters, context_length, modified_at, parts, location) "
                     "VALUES ('old:latest', ?, 1, 'x', 'llama', 'F32', 1, 256, 0, 1, ?)",
                     (sha(tiny_llama), str(tiny_llama)))
    conn.close()
    store = ModelStore(root)
    (e,) = store.list()
    assert e.name == "old:latest" and e.projector is None and e.path == tiny_llama
    with sqlite3.connect(root / "registry.db") as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == len(store_mod._MIGRATIONS)
    proj = tiny_projector(tmp_path / "p.gguf")
    assert store.set_projector("old", location=proj).projector == proj


# -- discover ----------------------------------------------------------------------------


def test_discover_records_projectors_in_place(store: ModelStore, vl_folder: Path,
                                              tiny_llama: Path, tmp_path: Path) -> None:
    (out,) = discover(store, [vl_folder])
    assert out.status == "added" and out.found.projector == vl_folder / \
        "mmproj-Tiny-VL-f16.gguf"
    assert store.get(out.found.name).projector_location == str(out.found.projector)
    # Ollama keeps a vision model's projector as a layer of its manifest
    root = tmp_path / "ollama"
    (root / "blobs").mkdir(parents=True)
    layers = []
    for kind, src in (("model", tiny_llama), ("projector", vl_folder / "mmproj-Tiny-VL-f16.gguf")):
        digest = sha(src)
        shutil.copyfile(src, root / "blobs" / f"sha256-{digest}")
        layers.append({"mediaType": f"application/vnd.ollama.image.{kind}",
                       "digest": f"sha256:{digest}", "size": src.stat().st_size})
    manifest = root / "manifests" / "registry.ollama.ai" / "library" / "llava" / "7b"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": layers}))
    (out,) = discover(store, [root])
    assert out.status == "added" and out.found.name == "llava:7b"
    assert store.get("llava:7b").projector == root / "blobs" / f"sha256-{layers[1]['digest'][7:]}"


def test_rediscover_adds_a_projector_found_since(store: ModelStore, tiny_llama: Path,
                                                 tmp_path: Path) -> None:
    d = tmp_path / "later"
    d.mkdir()
    shutil.copyfile(tiny_llama, d / "Tiny-VL-Q4_K_M.gguf")
    (first,) = discover(store, [d])
    assert store.get(first.found.name).projector is None
    proj = tiny_projector(d / "mmproj-F16.gguf")
    (again,) = discover(store, [d])
    assert again.status == "present" and store.get(first.found.name).projector == proj


# -- Hub pulls ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hub_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    d = tmp_path_factory.mktemp("hub-vl")
    return {
        "Tiny-VL-Q4_K_M.gguf": tiny_gguf(d, "llama"),
        "mmproj-Tiny-VL-F32.gguf": tiny_projector(d / "a.gguf", weights="f32").read_bytes(),
        "mmproj-Tiny-VL-F16.gguf": tiny_projector(d / "b.gguf", weights="f16").read_bytes(),
        "mmproj-Tiny-VL-Q8_0.gguf": tiny_projector(d / "c.gguf", weights="q8_0").read_bytes(),
    }


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        hub_files: dict[str, bytes]) -> Iterator[FakeHub]:
    h = FakeHub(repos={REPO: dict(hub_files)}).start()
    monkeypatch.setenv("HF_ENDPOINT", h.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    for var in ("HF_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_CACHE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    yield h
    h.stop()


def test_pull_fetches_the_f16_projector_with_the_model(hub: FakeHub, store: ModelStore,
                                                       hub_files: dict[str, bytes]) -> None:
    events: list[PullEvent] = []
    e = pull(store, f"hf.co/{REPO}:Q4_K_M", events.append, check=_no_check)
    want = hub_files["mmproj-Tiny-VL-F16.gguf"]
    assert e.projector is not None and e.projector.read_bytes() == want
    assert e.projector_digest == hashlib.sha256(want).hexdigest()
    assert "projector: mmproj-Tiny-VL-F16.gguf" in [ev.status for ev in events]
    assert len(hub.gets("mmproj-Tiny-VL-F16.gguf")) == 1
    assert not hub.gets("mmproj-Tiny-VL-F32.gguf") and not hub.gets("mmproj-Tiny-VL-Q8_0.gguf")
    assert not [p for p in blobs(store) if p.startswith(".")]  # no partial left
    again = [ev.status for ev in pull_events(store, f"hf.co/{REPO}:Q4_K_M", check=_no_check)]
    assert "already up to date" in again and len(hub.gets("mmproj-Tiny-VL-F16.gguf")) == 1
    store.remove(e.name)
    assert blobs(store) == []


def test_an_entry_without_its_projector_gets_it_on_the_next_pull(
        hub: FakeHub, store: ModelStore, hub_files: dict[str, bytes]) -> None:
    e = pull(store, f"hf.co/{REPO}:Q4_K_M", check=_no_check)
    store.set_projector(e.name)  # as pulled before projectors were fetched
    assert blobs(store) == [f"sha256-{e.digest}"]  # the unused projector blob went
    model_gets = len(hub.gets("Tiny-VL-Q4_K_M.gguf"))
    again = pull(store, f"hf.co/{REPO}:Q4_K_M", check=_no_check)
    assert again.projector is not None
    assert again.projector.read_bytes() == hub_files["mmproj-Tiny-VL-F16.gguf"]
    assert len(hub.gets("Tiny-VL-Q4_K_M.gguf")) == model_gets  # the model was not fetched
    assert not [p for p in blobs(store) if p.startswith(".")]  # the claim left no file


def test_a_projector_that_is_not_one_is_skipped(hub: FakeHub, store: ModelStore,
                                                hub_files: dict[str, bytes],
                                                tmp_path: Path) -> None:
    hub.repos[REPO] = {"Tiny-VL-Q4_K_M.gguf": hub_files["Tiny-VL-Q4_K_M.gguf"],
                       "mmproj-Tiny-VL-F16.gguf": tiny_gguf(tmp_path, "moe")}
    events = [ev.status for ev in pull_events(store, f"hf.co/{REPO}:Q4_K_M",
                                              check=_no_check)]
    note = next(s for s in events if s.startswith("skipping"))
    assert "not a multimodal projector" in note and "'llama'" in note
    entry = store.get(f"{NAME}:Q4_K_M")
    assert entry.projector is None and blobs(store) == [f"sha256-{entry.digest}"]
    # one for a model of another width (mtmd would refuse the pair) is skipped too
    hub.repos[REPO]["mmproj-Tiny-VL-F16.gguf"] = \
        tiny_projector(tmp_path / "wide.gguf", n_embd_text=96).read_bytes()
    events = [ev.status for ev in pull_events(store, f"hf.co/{REPO}:Q4_K_M",
                                              check=_no_check)]
    assert any("output width (96) is not the model's embedding width (64)" in s
               for s in events)
    assert store.get(f"{NAME}:Q4_K_M").projector is None


def test_a_cut_projector_download_fails_the_pull_and_resumes(
        hub: FakeHub, store: ModelStore, hub_files: dict[str, bytes]) -> None:
    hub.cut["mmproj-Tiny-VL-F16.gguf"] = 1000
    with pytest.raises(Exception, match="interrupted"):
        pull(store, f"hf.co/{REPO}:Q4_K_M", retries=0, check=_no_check)
    assert store.list() == []  # the model does not appear without its projector
    e = pull(store, f"hf.co/{REPO}:Q4_K_M", check=_no_check)
    assert [g.range for g in hub.gets("mmproj-Tiny-VL-F16.gguf")] == [None, "bytes=1000-"]
    assert len(hub.gets("Tiny-VL-Q4_K_M.gguf")) == 1  # the verified model download was kept
    assert e.projector is not None


def test_offline_pull_takes_the_projector_from_the_hf_cache(
        hub: FakeHub, store: ModelStore, hub_files: dict[str, bytes], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    repo = tmp_path / "hf-home" / "hub" / f"models--{REPO.replace('/', '--')}"
    snap = repo / "snapshots" / ("1" * 40)
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    for name in ("Tiny-VL-Q4_K_M.gguf", "mmproj-Tiny-VL-F16.gguf", "mmproj-Tiny-VL-F32.gguf"):
        digest = hashlib.sha256(hub_files[name]).hexdigest()
        (repo / "blobs" / digest).write_bytes(hub_files[name])
        (snap / name).symlink_to(f"../../blobs/{digest}")
    e = pull(store, f"hf.co/{REPO}:Q4_K_M", check=_no_check)
    assert e.projector is not None
    assert e.projector.read_bytes() == hub_files["mmproj-Tiny-VL-F16.gguf"]
    assert hub.requests == []


# -- resolution for run / serve ----------------------------------------------------------


def test_resolve_projector(vl_folder: Path, tiny_llama: Path) -> None:
    model, proj = vl_folder / "Tiny-VL-Q4_K_M.gguf", vl_folder / "mmproj-Tiny-VL-f16.gguf"
    assert resolve_projector(str(model)) == proj  # a path: the one beside it
    assert resolve_projector(str(model), "none") is None
    assert resolve_projector(str(model), "NONE") is None
    other = tiny_projector(vl_folder.parent / "other.gguf")
    assert resolve_projector(str(model), str(other)) == other  # --mmproj FILE wins
    with pytest.raises(UsageError, match="not a multimodal projector"):
        resolve_projector(str(model), str(tiny_llama))
    with pytest.raises(ModelNotFoundError, match="no such file"):
        resolve_projector(str(model), str(vl_folder / "missing.gguf"))
    assert resolve_projector("") is None and resolve_projector(str(tiny_llama)) is None
    # a registry name: what its entry records (the default store of this test's home)
    ModelStore().import_file(model, "vl")
    assert resolve("vl") != model and resolve_projector("vl") == ModelStore().get("vl").projector
    assert resolve_projector("vl", "none") is None
    assert resolve_projector("not-registered") is None
    catalog = Catalog(ModelStore())
    assert catalog.add_file(model, "served").mmproj == proj
    assert catalog.add_file(model, "text-only", mmproj="none").mmproj is None
    assert catalog.add_file(model, "named", mmproj=other).mmproj == other


# -- the CLI and the server --------------------------------------------------------------


def test_models_pull_show_rm_with_a_projector(vl_folder: Path, tiny_llama: Path) -> None:
    r = run_cli("models", "pull", str(vl_folder / "Tiny-VL-Q4_K_M.gguf"), "--name", "vl")
    assert r.returncode == 0, r.stderr
    assert "projector" in r.stdout
    shown = json.loads(run_cli("models", "show", "vl", "--json").stdout)
    proj = shown["projector"]
    assert proj["type"] == "mlp" and proj["vision"] and not proj["audio"]
    assert proj["weights"] == "F16" and proj["problem"] == "" and Path(proj["path"]).is_file()
    text = run_cli("models", "show", "vl").stdout
    assert "projector" in text and "mlp, vision, F16" in text
    assert "llama F32 +mmproj" in run_cli("models", "list").stdout
    Path(proj["path"]).unlink()
    text = run_cli("models", "show", "vl").stdout
    assert "(missing: images cannot be used" in text
    r = run_cli("models", "pull", str(vl_folder / "Tiny-VL-Q4_K_M.gguf"), "--name", "t",
                "--mmproj", "none")
    assert r.returncode == 0 and "none (text only)" in run_cli("models", "show", "t").stdout
    r = run_cli("models", "pull", str(vl_folder / "Tiny-VL-Q4_K_M.gguf"), "--mmproj",
                str(tiny_llama))
    assert r.returncode == 2 and "not a multimodal projector" in r.stderr
    assert "Traceback" not in r.stderr
    r = run_cli("models", "pull", "hf.co/a/b", "--mmproj", "x.gguf")
    assert r.returncode == 2 and "--mmproj is for a local .gguf file" in r.stderr
    assert run_cli("models", "rm", "vl", "t").returncode == 0


def test_api_show_reports_the_projector(vl_folder: Path, tiny_llama: Path,
                                        tmp_path: Path) -> None:
    models = {"vl": vl_folder / "Tiny-VL-Q4_K_M.gguf", "tiny": tiny_llama}
    with serving(models, tmp_path / "srv") as h:
        client = ollama.Client(host=h.url)
        shown = client.show("vl")
        assert shown.capabilities is not None and "vision" in shown.capabilities
        assert "vision" not in (client.show("tiny").capabilities or [])
        families = {m.model: m.details.families for m in client.list().models if m.details}
        assert families["vl:latest"] == ["llama", "clip"] and families["tiny:latest"] == \
            ["llama"]
        # the ollama client (0.6) does not model projector_info: read the JSON itself
        raw = httpx.post(h.url + "/api/show", json={"model": "vl"}).json()
        assert raw["projector_info"]["general.architecture"] == "clip"
        assert raw["projector_info"]["clip.projector_type"] == "mlp"
        assert httpx.post(h.url + "/api/show",
                          json={"model": "tiny"}).json()["projector_info"] is None
