"""/metrics reports each model's KV cache usage as its engine counts it (`stats()`): a
recent answer that still holds (nothing ran since, or the model is busy: the scrape
never waits for its worker's step), else one asked at scrape time within a short
timeout; it never fails the scrape."""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from inferenceos.server.ops import kv_stats
from inferenceos.server.ops.kv_stats import reported_kv_usage
from server_harness import Harness, serving


@pytest.fixture(scope="module")
def server(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    root = tmp_path_factory.mktemp("server-kv")
    with serving({"tiny": tiny_llama}, root) as h:
        yield h


def _gauge(h: Harness, model: str) -> float:
    text = httpx.get(h.url + "/metrics", timeout=30).text
    name = f'inferenceos:kv_cache_usage_perc{{model_name="{model}"}}'
    [line] = [ln for ln in text.splitlines() if ln.startswith(name)]
    return float(line.rsplit(" ", 1)[1])


def test_metric_is_the_engines_own_count(server: Harness) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hello there"}],
            "max_tokens": 5, "temperature": 0}
    assert httpx.post(server.v1 + "/chat/completions", json=body, timeout=60).status_code == 200
    [lm] = server.manager.loaded()
    stats = lm.engine.stats()  # type: ignore[attr-defined]
    # nothing runs now: the server-side estimate would say 0; the engine still holds the
    # finished sequence's cells (kept for prefix reuse) and says so
    assert stats["running"] == 0 and stats["kv_used_cells"] > 0
    assert _gauge(server, lm.model.name) == pytest.approx(stats["kv_usage"])


class _Engine:
    def __init__(self, stats: Any) -> None:
        self._stats = stats

    def stats(self) -> dict[str, Any]:
        return self._stats()


def _manager(refs: int = 0, **engines: _Engine) -> SimpleNamespace:
    loaded = [SimpleNamespace(model=SimpleNamespace(name=k), engine=e, refs=refs, last_used=0)
              for k, e in engines.items()]
    return SimpleNamespace(loaded=lambda: list(loaded))


def test_slow_or_failing_engines_are_left_out_in_time() -> None:
    release = threading.Event()

    def hang() -> dict[str, Any]:
        release.wait(10)
        return {"kv_usage": 0.9}

    def fail() -> dict[str, Any]:
        raise RuntimeError("worker died")

    manager = _manager(ok=_Engine(lambda: {"kv_usage": 0.25}), slow=_Engine(hang),
                       bad=_Engine(fail), odd=_Engine(lambda: {"kv_usage": "x"}))
    t0 = time.perf_counter()
    got = asyncio.run(reported_kv_usage(manager, timeout_s=0.3))  # type: ignore[arg-type]
    elapsed = time.perf_counter() - t0
    release.set()
    assert got == {"ok": 0.25} and elapsed < 2


def test_an_unloaded_model_is_not_asked() -> None:
    calls: list[int] = []
    manager = _manager(a=_Engine(lambda: calls.append(1) or {"kv_usage": 0.5}))
    manager.loaded = _once(manager.loaded())  # unloaded between the snapshot and the call
    assert asyncio.run(reported_kv_usage(manager)) == {}  # type: ignore[arg-type]
    assert calls == []


def _once(first: list[Any]) -> Any:
    """`loaded()` that answers `first` once, then nothing (the model was unloaded)."""
    answers = [first]
    return lambda: answers.pop() if answers else []


def test_a_busy_model_is_not_waited_for_and_reports_its_last_answer() -> None:
    """A model with requests in flight: the scrape asks its worker for the next scrape
    and returns at once; once the answer is in, the next scrape reports it."""
    step = threading.Event()  # the worker's step in progress: it answers after it
    engine = _Engine(lambda: step.wait(10) and {"kv_usage": 0.5})
    manager = _manager(refs=1, busy=engine)
    assert asyncio.run(reported_kv_usage(manager)) == {}  # type: ignore[arg-type]
    asking = kv_stats._PROBES.pending(id(engine))  # the question the scrape asked
    assert asking is not None
    step.set()
    asking.result(10)
    assert asyncio.run(reported_kv_usage(manager)) == {"busy": 0.5}  # type: ignore[arg-type]


def test_an_idle_models_answer_stands_until_a_request_uses_it() -> None:
    """Idle, the last answer is reported (and asked again for the next scrape); once a
    request has used the model, the scrape waits for a new answer."""
    usage = {"now": 0.1}
    engine = _Engine(lambda: {"kv_usage": usage["now"]})
    manager = _manager(idle=engine)
    scrape = lambda: asyncio.run(reported_kv_usage(manager))  # type: ignore[arg-type]  # noqa: E731
    assert scrape() == {"idle": 0.1}
    usage["now"] = 0.2  # changed in the background (the KV cache's disk tier, say)
    assert scrape() == {"idle": 0.1}  # the answer that stands; a new one is asked
    _landed(engine)
    assert scrape() == {"idle": 0.2}
    usage["now"] = 0.3
    manager.loaded()[0].last_used = 1  # a request ran since
    assert scrape() == {"idle": 0.3}


def _landed(engine: _Engine) -> None:
    """Wait until the question a scrape asked `engine`'s worker, if still in flight, is
    answered."""
    asking = kv_stats._PROBES.pending(id(engine))
    if asking is not None:
        asking.result(10)


def test_an_answer_kept_for_another_engine_at_a_reused_id_is_not_reported() -> None:
    """Answers are kept by id(engine), and a freed engine's id goes to the next engine
    made: a census reported a previous test's 0.5 for this one's 0.1."""
    engine = _Engine(lambda: {"kv_usage": 0.1})
    manager = _manager(idle=engine)
    gone = _Engine(lambda: {"kv_usage": 0.5})
    use = getattr(manager.loaded()[0], "last_used", None)
    stale = kv_stats._Answer(time.monotonic(), use, 0.5, weakref.ref(gone))
    kv_stats._PROBES.start(id(engine), lambda: stale)  # as if kept from `gone`
    _landed(engine)
    assert asyncio.run(reported_kv_usage(manager)) == {"idle": 0.1}  # type: ignore[arg-type]
