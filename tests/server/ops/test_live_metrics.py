"""The live figures `monitor` and the /ui page read: the generated-token counter moves
while a request generates (not only when it ends), and events read as a person
would write them (registry/events.event_text, the `text` of GET /api/events)."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from inferenceos.cli.monitor_cmd import parse_metrics
from inferenceos.engine.worker.direct import REPORT_S
from server_harness import SLOW, long_stream, serving
from tiny_models import write_tiny_model

GEN = "inferenceos:generation_tokens_total"


@pytest.fixture(scope="module")
def slow_letters(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("live") / "slow.gguf", kind="wide",
                            letters_only=True)


def test_generated_tokens_count_while_a_request_generates(slow_letters: Path,
                                                          tmp_path: Path) -> None:
    with serving({"slow": slow_letters}, tmp_path, manager_kw={"base": SLOW}) as h:
        with long_stream(h.url, "slow") as s:
            first = parse_metrics(httpx.get(h.url + "/metrics").text).get(GEN, 0)
            s.flowing.clear()
            while s.lines < 40:  # more tokens go by
                assert not s.ended.wait(0.05), "the stream ended early"
            # counted as they are generated; a stream the model worker writes itself
            # is counted at its reports (engine/worker/direct.py, every REPORT_S)
            deadline = time.monotonic() + 10 * REPORT_S
            while (second := parse_metrics(httpx.get(h.url + "/metrics").text)
                   .get(GEN, 0)) <= first and time.monotonic() < deadline:
                assert not s.ended.wait(REPORT_S / 4), "the stream ended early"
            assert not s.ended.is_set()
            assert 0 < first < second
        # once it ends (the client left), the counter holds what was generated
        done = parse_metrics(httpx.get(h.url + "/metrics").text).get(GEN, 0)
        assert done >= second


def test_events_read_as_a_person_writes_them() -> None:
    from inferenceos.registry.events import event_text

    load = {"id": 1, "ts": 0.0, "kind": "load", "model": "m", "load_s": 0.9714506950000441,
            "plan": "CPU 2/2 layers"}
    assert event_text(load) == "load 0.97 s, plan CPU 2/2 layers"
    named = {**load, "plan": "plan: ctx 256 · KV f16"}  # a summary that names itself
    assert event_text(named) == "load 0.97 s, plan: ctx 256 · KV f16"
    budget = {"id": 2, "ts": 0.0, "kind": "budget", "model": "", "device": "CPU",
              "cap_bytes": 3 << 30}
    assert event_text(budget) == "device CPU, cap 3.0 GiB"
    lifted = {**budget, "cap_bytes": None}
    assert event_text(lifted) == "device CPU, cap none"
    pressure = {"kind": "pressure", "device": "CUDA0", "signal": 0.9312345,
                "action": "no smaller placement helps"}
    assert event_text(pressure) == "device CUDA0, signal 93 %, action no smaller placement helps"
    migration = {"kind": "migration", "cause": "pressure on CUDA0", "pause_s": 0.123456,
                 "moved": 2}
    assert event_text(migration) == "pressure on CUDA0: pause 0.12 s, 2 streams moved"
    odd = {"kind": "x", "ratio": 1 / 3, "n": 7, "detail": {"a": 1}}
    assert event_text(odd) == 'ratio 0.333, n 7, detail {"a": 1}'


def test_the_events_route_gives_each_event_its_text(tmp_path: Path, tiny_llama: Path) -> None:
    with serving({"tiny": tiny_llama}, tmp_path) as h:
        httpx.post(h.url + "/api/generate", json={"model": "tiny", "prompt": "ab",
                                                   "stream": False,
                                                   "options": {"num_predict": 2}})
        events = httpx.get(h.url + "/api/events").json()["events"]
        load = next(e for e in events if e["kind"] == "load")
        assert isinstance(load["load_s"], float)  # the figures stay for programs
        assert load["text"].startswith("load ") and " s, plan: ctx " in load["text"]
        assert "load_s" not in load["text"]
