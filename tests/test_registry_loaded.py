"""ModelManager: on-demand loads, keep-alive expiry, unload requests, LRU eviction."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from inferenceos.engine.session import LoadSettings
from inferenceos.errors import ModelNotFoundError
from inferenceos.registry.catalog import ResolvedModel
from inferenceos.registry.loaded import ModelBusyError, ModelManager


class FakeEngine:
    def __init__(self, path: Path, settings: LoadSettings) -> None:
        self.path, self.settings, self.closed = path, settings, False
        self.n_ctx, self.load_s = settings.n_ctx, 0.0

    def chat_prompt(self, messages: Sequence[Any], template: str | None = None,
                    tools: Sequence[dict[str, Any]] | None = None) -> str:
        return ""

    def generate(self, prompt: Any, sampling: Any, cancel: Any = None) -> Any:
        raise NotImplementedError

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return []

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return []

    def close(self) -> None:
        self.closed = True


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def model(name: str) -> ResolvedModel:
    return ResolvedModel(f"{name}:latest", Path(f"/m/{name}.gguf"), "0" * 64, 100, "llama",
                         "F32", 1, 2048, 0.0)


def make(clock: Clock, **kw: Any) -> tuple[ModelManager, list[FakeEngine]]:
    made: list[FakeEngine] = []

    def factory(path: Path, settings: LoadSettings) -> FakeEngine:
        made.append(FakeEngine(path, settings))
        return made[-1]

    def resolve(name: str) -> ResolvedModel:
        if name.split(":")[0] not in ("a", "b", "c"):
            raise ModelNotFoundError(name)
        return model(name.split(":")[0])

    kw.setdefault("estimate", lambda path, n_ctx: 100)
    return ModelManager(resolve, factory=factory, clock=clock, **kw), made


def test_loads_once_and_shares() -> None:
    mgr, made = make(Clock())
    with mgr.acquire("a") as l1, mgr.acquire("a:latest") as l2:
        assert l1.engine is l2.engine and l1.fresh and not l2.fresh
    assert len(made) == 1 and mgr.loads_total == 1
    assert made[0].settings.n_ctx == 2048  # min(4096, training context)


def test_keep_alive_expiry_and_forever() -> None:
    clock = Clock()
    mgr, made = make(clock, keep_alive_s=10)
    mgr.acquire("a").release()
    mgr.acquire("b", keep_alive=-1).release()
    clock.t += 9
    assert mgr.reap() == 0
    clock.t += 2
    assert mgr.reap() == 1 and made[0].closed and not made[1].closed
    clock.t += 10**6
    assert mgr.reap() == 0 and [m.model.name for m in mgr.loaded()] == ["b:latest"]
    assert mgr.evictions_total == {"expired": 1}


def test_busy_models_never_expire() -> None:
    clock = Clock()
    mgr, made = make(clock, keep_alive_s=1)
    lease = mgr.acquire("a")
    clock.t += 100
    assert mgr.reap() == 0 and not made[0].closed
    lease.release()
    clock.t += 2
    assert mgr.reap() == 1


def test_unload_now_or_after_the_last_lease() -> None:
    mgr, made = make(Clock())
    mgr.acquire("a").release()
    assert mgr.unload("a") and made[0].closed
    assert not mgr.unload("a")
    lease = mgr.acquire("b")
    assert mgr.unload("b") and not made[1].closed
    lease.release()
    assert mgr.reap() == 1 and made[1].closed  # zero keep-alive: expires at release


def test_lru_eviction_by_count_and_memory() -> None:
    clock = Clock()
    mgr, made = make(clock, max_loaded=2)
    for name in ("a", "b"):
        mgr.acquire(name).release()
        clock.t += 1
    mgr.acquire("a").release()  # a is now the most recently used
    mgr.acquire("c").release()
    assert made[1].closed and not made[0].closed  # b went
    mgr2, made2 = make(clock, memory_budget_bytes=150)
    mgr2.acquire("a").release()
    mgr2.acquire("b").release()
    assert made2[0].closed and mgr2.evictions_total == {"memory": 1}


def test_no_room_while_everything_is_busy() -> None:
    mgr, _ = make(Clock(), max_loaded=1)
    with mgr.acquire("a"), pytest.raises(ModelBusyError, match="retry later"):
        mgr.acquire("b")


def test_changed_settings_reload_an_idle_model_only() -> None:
    mgr, made = make(Clock())
    mgr.acquire("a").release()
    with mgr.acquire("a", overrides={"n_ctx": 512}) as lease:
        assert lease.engine is made[1] and made[0].closed
        with mgr.acquire("a", overrides={"n_ctx": 1024}) as again:
            assert again.engine is made[1]  # busy: used as it is
    assert mgr.settings_for(model("a"), {"n_ctx": 10**9}).n_ctx == 2048  # capped


def test_concurrent_acquires_load_once() -> None:
    mgr, made = make(Clock())
    leases = []
    threads = [threading.Thread(target=lambda: leases.append(mgr.acquire("a")))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1 and len(leases) == 8
    for lease in leases:
        lease.release()
    mgr.close()
    assert made[0].closed
