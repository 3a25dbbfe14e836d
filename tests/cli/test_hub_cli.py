"""Hub pulls through the command line (`inferenceos pull`, the Ollama-style aliases) and
through the server's `/api/pull` (the real `ollama` client), against the fake Hub; the
server's error messages for pull/show/copy/delete carry no server-side path."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest

from cli_helpers import run_cli
from fake_hub import FakeHub, tiny_gguf
from server_harness import Harness, serving

REPO = "TheOrg/Tiny-GGUF"


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeHub]:
    d = tmp_path_factory.mktemp("hub-cli")
    h = FakeHub(repos={REPO: {"Tiny-Q4_K_M.gguf": tiny_gguf(d, "llama"),
                              "Tiny-Q8_0.gguf": tiny_gguf(d, "moe")}}).start()
    yield h
    h.stop()


@pytest.fixture
def hub_env(hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf-home")}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    for var in ("HF_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_CACHE"):
        monkeypatch.delenv(var, raising=False)
    return env


def test_pull_list_show_cp_rm_at_the_top_level(hub_env: dict[str, str]) -> None:
    r = run_cli("pull", f"hf.co/{REPO}:Q4_K_M", **hub_env)
    assert r.returncode == 0, r.stderr
    name = "hf.co/theorg/tiny-gguf:Q4_K_M"
    assert r.stdout.startswith(name)
    assert "verifying sha256 digest" in r.stderr and "checking that llama.cpp" in r.stderr
    listed = json.loads(run_cli("list", "--json").stdout)
    assert [m["name"] for m in listed] == [name]
    shown = json.loads(run_cli("show", name, "--json").stdout)
    assert shown["architecture"] == "llama" and shown["source"].startswith(hub_env["HF_ENDPOINT"])
    assert run_cli("cp", name, "tiny").returncode == 0
    assert run_cli("models", "rm", "tiny").returncode == 0
    r = run_cli("rm", name)
    assert r.returncode == 0 and json.loads(run_cli("list", "--json").stdout) == []


def test_bad_names_and_paths_get_one_line(hub_env: dict[str, str], tmp_path: Path) -> None:
    r = run_cli("pull", "hf.co/TheOrg/../../etc/passwd.gguf", **hub_env)
    assert r.returncode == 2 and "invalid Hugging Face name" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    for target in ("/nonexistent.gguf", str(tmp_path)):  # the same message as `run`
        pulled, ran = run_cli("pull", target), run_cli("run", target, "-p", "hi")
        assert pulled.returncode == ran.returncode == 1
        assert pulled.stderr == ran.stderr and target in pulled.stderr


def test_pull_refuses_what_llama_cpp_cannot_load(tiny_llama: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(tiny_llama.read_bytes().replace(b"llama", b"llamz"))
    r = run_cli("models", "pull", str(bad))
    assert r.returncode == 1 and "unknown model architecture: 'llamz'" in r.stderr
    assert json.loads(run_cli("list", "--json").stdout) == []


@pytest.fixture
def server(tiny_llama: Path, tmp_path: Path, hub_env: dict[str, str]) -> Iterator[Harness]:
    with serving({"tiny": tiny_llama}, tmp_path / "srv") as h:
        yield h


def test_api_pull_streams_ollama_progress(server: Harness, hub: FakeHub) -> None:
    client = ollama.Client(host=server.url, timeout=60)
    lines = list(client.pull(f"hf.co/{REPO}:Q8_0", stream=True))
    assert lines[0].status == "pulling manifest" and lines[-1].status == "success"
    sized = [p for p in lines if p.total]
    size = len(hub.repos[REPO]["Tiny-Q8_0.gguf"])
    assert sized and sized[-1].completed == sized[-1].total == size
    assert sized[-1].digest and sized[-1].digest.startswith("sha256:")
    names = [m.model for m in client.list().models]
    assert "hf.co/theorg/tiny-gguf:Q8_0" in names
    r = client.generate(model="hf.co/theorg/tiny-gguf:Q8_0", prompt="hi",
                        options={"num_predict": 2})
    assert r.done
    assert client.pull(f"hf.co/{REPO}:Q4_K_M", stream=False).status == "success"


def _no_path(text: str, *paths: Path) -> None:
    assert not any(str(p) in text for p in paths), text
    assert "/tmp/" not in text and "/root" not in text, text


def test_api_errors_carry_no_server_path(server: Harness, hub: FakeHub, tmp_path: Path,
                                         tiny_llama: Path) -> None:
    store = server.catalog.store
    post = lambda route, body: httpx.post(server.url + route, json=body, timeout=60)  # noqa: E731
    r = post("/api/pull", {"model": "hf.co/TheOrg/../etc/x.gguf"})
    assert r.status_code == 400 and "invalid Hugging Face name" in r.json()["error"]
    r = post("/api/pull", {"model": f"hf.co/{REPO}/Nope.gguf"})
    assert r.status_code == 200 and "no such GGUF file" in r.text  # an in-band error line
    hub.declared_sha["Tiny-Q4_K_M.gguf"] = "ab" * 32
    try:
        r = post("/api/pull", {"model": f"hf.co/{REPO}:Q4_K_M", "stream": False})
    finally:
        hub.declared_sha.clear()
    assert r.status_code >= 400 and "sha256 mismatch" in r.json()["error"]
    _no_path(r.text, store.root)
    # a model registered in place whose file is then damaged, then removed
    outside = tmp_path / "outside" / "gone.gguf"
    outside.parent.mkdir()
    outside.write_bytes(tiny_llama.read_bytes())
    store.register_in_place(outside, "gone", "cd" * 32, "folder")
    outside.write_bytes(b"GGUF garbage")
    r = post("/api/show", {"model": "gone"})
    assert r.status_code >= 400 and "gone" in r.json()["error"]
    _no_path(r.text, outside)
    outside.unlink()
    for route, body in (("/api/show", {"model": "gone"}),
                        ("/api/copy", {"source": "gone", "destination": "x"}),
                        ("/api/copy", {"source": "missing", "destination": "x"}),
                        ("/api/show", {"model": "missing"})):
        r = post(route, body)
        assert r.status_code == 404, (route, r.text)
        _no_path(r.text, outside, store.root)
    r = httpx.request("DELETE", server.url + "/api/delete", json={"model": "missing"})
    assert r.status_code == 404
    _no_path(r.text, store.root)


def test_stop_unloads_through_the_server(server: Harness) -> None:
    client = ollama.Client(host=server.url, timeout=60)
    client.generate(model="tiny", prompt="hi", options={"num_predict": 1}, keep_alive=-1)
    assert [m.model for m in client.ps().models] == ["tiny:latest"]
    args = ("--host", "127.0.0.1", "--port", str(server.port))
    r = run_cli("stop", "tiny", *args)
    assert r.returncode == 0 and "stopped 'tiny:latest'" in r.stdout, r.stderr
    assert client.ps().models == []
    r = run_cli("stop", "tiny", *args)
    assert r.returncode == 1 and "not loaded" in r.stderr


def test_python_api_pull(hub_env: dict[str, str]) -> None:
    import inferenceos

    seen: list[Any] = []
    e = inferenceos.pull(f"hf.co/{REPO}:Q4_K_M", progress=seen.append)
    assert e.name == "hf.co/theorg/tiny-gguf:Q4_K_M" and seen[-1].status == "success"
    assert any(ev.total and ev.completed == ev.total for ev in seen)  # byte progress too
    assert [m.name for m in inferenceos.list()] == [e.name]


def test_api_pull_stops_when_the_client_leaves_and_resumes(server: Harness, hub: FakeHub,
                                                           tmp_path: Path) -> None:
    import hashlib
    import time

    data = tiny_gguf(tmp_path, "moe", seed=7)
    hub.repos[REPO]["Slow-Q6_K.gguf"] = data
    sha = hashlib.sha256(data).hexdigest()
    partial = server.catalog.store.blobs / f".download-{sha}"
    hub.slow_s = 0.05  # ~1 MB at 64 KiB / 50 ms: about 0.8 s
    try:
        with httpx.stream("POST", server.url + "/api/pull", timeout=60,
                          json={"model": f"hf.co/{REPO}:Q6_K"}) as r:
            for line in r.iter_lines():
                if json.loads(line).get("completed"):
                    break  # the client leaves mid-download
        time.sleep(1.5)
        size = partial.stat().st_size
        assert 0 < size < len(data)  # stopped, kept for the next pull
        time.sleep(0.5)
        assert partial.stat().st_size == size  # and no longer growing
    finally:
        hub.slow_s = 0.0
    r = httpx.post(server.url + "/api/pull", json={"model": f"hf.co/{REPO}:Q6_K",
                                                   "stream": False}, timeout=60)
    assert r.json() == {"status": "success"}
    assert hub.gets("Slow-Q6_K.gguf")[-1].range == f"bytes={size}-"
    assert not partial.exists()
