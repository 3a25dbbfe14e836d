"""GET/POST /api/budget and GET /api/events on a real server; a cap lowered over the API
while a stream runs migrates the model down (the reactor), and the stream's text is
exactly an undisturbed run's."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from inferenceos.plan.entry import LoadRequest
from inferenceos.server.settings import ServerSettings
from server_harness import serving


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny_models import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("wide") / "wide.gguf", "wide")


def test_budget_lists_devices_and_caps_change_at_run_time(tiny_llama: Path,
                                                           tmp_path: Path) -> None:
    with serving({"tiny": tiny_llama}, tmp_path) as h:
        body = httpx.get(h.url + "/api/budget").json()
        cpu = next(d for d in body["devices"] if d["name"] == "CPU")
        assert cpu["cap_bytes"] is None and cpu["free_bytes"] > 0 and cpu["used_bytes"] == 0
        assert body["pressure"]["high"] == 0.95
        httpx.post(h.url + "/api/generate", json={"model": "tiny", "prompt": "ab",
                                                   "stream": False,
                                                   "options": {"num_predict": 4}})
        after = httpx.get(h.url + "/api/budget").json()
        assert next(d for d in after["devices"] if d["name"] == "CPU")["used_bytes"] > 0
        r = httpx.post(h.url + "/api/budget", json={"device": "CPU", "bytes": 1 << 40})
        assert r.status_code == 200
        assert next(d for d in r.json()["devices"] if d["name"] == "CPU")["cap_bytes"] == 1 << 40
        assert h.manager.budget.caps == {"CPU": 1 << 40}
        r = httpx.post(h.url + "/api/budget", json={"device": "CPU", "bytes": None})
        assert r.status_code == 200 and h.manager.budget.caps == {}
        r = httpx.post(h.url + "/api/budget", json={"device": "GPU7", "bytes": 5})
        assert r.status_code == 400 and "unknown device 'GPU7'" in r.text
        r = httpx.post(h.url + "/api/budget", json={"device": "CPU", "bytes": -5})
        assert r.status_code in (400, 422)
        r = httpx.post(h.url + "/api/budget", json={"device": "RPC[127.0.0.1:50052]",
                                                     "bytes": 1000})
        assert r.status_code == 200  # a worker's device may be capped before it joins
        ev = httpx.get(h.url + "/api/events").json()
        kinds = [e["kind"] for e in ev["events"]]
        assert "load" in kinds and "budget" in kinds
        newer = httpx.get(h.url + "/api/events", params={"since": ev["last_id"]}).json()
        assert newer["events"] == []
        assert httpx.get(h.url + "/api/events", params={"since": -1}).status_code in (400, 422)


def test_budget_routes_need_the_key(tiny_llama: Path, tmp_path: Path) -> None:
    with serving({"tiny": tiny_llama}, tmp_path, settings=ServerSettings(api_key="k")) as h:
        assert httpx.get(h.url + "/api/budget").status_code == 401
        assert httpx.post(h.url + "/api/budget", json={"device": "CPU"}).status_code == 401
        assert httpx.get(h.url + "/api/events").status_code == 401
        ok = httpx.get(h.url + "/api/budget", headers={"Authorization": "Bearer k"})
        assert ok.status_code == 200


def _stream_text(url: str, body: dict, on_chunk: object = None) -> tuple[str, int]:
    text, n = "", 0
    with httpx.stream("POST", url + "/completion", json={**body, "stream": True},
                      timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            text += chunk.get("content", "")
            n += 1
            if on_chunk is not None and n == 5:
                on_chunk()  # type: ignore[operator]
    return text, n


def test_a_cap_lowered_over_the_api_migrates_a_running_stream(
    wide: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INFERENCEOS_PRESSURE_DWELL_S", "0.3")
    base = LoadRequest(n_ctx=4096, n_batch=64, threads=1, type_k="f16", type_v="f16")
    with serving({"wide": wide}, tmp_path, manager_kw={"base": base}) as h:
        # 1,000 tokens outlast the migration with room (16 s with both cores busy);
        # `moved == 1` below fails if the stream had ended before it
        body = {"model": "wide", "prompt": "ab cab", "n_predict": 1000, "temperature": 0,
                "ignore_eos": True}
        want = httpx.post(h.url + "/completion", json=body, timeout=120).json()["content"]
        charge = h.manager.loaded()[0].charge["CPU"]
        first = httpx.get(h.url + "/api/events").json()["last_id"]  # events are per process

        def squeeze() -> None:
            r = httpx.post(h.url + "/api/budget",
                           json={"device": "CPU", "bytes": int(charge * 0.8)})
            assert r.status_code == 200

        got, _ = _stream_text(h.url, body, squeeze)
        migrations = httpx.get(h.url + "/api/events", params={
            "kind": "migration", "since": first}).json()["events"]
    assert got == want
    assert migrations and migrations[0]["cause"].startswith("pressure on CPU")
    assert migrations[0]["moved"] == 1
    assert migrations[0]["charge_after"]["CPU"] <= charge * 0.8
