"""GET/POST /api/budget and GET /api/events on a real server; a cap lowered over the API
while a stream runs migrates the model down (the reactor) at once, whatever the dwell
(an operator's cap is an order), and the stream's text is exactly an undisturbed run's;
a cap of 0 on a loopback RPC worker's device moves the layers home and, lifted, back."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from inferenceos.cluster.ggml import has_rpc
from inferenceos.cluster.spawn import free_port, spawn_worker, stop_worker
from inferenceos.plan.entry import LoadRequest
from inferenceos.registry.budget import MemoryBudget
from inferenceos.server.settings import ServerSettings
from plan_factories import machine
from server_harness import serving

# measured pressure never acts within a test: only the caps the tests set do
NO_DWELL_PASSES = "3600"


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


def _contents(url: str, body: dict, timeout: float = 120) -> Iterator[str]:
    """Each chunk's `content` of a streamed llama-server /completion (an error chunk
    fails the test); closing the generator closes the stream."""
    with httpx.stream("POST", url + "/completion", json={**body, "stream": True},
                      timeout=timeout) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            yield chunk.get("content", "")


def _stream_text(url: str, body: dict, on_chunk: object = None) -> tuple[str, int]:
    text, n = "", 0
    for content in _contents(url, body):
        text += content
        n += 1
        if on_chunk is not None and n == 5:
            on_chunk()  # type: ignore[operator]
    return text, n


def test_a_cap_lowered_over_the_api_migrates_a_running_stream(
    wide: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INFERENCEOS_PRESSURE_DWELL_S", NO_DWELL_PASSES)
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


# -- a cap of 0 on a cluster worker's device --------------------------------------------

CAP_AT, LIFT_AFTER = 20, 90  # tokens into the stream; tokens after the cap
AFTER_UP = 30  # tokens read once the model is back, then the stream is closed


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[str]:
    if not has_rpc():
        pytest.skip("llama.cpp was built without RPC")
    port = free_port()
    proc = spawn_worker(port, mem="256MiB", threads=1, log=tmp_path / "worker.log")
    yield f"127.0.0.1:{port}"
    stop_worker(proc)


class Watch:
    """This server's events since it was made, read as the stream goes (no sleeps)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.first = httpx.get(url + "/api/events").json()["last_id"]

    def events(self, kind: str) -> list[dict]:
        return httpx.get(self.url + "/api/events",
                         params={"since": self.first, "kind": kind}).json()["events"]


def _migrations(metrics: str) -> dict[tuple[str, str], float]:
    """inferenceos:migrations_total by (reason, direction), from one scrape."""
    return {(s.labels["reason"], s.labels["direction"]): s.value
            for f in text_string_to_metric_families(metrics)
            for s in f.samples if s.name == "inferenceos:migrations_total"}


def test_a_cap_of_zero_on_a_worker_moves_a_stream_home_and_back(
    tmp_path: Path, worker: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deep tiny model split over this CPU and a loopback RPC worker; 20 tokens into
    a greedy stream the worker's device is capped to 0 (the layers come home: the plan
    down holds nothing there), 90 tokens later the cap is lifted (they go back). Both
    migrations happen while the stream runs, with the dwell an hour: the cap is obeyed
    at once, not waited out. The text is the undisturbed run's, and
    inferenceos:migrations_total counts both."""
    from tiny_models import write_tiny_model

    monkeypatch.setenv("INFERENCEOS_PRESSURE_DWELL_S", NO_DWELL_PASSES)
    deep = write_tiny_model(tmp_path / "deep.gguf", "deep")
    device = f"RPC[{worker}]"
    # local RAM is short at load time (the plan puts layers on the worker) and has room
    # later, when the worker's device is capped to 0
    ram = {"now": 6 << 20}
    budget = MemoryBudget(machine=lambda: machine(ram=ram["now"], threads=1))
    # past the model's training context (rope scaling): the stream outlives both moves
    # with room (they take ~150 tokens here), and it is closed once they are done
    base = LoadRequest(n_ctx=4096, threads=1, n_batch=64, type_k="f16", type_v="f16",
                       rpc=(worker,), rope_scaling=True)
    body = {"model": "deep", "prompt": "ab cab", "n_predict": 3500, "temperature": 0,
            "ignore_eos": True}
    with serving({"deep": deep}, tmp_path, manager_kw={"base": base, "budget": budget}) as h:
        r = httpx.post(h.url + "/completion", json={**body, "n_predict": 2}, timeout=300)
        assert r.status_code == 200  # loaded
        [lm] = h.manager.loaded()
        assert lm.charge.get(device, 0) > 0, lm.plan.summary()  # split onto the worker
        ram["now"] = 1 << 30
        watch = Watch(h.url)
        text, n, lifted_at, up_at = "", 0, 0, 0
        stream = _contents(h.url, body, timeout=300)
        for content in stream:
            text += content
            n += 1
            if n == CAP_AT:
                _cap(h.url, device, 0)
            elif n >= CAP_AT + LIFT_AFTER and not lifted_at and watch.events("migrating"):
                _cap(h.url, device, None)  # the way down has started: lift the cap
                lifted_at = n
            elif lifted_at and not up_at and len(watch.events("migration")) == 2:
                up_at = n  # back up
            elif up_at and n >= up_at + AFTER_UP:
                break
        stream.close()  # closed: the server cancels the rest
        migrations = watch.events("migration")
        metrics = httpx.get(h.url + "/metrics").text
        back = h.manager.loaded()[0].plan
        # the undisturbed run, on the plan the stream began and ended on
        want = httpx.post(h.url + "/completion", json={**body, "n_predict": n + 8},
                          timeout=300).json()["content"]
    assert up_at, f"the stream ended at {n} tokens before both migrations: {migrations}"
    assert want.startswith(text) and n > up_at
    down, up = migrations
    assert down["cause"].startswith(f"pressure on {device} (a cap of 0 B")
    assert down["charge_after"].get(device, 0) == 0 and down["moved"] == 1
    assert up["cause"].startswith(f"the cap on {device} raised") and up["moved"] == 1
    assert back.params() == lm.plan.params()  # the preferred plan again
    assert _migrations(metrics) == {("cap", "down"): 1.0, ("recovered", "up"): 1.0}


def _cap(url: str, device: str, cap: int | None) -> None:
    r = httpx.post(url + "/api/budget", json={"device": device, "bytes": cap})
    assert r.status_code == 200, r.text
