"""Server-side sessions (/v1/sessions): kept on disk, KV state restored on the next turn.

Each test runs twice: over the tiered KV cache (what `serve` turns on: the session is
a thin layer, the cache holds its state) and without it (the session's own state.bin)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferenceos.registry.manager import engine_factory
from server_harness import Harness
from server_harness import serving as harness_serving

GREEDY = {"max_tokens": 6, "temperature": 0}
# a model loads on a session's first request: beside a busy suite that can take longer
# than httpx's default 5 s (the census saw POST /v1/sessions time out at 5 s)
HTTP = httpx.Client(timeout=60.0)
MiB = 1 << 20


@pytest.fixture(params=["tiers", "own-state"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture()
def serving(mode: str) -> Any:
    """server_harness.serving, with the tiered KV cache under the data dir in "tiers"."""

    def serve(models: dict[str, Path], root: Path) -> Any:
        kw: dict[str, Any] = {}
        if mode == "tiers":
            kw = {"manager_kw": {"factory": engine_factory(
                kv_cache_ram=16 * MiB, kv_cache_disk=256 * MiB,
                kv_cache_dir=root / "home" / "data" / "kv-cache")}}
        return harness_serving(models, root, **kw)

    return serve


def _turn(h: Harness, sid: str, text: str) -> dict:
    r = HTTP.post(f"{h.v1}/sessions/{sid}/messages", json={"content": text, **GREEDY},
                   timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_create_list_get_delete(serving: Any, mode: str,
                                tiny_llama: Path, tmp_path: Path) -> None:
    with serving({"tiny": tiny_llama}, tmp_path) as h:
        r = HTTP.post(h.v1 + "/sessions", json={"model": "tiny", "system": "be brief",
                                                 "metadata": {"user": "ann"}})
        assert r.status_code == 201
        s = r.json()
        assert s["id"].startswith("sess_") and s["model"] == "tiny:latest"
        assert s["messages"] == [] and s["metadata"] == {"user": "ann"}
        reply = _turn(h, s["id"], "hello")
        assert reply["message"]["role"] == "assistant"
        assert 0 < reply["usage"]["completion_tokens"] <= 6
        listed = HTTP.get(h.v1 + "/sessions").json()
        assert [x["id"] for x in listed["data"]] == [s["id"]]
        assert listed["data"][0]["message_count"] == 2
        got = HTTP.get(f"{h.v1}/sessions/{s['id']}").json()
        assert got["messages"] == [{"role": "user", "content": "hello"},
                                   {"role": "assistant", "content": reply["message"]["content"]}]
        assert got["saved_tokens"] > 0
        own = tmp_path / "home" / "data" / "sessions" / s["id"] / "state.bin"
        if mode == "tiers":  # one copy of the state: the cache's (written once idle)
            assert not own.exists()
            cache = tmp_path / "home" / "data" / "kv-cache"
            deadline = time.monotonic() + 30
            while not list(cache.rglob("*.kv")) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert list(cache.rglob("*.kv"))
        else:
            assert own.stat().st_size
        d = HTTP.delete(f"{h.v1}/sessions/{s['id']}").json()
        assert d == {"id": s["id"], "object": "session.deleted", "deleted": True}
        assert HTTP.get(f"{h.v1}/sessions/{s['id']}").status_code == 404
        assert not (tmp_path / "home" / "data" / "sessions" / s["id"]).exists()


def test_bad_ids_and_models_are_clear_errors(serving: Any,
                                             tiny_llama: Path, tmp_path: Path) -> None:
    with serving({"tiny": tiny_llama}, tmp_path) as h:
        assert HTTP.get(f"{h.v1}/sessions/..%2F..%2Fetc").status_code == 404
        for sid in ("sess_nope", "..x", "sess_" + "0" * 24):
            r = HTTP.get(f"{h.v1}/sessions/{sid}")
            assert r.status_code == 404 and "session" in r.json()["error"]["message"]
            assert HTTP.post(f"{h.v1}/sessions/{sid}/messages",
                              json={"content": "x"}).status_code == 404
        assert HTTP.post(h.v1 + "/sessions", json={"model": "nope"}).status_code == 404
        sid = HTTP.post(h.v1 + "/sessions", json={}).json()["id"]  # the default model
        assert HTTP.post(f"{h.v1}/sessions/{sid}/messages",
                          json={"content": ""}).status_code == 400


def test_state_survives_a_restart_and_skips_the_prefill(serving: Any, tiny_llama: Path,
                                                        tmp_path: Path) -> None:
    """After a restart, the next turn restores the saved KV state: only the new
    message is evaluated."""
    with serving({"tiny": tiny_llama}, tmp_path) as h:
        sid = HTTP.post(h.v1 + "/sessions", json={"model": "tiny"}).json()["id"]
        _turn(h, sid, "abc abc")
        second = _turn(h, sid, "more text")
    assert second["usage"]["cached_tokens"] > 0  # the live slot still held the history
    with serving({"tiny": tiny_llama}, tmp_path) as h:  # a new server: empty KV cache
        third = _turn(h, sid, "and again")
        history = HTTP.get(f"{h.v1}/sessions/{sid}").json()
    assert third["timings"]["restored_tokens"] > 0
    assert third["usage"]["cached_tokens"] >= third["timings"]["restored_tokens"] > (
        second["usage"]["prompt_tokens"] // 2)
    assert len(history["messages"]) == 6


def test_resume_restores_before_the_next_message(serving: Any,
                                                 tiny_llama: Path, tmp_path: Path) -> None:
    with serving({"tiny": tiny_llama}, tmp_path) as h:
        sid = HTTP.post(h.v1 + "/sessions", json={"model": "tiny"}).json()["id"]
        _turn(h, sid, "abc")
    with serving({"tiny": tiny_llama}, tmp_path) as h:
        r = HTTP.post(f"{h.v1}/sessions/{sid}/resume", timeout=60).json()
        assert r["object"] == "session.resumed" and r["restored_tokens"] > 0
        nxt = _turn(h, sid, "def")
        assert nxt["usage"]["cached_tokens"] >= r["restored_tokens"]


def test_a_state_from_another_model_is_not_restored(serving: Any, tiny_llama: Path, tiny_moe: Path,
                                                    tmp_path: Path) -> None:
    """The digest check: the same session name served by another file prefills again
    (and still answers)."""
    with serving({"tiny": tiny_llama}, tmp_path) as h:
        sid = HTTP.post(h.v1 + "/sessions", json={"model": "tiny"}).json()["id"]
        _turn(h, sid, "abc")
    with serving({"tiny": tiny_moe}, tmp_path) as h:
        r = _turn(h, sid, "def")
    assert r["timings"]["restored_tokens"] == 0


def test_streamed_turn(serving: Any, tiny_llama: Path, tmp_path: Path) -> None:
    import json

    with serving({"tiny": tiny_llama}, tmp_path) as h:
        sid = HTTP.post(h.v1 + "/sessions", json={"model": "tiny"}).json()["id"]
        with HTTP.stream("POST", f"{h.v1}/sessions/{sid}/messages", timeout=60,
                          json={"content": "hi", "stream": True, **GREEDY}) as r:
            lines = [ln.removeprefix("data: ") for ln in r.iter_lines() if ln]
        assert lines[-1] == "[DONE]"
        events = [json.loads(x) for x in lines[:-1]]
        deltas = "".join(e["delta"] for e in events if e["object"] == "session.delta")
        final = events[-1]
        assert final["object"] == "session.message"
        assert final["message"]["content"] == deltas
        assert len(HTTP.get(f"{h.v1}/sessions/{sid}").json()["messages"]) == 2


@pytest.mark.parametrize("sid", ["sess_" + "a" * 24])
def test_delete_unknown_is_404(serving: Any, tiny_llama: Path, tmp_path: Path, sid: str) -> None:
    with serving({"tiny": tiny_llama}, tmp_path) as h:
        assert HTTP.delete(f"{h.v1}/sessions/{sid}").status_code == 404


def test_one_turn_at_a_time(serving: Any, tiny_llama: Path, tmp_path: Path,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    """While a turn holds the session (its lock taken here, as a running turn takes
    it), another message or a delete is a 409 at once, not a wait."""
    import threading

    from inferenceos.server.dialects.responses.session_store import SessionStore

    with serving({"tiny": tiny_llama}, tmp_path) as h:
        sid = HTTP.post(h.v1 + "/sessions", json={"model": "tiny"}).json()["id"]
        held = threading.Lock()
        held.acquire()
        with monkeypatch.context() as mp:
            mp.setattr(SessionStore, "lock", lambda self, _sid: held)
            busy = HTTP.post(f"{h.v1}/sessions/{sid}/messages", json={"content": "x"})
            assert busy.status_code == 409 and "another message" in busy.text
            assert HTTP.delete(f"{h.v1}/sessions/{sid}").status_code == 409
            assert HTTP.post(f"{h.v1}/sessions/{sid}/resume").status_code == 409
        held.release()
        assert _turn(h, sid, "next")["message"]["role"] == "assistant"


def test_interleaved_sessions_restore_from_disk(serving: Any,
                                                tiny_llama: Path, tmp_path: Path) -> None:
    """One slot, two sessions taking turns: each turn finds the slot holding the other
    conversation and restores its own from disk."""
    with serving({"tiny": tiny_llama}, tmp_path) as h:
        a = HTTP.post(h.v1 + "/sessions", json={"model": "tiny"}).json()["id"]
        b = HTTP.post(h.v1 + "/sessions", json={"model": "tiny"}).json()["id"]
        _turn(h, a, "abc")
        _turn(h, b, "xyz")
        for i in range(2):
            for sid in (a, b):
                r = _turn(h, sid, f"more {i}")
                assert r["timings"]["restored_tokens"] > 0, r
                assert r["usage"]["cached_tokens"] >= r["timings"]["restored_tokens"]
        assert len(HTTP.get(f"{h.v1}/sessions/{a}").json()["messages"]) == 6
