"""Pulls from a fake Hugging Face Hub on loopback (tests/fake_hub.py): names, quant choice,
resume after a cut, digest checks, split GGUFs, llama.cpp's load check, tokens, offline."""

from __future__ import annotations

import errno
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from fake_hub import FakeHub, tiny_gguf, tiny_projector, tiny_split_gguf
from inferenceos.errors import ModelLoadError, ModelNotFoundError, UsageError
from inferenceos.model.spec import load_spec
from inferenceos.registry import hub as hubmod
from inferenceos.registry import hub_download
from inferenceos.registry.catalog import Catalog
from inferenceos.registry.hub import HubError, PullEvent, pull, pull_events
from inferenceos.registry.hub_names import (
    Candidate,
    HubFile,
    HubRef,
    candidates,
    choose,
    parse_hub_ref,
    quant_label,
)
from inferenceos.registry.loadcheck import check_loadable
from inferenceos.registry.names import InvalidNameError
from inferenceos.registry.store import ModelStore

REPO = "TheOrg/Tiny-GGUF"
NAME = "hf.co/theorg/tiny-gguf"
GiB = 1 << 30


@pytest.fixture(scope="module")
def blobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """Three tiny models of different sizes, standing for three quants."""
    d = tmp_path_factory.mktemp("hub-models")
    return {"Tiny-Q4_K_M.gguf": tiny_gguf(d, "llama"), "Tiny-Q8_0.gguf": tiny_gguf(d, "moe"),
            "mmproj-Tiny-F16.gguf": tiny_projector(d / "mmproj.gguf").read_bytes()}


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        blobs: dict[str, bytes]) -> Iterator[FakeHub]:
    h = FakeHub(repos={REPO: {**blobs, "README.md": b"# tiny\n"}}).start()
    monkeypatch.setenv("HF_ENDPOINT", h.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # no saved login, empty cache
    for var in ("HF_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_CACHE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    yield h
    h.stop()


@pytest.fixture
def store(tmp_path: Path) -> ModelStore:
    return ModelStore(tmp_path / "models")


def leftovers(store: ModelStore) -> list[str]:
    return sorted(p.name for p in store.blobs.iterdir() if p.name.startswith("."))


# -- names -------------------------------------------------------------------------------


def test_hub_names_parse() -> None:
    assert parse_hub_ref("hf.co/a/b:Q4_K_M") == HubRef("a/b", "Q4_K_M")
    assert parse_hub_ref("huggingface.co/a/b") == HubRef("a/b")
    r = parse_hub_ref("hf.co/Org/Repo-GGUF/sub/Model-Q8_0.gguf")
    assert (r.repo, r.quant, r.file) == ("Org/Repo-GGUF", None, "sub/Model-Q8_0.gguf")
    assert r.registry_name("Q8_0") == "hf.co/org/repo-gguf:Q8_0"
    assert parse_hub_ref("hf.co/a/b").registry_name() == "hf.co/a/b:latest"


@pytest.mark.parametrize("text", [
    "hf.co/../b", "hf.co/a/..", "hf.co/a/../b", "hf.co/..:Q4", "hf.co/a/b:../x",
    "hf.co/a/b:..", "hf.co//etc/passwd", "hf.co/a//x.gguf", "hf.co/a/b//etc/passwd.gguf",
    "hf.co/a/b/../../../etc/x.gguf", "hf.co/a/b/sub/../../x.gguf", "hf.co/a/b/./x.gguf",
    "hf.co/a\\b/x.gguf", "hf.co/a/b/..\\x.gguf", "hf.co/a/b/x\x00.gguf", "hf.co/a\x00/b",
    "hf.co/a/b:Q4\x00", "hf.co/a/b/%2e%2e/x.gguf", "hf.co/a/b/x.bin", "hf.co/a", "hf.co/",
    "hf.co/-a/b", "hf.co/a/b/.hidden.gguf", "hf.co/a/b/x\n.gguf", "/etc/passwd",
])
def test_bad_hub_names_are_refused_before_any_request(text: str, hub: FakeHub,
                                                       store: ModelStore) -> None:
    with pytest.raises(InvalidNameError):
        list(pull_events(store, text))
    assert hub.requests == [] and not store.blobs.exists()


def test_quant_labels() -> None:
    assert quant_label("Llama-3.2-1B-Instruct-Q4_K_M.gguf") == "Q4_K_M"
    assert quant_label("x.IQ2_XXS.gguf") == "IQ2_XXS"
    assert quant_label("Q5_K_S/model-00001-of-00002.gguf") == "Q5_K_S"
    assert quant_label("m-UD-Q4_K_XL-00001-of-00003.gguf") == "UD-Q4_K_XL"
    assert quant_label("tinyllama-bf16.gguf") == "BF16"
    assert quant_label("model.gguf") is None
    assert quant_label("Qwen2-7B.gguf") is None  # a model size is not a quant


def _f(path: str, size: int) -> HubFile:
    return HubFile(path, size, hashlib.sha256(path.encode()).hexdigest())


def test_candidates_group_splits_and_skip_projectors() -> None:
    files = [_f("m-Q4_K_M.gguf", 4), _f("mmproj-m-f16.gguf", 1), _f("README.md", 1),
             _f("Q8_0/m-Q8_0-00001-of-00002.gguf", 5), _f("Q8_0/m-Q8_0-00002-of-00002.gguf", 5),
             _f("m-F16-00001-of-00002.gguf", 9)]  # incomplete: left out
    cands = candidates(files)
    assert [(c.label, c.size, len(c.files)) for c in cands] == [("Q4_K_M", 4, 1),
                                                              ("Q8_0", 10, 2)]


def test_choose_the_best_quant_that_fits() -> None:
    cands = [Candidate("Q4_K_M", (_f("a", 4 * GiB),)), Candidate("Q8_0", (_f("b", 8 * GiB),)),
             Candidate("F16", (_f("c", 15 * GiB),)), Candidate("Q6_K", (_f("d", 6 * GiB),))]
    assert choose(cands, None, 64 * GiB, "x")[0].label == "Q8_0"  # quantized before float
    assert choose(cands, None, 9 * GiB, "x")[0].label == "Q6_K"  # 80 %: 7.2 GiB
    pick, why = choose(cands, None, 2 * GiB, "x")
    assert pick.label == "Q4_K_M" and "smallest" in why
    assert "80%" in choose(cands, None, 64 * GiB, "x")[1]
    assert choose(cands[2:3], None, 1 * GiB, "x")[0].label == "F16"  # the only one
    assert choose(cands, "q6_k", 1, "x")[0].label == "Q6_K"  # case-insensitive
    with pytest.raises(ModelNotFoundError, match="Q4_K_M, Q6_K, Q8_0"):
        choose(cands, "Q2_K", None, "x")


# -- pulls -------------------------------------------------------------------------------


def test_pull_by_quant(hub: FakeHub, store: ModelStore, blobs: dict[str, bytes]) -> None:
    events: list[PullEvent] = []
    e = pull(store, f"hf.co/{REPO}:Q8_0", events.append)
    data = blobs["Tiny-Q8_0.gguf"]
    assert e.name == f"{NAME}:Q8_0" and e.digest == hashlib.sha256(data).hexdigest()
    assert e.path.read_bytes() == data and e.size == len(data)
    statuses = [ev.status for ev in events]
    assert statuses[0] == "pulling manifest" and statuses[-1] == "success"
    assert "verifying sha256 digest" in statuses
    assert "checking that llama.cpp can load it" in statuses
    last = [ev for ev in events if ev.total and ev.digest == e.digest][-1]  # not the mmproj's
    assert last.completed == last.total == len(data)
    assert last.to_ollama()["digest"] == f"sha256:{e.digest}"
    assert leftovers(store) == [] and [m.name for m in store.list()] == [e.name]
    assert not hub.gets("Tiny-Q4_K_M.gguf")  # only the chosen file was fetched
    # a second pull of the same name downloads nothing
    before = len(hub.gets("Tiny-Q8_0.gguf"))
    again = [ev.status for ev in pull_events(store, f"hf.co/{REPO}:Q8_0")]
    assert "already up to date" in again and len(hub.gets("Tiny-Q8_0.gguf")) == before


def test_pull_default_quant_and_named_file(hub: FakeHub, store: ModelStore) -> None:
    events = list(pull_events(store, f"hf.co/{REPO}", memory_bytes=64 * GiB))
    chose = next(ev.status for ev in events if ev.status.startswith("chose"))
    assert "Tiny-Q8_0.gguf" in chose and "largest quantization" in chose  # not the mmproj
    assert events[-1].entry is not None and events[-1].entry.name == f"{NAME}:latest"
    e = pull(store, f"hf.co/{REPO}/Tiny-Q4_K_M.gguf")
    assert e.name == f"{NAME}:Q4_K_M"
    with pytest.raises(ModelNotFoundError, match="no Q2_K file"):
        pull(store, f"hf.co/{REPO}:Q2_K")
    with pytest.raises(ModelNotFoundError, match="no such GGUF file"):
        pull(store, f"hf.co/{REPO}/Nope-Q4_K_M.gguf")
    with pytest.raises(ModelNotFoundError, match="no such repository"):
        pull(store, "hf.co/TheOrg/Missing")


def test_pull_cut_mid_file_resumes_on_the_next_pull(hub: FakeHub, store: ModelStore,
                                                    blobs: dict[str, bytes]) -> None:
    data = blobs["Tiny-Q8_0.gguf"]
    cut = len(data) // 3
    hub.cut["Tiny-Q8_0.gguf"] = cut
    with pytest.raises(HubError, match=r"interrupted .* run the same pull again to resume"):
        pull(store, f"hf.co/{REPO}:Q8_0", retries=0)
    assert store.list() == []  # a partial download never appears as a model
    sha = hashlib.sha256(data).hexdigest()
    partial = store.blobs / f".download-{sha}"
    assert partial.stat().st_size == cut and not store.blob_path(sha).exists()
    e = pull(store, f"hf.co/{REPO}:Q8_0")
    gets = hub.gets("Tiny-Q8_0.gguf")
    assert [g.range for g in gets] == [None, f"bytes={cut}-"]  # resumed, not restarted
    assert e.path.read_bytes() == data and e.digest == sha and leftovers(store) == []


def test_a_second_pull_while_the_first_checks_its_download_is_busy(
        hub: FakeHub, store: ModelStore, blobs: dict[str, bytes]) -> None:
    """The window eight concurrent pulls hit in CI: the first pull's bytes are complete
    and it is in llama.cpp's dry load (then the rename into the store). A second pull
    of the same model then is refused as busy, not handed the file the first is about
    to move (a FileNotFoundError, a 500); a third, after, finds it registered."""
    seen: list[str] = []

    def check_then_race(path: Path) -> None:
        try:
            pull(store, f"hf.co/{REPO}:Q8_0", check=lambda _: None)
        except UsageError as exc:
            seen.append(str(exc))
        check_loadable(path)

    e = pull(store, f"hf.co/{REPO}:Q8_0", check=check_then_race)
    assert len(seen) == 1 and "another pull of this file is running" in seen[0]
    assert e.path.read_bytes() == blobs["Tiny-Q8_0.gguf"] and leftovers(store) == []
    events = [ev.status for ev in pull_events(store, f"hf.co/{REPO}:Q8_0")]
    assert "already up to date" in events and len(hub.gets("Tiny-Q8_0.gguf")) == 1


def test_pull_cut_mid_file_retries_within_one_pull(hub: FakeHub, store: ModelStore,
                                                   blobs: dict[str, bytes]) -> None:
    hub.cut["Tiny-Q4_K_M.gguf"] = 100_000
    e = pull(store, f"hf.co/{REPO}:Q4_K_M", retries=2)
    assert [g.range for g in hub.gets("Tiny-Q4_K_M.gguf")] == [None, "bytes=100000-"]
    assert e.path.read_bytes() == blobs["Tiny-Q4_K_M.gguf"]


def test_cuts_with_progress_in_between_get_fresh_retries(hub: FakeHub, store: ModelStore,
                                                          blobs: dict[str, bytes]) -> None:
    hub.cut["Tiny-Q8_0.gguf"] = [200_000, 200_000, 200_000]  # three cuts, each after progress
    e = pull(store, f"hf.co/{REPO}:Q8_0", retries=1)
    assert [g.range for g in hub.gets("Tiny-Q8_0.gguf")] == \
        [None, "bytes=200000-", "bytes=400000-", "bytes=600000-"]
    assert e.path.read_bytes() == blobs["Tiny-Q8_0.gguf"]


def test_a_full_disk_is_not_retried(hub: FakeHub, store: ModelStore,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    class Full:  # the partial file's handle, whose writes fail as on a full disk
        def write(self, chunk: bytes) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    real = hub_download._write
    monkeypatch.setattr(hub_download, "_write",
                        lambda out, chunk: real(Full(), chunk))
    with pytest.raises(hubmod.InferenceOSError, match="No space left"):
        pull(store, f"hf.co/{REPO}:Q8_0", retries=3)
    assert len(hub.gets("Tiny-Q8_0.gguf")) == 1 and store.list() == []


def test_wrong_digest_is_refused_and_nothing_registered(hub: FakeHub,
                                                        store: ModelStore) -> None:
    hub.declared_sha["Tiny-Q8_0.gguf"] = "ab" * 32  # the Hub's LFS digest; bytes differ
    with pytest.raises(HubError, match=r"sha256 mismatch.*nothing was registered"):
        pull(store, f"hf.co/{REPO}:Q8_0")
    assert store.list() == [] and leftovers(store) == []
    assert not list(store.blobs.glob("sha256-*"))


def test_hostile_file_names_from_the_hub_are_never_used(hub: FakeHub, store: ModelStore,
                                                        tmp_path: Path) -> None:
    lfs = {"sha256": "cd" * 32, "size": 1000, "pointerSize": 134}
    hub.raw_siblings[REPO] = [
        {"rfilename": "../../evil-Q2_K.gguf", "size": 1000, "lfs": lfs},
        {"rfilename": "/tmp/evil-Q2_K.gguf", "size": 1000, "lfs": lfs},
        {"rfilename": "sub\\..\\evil-Q2_K.gguf", "size": 1000, "lfs": lfs},
        {"rfilename": "ok-Q3_K.gguf", "size": 1000, "lfs": {**lfs, "sha256": "../x"}},
    ]
    with pytest.raises(ModelNotFoundError, match="no Q2_K file"):
        pull(store, f"hf.co/{REPO}:Q2_K")
    with pytest.raises(ModelNotFoundError, match="no Q3_K file"):  # a bad digest: skipped
        pull(store, f"hf.co/{REPO}:Q3_K")
    assert not any("evil" in r.path or "resolve" in r.path for r in hub.requests)
    assert not list(tmp_path.rglob("evil*"))


def test_split_gguf_is_pulled_whole_and_loads(hub: FakeHub, store: ModelStore,
                                              tmp_path: Path, blobs: dict[str, bytes]) -> None:
    parts = tiny_split_gguf(tmp_path, 2, base="Tiny-Q5_K_M")
    hub.repos[REPO].update({f"Q5/{p.name}": p.read_bytes() for p in parts})
    e = pull(store, f"hf.co/{REPO}:Q5_K_M")
    assert e.parts == 2 and e.path.name == "model-00001-of-00002.gguf"
    assert e.size == sum(p.stat().st_size for p in parts)
    # the projector at the repo's root comes with a split model kept in a folder
    assert e.projector is not None and e.projector.read_bytes() == blobs["mmproj-Tiny-F16.gguf"]
    assert [f.read_bytes() for f in sorted(e.path.parent.iterdir())] == \
        [p.read_bytes() for p in parts]
    check_loadable(e.path)  # llama.cpp finds the second part by its name
    whole = tmp_path / "whole.gguf"
    whole.write_bytes(blobs["Tiny-Q4_K_M.gguf"])  # the same shape, in one file
    assert e.parameters == load_spec(whole).parameters  # every part's tensors counted
    assert leftovers(store) == []
    served = Catalog(store).add_file(parts[0])  # `serve FIRST-PART.gguf`
    assert served.name == "tiny-q5_k_m:latest" and served.size == e.size
    local = store.import_file(parts[0], "local-split")  # a local split import: same layout
    assert local.parts == 2 and local.digest == e.digest and local.path == e.path
    store.remove(e.name)
    assert e.path.is_file()  # still used by local-split
    store.remove("local-split")
    assert not e.path.parent.exists()


def _broken(data: bytes, tmp: Path, kind: str) -> bytes:
    if kind == "arch":
        return data.replace(b"llama", b"llamz")  # same length: an unknown architecture
    from gguf import GGUFWriter

    import tiny_models

    class Drop(GGUFWriter):
        def add_tensor(self, name: str, tensor, *a, **k):  # type: ignore[no-untyped-def]
            if name != "blk.1.ffn_down.weight":
                super().add_tensor(name, tensor, *a, **k)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tiny_models, "GGUFWriter", Drop)
        return tiny_models.write_tiny_model(tmp / "missing.gguf").read_bytes()


@pytest.mark.parametrize("kind, reason", [("arch", "unknown model architecture: 'llamz'"),
                                          ("tensor", "'blk.1.ffn_down.weight' not found")])
def test_llama_cpp_refusal_at_pull_time(kind: str, reason: str, hub: FakeHub,
                                        store: ModelStore, tmp_path: Path,
                                        blobs: dict[str, bytes]) -> None:
    hub.repos[REPO]["Bad-Q6_K.gguf"] = _broken(blobs["Tiny-Q4_K_M.gguf"], tmp_path, kind)
    with pytest.raises(ModelLoadError, match=reason) as info:
        pull(store, f"hf.co/{REPO}:Q6_K")
    assert str(store.root) not in str(info.value)
    assert store.list() == [] and leftovers(store) == []
    # the same check guards local imports
    local = tmp_path / "bad.gguf"
    local.write_bytes(hub.repos[REPO]["Bad-Q6_K.gguf"])
    with pytest.raises(ModelLoadError, match=reason):
        store.import_file(local, "bad", check=check_loadable)
    assert store.list() == []


def test_token_goes_to_the_hub_only(hub: FakeHub, store: ModelStore,
                                    monkeypatch: pytest.MonkeyPatch,
                                    blobs: dict[str, bytes]) -> None:
    hub.stop()
    h = FakeHub(repos={REPO: dict(blobs)}, token="hf_secret", cdn=True).start()
    monkeypatch.setenv("HF_ENDPOINT", h.url)
    try:
        with pytest.raises(ModelNotFoundError, match="set HF_TOKEN"):
            pull(store, f"hf.co/{REPO}:Q4_K_M")
        monkeypatch.setenv("HF_TOKEN", "hf_secret")
        first = len(h.requests)
        e = pull(store, f"hf.co/{REPO}:Q4_K_M")
        assert e.path.read_bytes() == blobs["Tiny-Q4_K_M.gguf"]
        seen = h.requests[first:]
        cdn = [r for r in seen if r.path.startswith("/cdn/")]
        assert cdn and all(r.auth is None for r in cdn)  # never sent to the CDN's host
        assert all(r.auth == "Bearer hf_secret" for r in seen if r not in cdn)
    finally:
        h.stop()


def test_disk_space_is_checked_before_downloading(hub: FakeHub, store: ModelStore,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    real = hubmod.shutil.disk_usage
    monkeypatch.setattr(hubmod.shutil, "disk_usage",
                        lambda p: real(p)._replace(free=10 * 1024 * 1024))
    with pytest.raises(UsageError, match="not enough disk space"):
        pull(store, f"hf.co/{REPO}:Q8_0")
    assert not hub.gets("Tiny-Q8_0.gguf") and store.list() == []


def _hf_cache(root: Path, repo: str, files: dict[str, bytes]) -> None:
    d = root / f"models--{repo.replace('/', '--')}"
    snap = d / "snapshots" / ("1" * 40)
    (d / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    for name, data in files.items():
        sha = hashlib.sha256(data).hexdigest()
        (d / "blobs" / sha).write_bytes(data)
        os.symlink(f"../../blobs/{sha}", snap / name)


def test_offline_mode_uses_the_hf_cache(hub: FakeHub, store: ModelStore, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch,
                                        blobs: dict[str, bytes]) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubError, match="HF_HUB_OFFLINE"):
        pull(store, f"hf.co/{REPO}:Q4_K_M")
    _hf_cache(tmp_path / "hf-home" / "hub", REPO, {"Tiny-Q4_K_M.gguf": blobs["Tiny-Q4_K_M.gguf"]})
    e = pull(store, f"hf.co/{REPO}:Q4_K_M")
    assert e.name == f"{NAME}:Q4_K_M" and e.path.read_bytes() == blobs["Tiny-Q4_K_M.gguf"]
    assert hub.requests == []  # offline: the Hub was never asked
