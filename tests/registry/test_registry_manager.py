"""The memory manager with injected memory figures: tiers, eviction by memory (LRU,
hot → warm before warm → cold), pins, 503 with the numbers, keep-alive, resize.

Engines are fakes that record sleep/wake/resize; plans are real plans of a tiny model
whose memory figures are replaced by round numbers, so every charge is known exactly.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from inferenceos.errors import ModelNotFoundError
from inferenceos.plan.entry import LoadRequest
from inferenceos.plan.llama_params import LlamaParams
from inferenceos.plan.memory import MemoryEstimate
from inferenceos.plan.plan import Plan
from inferenceos.registry.budget import MemoryBudget
from inferenceos.registry.catalog import ResolvedModel
from inferenceos.registry.leases import HOT, WARM
from inferenceos.registry.manager import ModelManager, NoRoomError
from plan_factories import GiB, machine

MB = 1_000_000
# each model: 60 MB of weights, 20 MB KV, 20 MB compute (hot 100 MB, warm 60 MB)
WEIGHTS, KV, COMPUTE = 60 * MB, 20 * MB, 20 * MB


class FakeEngine:
    def __init__(self, path: Path, params: LlamaParams, slots: int) -> None:
        self.path, self.params, self.slots = path, params, slots
        self.closed, self.asleep, self.resized = False, False, 0
        self.n_ctx, self.load_s = params.n_ctx // slots, 0.0

    def chat_prompt(self, messages: Sequence[Any], template: str | None = None,
                    tools: Sequence[dict[str, Any]] | None = None) -> str:
        return ""

    def generate(self, prompt: Any, sampling: Any, cancel: Any = None) -> Any:
        raise NotImplementedError

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return []

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return []

    def sleep(self) -> float:
        self.asleep = True
        return 0.0

    def wake(self) -> float:
        self.asleep = False
        return 0.0

    def resize(self, n_ctx: int, n_parallel: int | None = None) -> dict[str, Any]:
        self.resized += 1
        self.n_ctx = n_ctx
        return {"carried": 0}

    def close(self) -> None:
        self.closed = True


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def resolved(name: str) -> ResolvedModel:
    return ResolvedModel(f"{name}:latest", Path(f"/m/{name}.gguf"), "0" * 64, 100, "llama",
                         "F32", 1, 8192, 0.0)


@pytest.fixture
def base_plan(tiny_llama: Path) -> Plan:
    from inferenceos.plan.entry import plan_load
    from inferenceos.plan.model_facts import load_model_facts

    return plan_load(load_model_facts(tiny_llama), machine(ram=8 * GiB), LoadRequest())


def figures(plan: Plan, n_ctx: int) -> Plan:
    """`plan` with round memory figures: KV and compute scale with the context."""
    scale = n_ctx / 4096
    kv, compute = int(KV * scale), int(COMPUTE * scale)
    m = plan.memory
    memory = MemoryEstimate(
        weights={"CPU": WEIGHTS}, repack=0, kv={"CPU": kv}, compute={"CPU": compute},
        output=0, overhead=0, context=m.context, by_device={"CPU": WEIGHTS + kv + compute},
    )
    return replace(plan, memory=memory, ctx=replace(plan.ctx, n_ctx=n_ctx))


def make(base_plan: Plan, cap: int | None = 2 * (WEIGHTS + KV + COMPUTE),
         **kw: Any) -> tuple[ModelManager, list[FakeEngine], Clock]:
    made: list[FakeEngine] = []
    clock = Clock()

    def factory(path: Path, params: LlamaParams, slots: int, **_: Any) -> FakeEngine:
        made.append(FakeEngine(path, params, slots))  # the drafter (`draft=`) left out
        return made[-1]

    def resolve(name: str) -> ResolvedModel:
        if name.split(":")[0] not in ("a", "b", "c"):
            raise ModelNotFoundError(name)
        return resolved(name.split(":")[0])

    def planner(model: ResolvedModel, req: LoadRequest, m: Any) -> Plan:
        return figures(base_plan, req.n_ctx or 4096)

    budget = MemoryBudget(machine=lambda: machine(ram=64 * GiB), total_cap=cap)
    mgr = ModelManager(resolve, factory, planner=planner, budget=budget, clock=clock,
                       **{"context_hint": None, **kw})
    return mgr, made, clock


def tiers(mgr: ModelManager) -> dict[str, str]:
    return {lm.model.name.split(":")[0]: lm.tier for lm in mgr.loaded()}


def use(mgr: ModelManager, clock: Clock, name: str, **kw: Any) -> Any:
    clock.t += 1
    lease = mgr.acquire(name, **kw)
    lease.release()
    return lease


def test_each_model_is_charged_the_plans_figures(base_plan: Plan) -> None:
    mgr, made, clock = make(base_plan)
    use(mgr, clock, "a")
    (lm,) = mgr.loaded()
    assert lm.charge == lm.plan.memory.by_device == {"CPU": WEIGHTS + KV + COMPUTE}
    assert made[0].params == lm.plan.params()  # the engine got the plan's parameters


def test_third_model_demotes_lru_hot_to_warm_before_any_cold(base_plan: Plan) -> None:
    """Budget for two hot models: the third demotes both idle ones to warm (40 MB
    each), still 20 MB short, so the least recently used warm one goes cold."""
    mgr, made, clock = make(base_plan)
    use(mgr, clock, "a")
    use(mgr, clock, "b")
    lease = use(mgr, clock, "c")
    assert lease.fresh
    assert tiers(mgr) == {"b": WARM, "c": HOT}
    assert made[0].closed and made[1].asleep and not made[1].closed
    assert sum(lm.memory_bytes for lm in mgr.loaded()) <= 2 * (WEIGHTS + KV + COMPUTE)


def test_warm_model_is_promoted_without_a_reload(base_plan: Plan) -> None:
    mgr, made, clock = make(base_plan, cap=WEIGHTS * 2 + KV + COMPUTE)  # two weights, one ctx
    use(mgr, clock, "a")
    use(mgr, clock, "b")  # a goes warm: both weights, one context fit
    assert tiers(mgr) == {"a": WARM, "b": HOT}
    lease = use(mgr, clock, "a")
    assert lease.woke and not lease.fresh and len(made) == 2  # no new engine
    assert tiers(mgr) == {"a": HOT, "b": WARM}
    assert mgr.promotions_total == 1


def test_pinned_model_is_never_demoted(base_plan: Plan) -> None:
    mgr, made, clock = make(base_plan, pinned=["a:latest"])
    use(mgr, clock, "a")
    use(mgr, clock, "b")
    use(mgr, clock, "c")  # a is the LRU but pinned: b gives way
    assert tiers(mgr)["a"] == HOT and "c" in tiers(mgr)
    assert not made[0].asleep and not made[0].closed


def test_load_that_needs_a_pinned_models_memory_is_refused_with_figures(
    base_plan: Plan,
) -> None:
    mgr, _, clock = make(base_plan, cap=WEIGHTS + KV + COMPUTE + 50 * MB, pinned=["a:latest"])
    use(mgr, clock, "a")
    with pytest.raises(NoRoomError) as info:
        mgr.acquire("b")
    msg = str(info.value)
    assert "cannot load 'b:latest'" in msg and "short by" in msg and "pinned" in msg
    assert "CPU" in msg and ("MB" in msg or "MiB" in msg)


def test_busy_models_block_and_the_error_says_so(base_plan: Plan) -> None:
    mgr, _, _ = make(base_plan, cap=WEIGHTS + KV + COMPUTE)
    lease = mgr.acquire("a")
    with pytest.raises(NoRoomError, match="in use"):
        mgr.acquire("b")
    lease.release()
    mgr.acquire("b").release()  # a gives way once idle
    assert tiers(mgr) == {"b": HOT}


def test_max_models_is_only_an_extra_cap(base_plan: Plan) -> None:
    mgr, made, clock = make(base_plan, cap=None, max_loaded=2)
    for name in "abc":
        use(mgr, clock, name)
    assert set(tiers(mgr)) == {"b", "c"} and made[0].closed


def test_keep_alive_zero_forever_and_expiry(base_plan: Plan) -> None:
    mgr, _, clock = make(base_plan, cap=None, keep_alive_s=10)
    use(mgr, clock, "a")
    use(mgr, clock, "b", keep_alive=-1)
    clock.t += 11
    assert mgr.reap() == 1 and set(tiers(mgr)) == {"b"}  # b never expires by time
    use(mgr, clock, "c", keep_alive=0)
    assert mgr.reap() == 1 and set(tiers(mgr)) == {"b"}


def test_a_context_change_resizes_the_same_worker(base_plan: Plan) -> None:
    mgr, made, clock = make(base_plan, cap=None)
    use(mgr, clock, "a")
    lease = use(mgr, clock, "a", overrides={"n_ctx": 8192})
    assert len(made) == 1 and made[0].resized == 1  # no reload
    (lm,) = mgr.loaded()
    assert lm.n_ctx == 8192 and lm.charge["CPU"] == WEIGHTS + 2 * (KV + COMPUTE)
    assert "resized 4096 → 8192" in lm.reason and lease.loaded is lm


def test_other_load_changes_reload_an_idle_model(base_plan: Plan) -> None:
    mgr, made, clock = make(base_plan, cap=None)
    use(mgr, clock, "a")
    use(mgr, clock, "a", overrides={"threads": 1})
    assert len(made) == 2 and made[0].closed


def test_a_hot_model_is_leased_from_memory_alone(base_plan: Plan) -> None:
    """`try_acquire` (the event loop's) never loads nor waits on a load; a hot hit of
    `acquire` does not read the context hint (telemetry's database) again."""
    asked: list[str] = []

    def hint(model: ResolvedModel) -> None:
        asked.append(model.name)

    mgr, made, clock = make(base_plan, cap=None, context_hint=hint)
    assert mgr.try_acquire("a:latest") is None and not made  # not loaded: acquire's work
    use(mgr, clock, "a")
    assert asked == ["a:latest"] and len(made) == 1  # the load read the hint
    use(mgr, clock, "a")
    assert asked == ["a:latest"]  # the hot hit did not
    got: list[Any] = []
    with mgr._load_lock:  # a load of another model in progress
        t = threading.Thread(target=lambda: got.append(mgr.try_acquire("a:latest")))
        t.start()
        t.join(10)
    (lease,) = got
    assert lease is not None and lease.loaded is mgr.loaded()[0] and lease.loaded.refs == 1
    lease.release()
    use(mgr, clock, "a", overrides={"n_ctx": 8192})  # load settings: acquire's slow path
    assert made[0].resized == 1 and mgr.try_acquire("b:latest") is None


def test_concurrent_acquires_load_once(base_plan: Plan) -> None:
    mgr, made, _ = make(base_plan, cap=None)
    leases: list[Any] = []
    threads = [threading.Thread(target=lambda: leases.append(mgr.acquire("a")))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(made) == 1 and len(leases) == 8
    for lease in leases:
        lease.release()


def test_served_model_gets_the_same_plan_as_run_with_an_injected_gpu(
        tiny_llama: Path, quiet_cpus: None) -> None:
    """On a machine with a GPU (an injected profile), the server plans a model exactly
    as `run` does: same llama parameters, layers offloaded."""
    from inferenceos.cli.run_cmd import _plan_here
    from inferenceos.registry.catalog import Catalog
    from inferenceos.registry.store import ModelStore

    gpu_machine = machine(ram=16 * GiB, gpus=(8 * GiB,))
    catalog = Catalog(ModelStore(tiny_llama.parent / "store-gpu"))
    name = catalog.add_file(tiny_llama, "tiny").name
    mgr = ModelManager(catalog.resolve, planner=ModelManager.__init__.__kwdefaults__["planner"],
                       budget=MemoryBudget(machine=lambda: gpu_machine), context_hint=None)
    served = mgr.plan_for(name).params()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("inferenceos.plan.devices.local_machine", lambda: gpu_machine)
        ran = _plan_here(tiny_llama, LoadRequest(need_tokens=100)).params()
    assert served == ran
    assert served.n_gpu_layers > 0 and served.devices == ("GPU0",)


def test_a_promoted_model_no_longer_says_it_was_demoted(base_plan: Plan) -> None:
    """`ps` showed `hot … demoted to warm (memory)` for a model that was hot again."""
    mgr, _, clock = make(base_plan, cap=WEIGHTS * 2 + KV + COMPUTE)  # two weights, one ctx
    use(mgr, clock, "a")
    use(mgr, clock, "b")  # a goes warm
    (a,) = [m for m in mgr.ps() if m["name"] == "a:latest"]
    assert a["state"] == WARM and "demoted to warm (memory)" in a["reason"]
    use(mgr, clock, "a")  # a is promoted, b goes warm
    rows = {m["name"]: m for m in mgr.ps()}
    assert rows["a:latest"]["state"] == HOT and "demoted" not in rows["a:latest"]["reason"]
    assert "woke from warm" in rows["a:latest"]["reason"]
    assert "default context" in rows["a:latest"]["reason"]  # why it has its context stays
    assert "demoted to warm (memory)" in rows["b:latest"]["reason"]
    use(mgr, clock, "b")
    use(mgr, clock, "a")  # a second wake says so once
    (a,) = [m for m in mgr.ps() if m["name"] == "a:latest"]
    assert a["state"] == HOT and a["reason"].count("woke from warm") == 1


def test_load_pinned_loads_every_pinned_model_up_front(base_plan: Plan) -> None:
    mgr, made, _ = make(base_plan, cap=None, pinned=["b:latest", "a:latest"])
    started: list[str] = []
    assert mgr.load_pinned(on_start=started.append) == ["b:latest", "a:latest"] == started
    assert tiers(mgr) == {"a": HOT, "b": HOT} and len(made) == 2
    assert all(m["pinned"] and m["in_use"] == 0 and m["expires_at"] is None for m in mgr.ps())


def test_room_is_made_for_the_plans_drafter_before_the_load(base_plan: Plan) -> None:
    """A plan with a draft model of 30 MB priced beside it: the load makes room for the
    model and the drafter together, before the engine exists (the worker measures a
    drafter only once loaded). Within a cap that holds the model but not both, the
    load is refused with the figures and no engine is made; with room, it loads."""
    from inferenceos.plan.draft_choice import DraftOption, DraftPlan

    draft = DraftPlan("/m/draft.gguf", 1.4, "learned from 3 runs", "auto",
                      (DraftOption("/m/draft.gguf", 1.4, "learned", 0.3, 30 * MB,
                                   learned=True),))
    assert draft.memory == 30 * MB
    with_draft = replace(base_plan, draft=draft)
    mgr, made, clock = make(with_draft, cap=WEIGHTS + KV + COMPUTE + 20 * MB)
    with pytest.raises(NoRoomError, match="short by"):
        mgr.acquire("a")
    assert not made
    roomy, made, clock = make(with_draft, cap=WEIGHTS + KV + COMPUTE + 40 * MB)
    use(roomy, clock, "a")
    assert len(made) == 1


def _two_on_one_gpu(tiny_llama: Path) -> tuple[ModelManager, str, str, int]:
    """A manager with the real planner on an injected machine whose GPU holds one tiny
    model whole but not two; (manager, a, b, the GPU's bytes)."""
    from inferenceos.registry.catalog import Catalog
    from inferenceos.registry.store import ModelStore

    catalog = Catalog(ModelStore(tiny_llama.parent / "store-one-gpu"))
    a, b = (catalog.add_file(tiny_llama, n).name for n in ("a", "b"))
    planner = ModelManager.__init__.__kwdefaults__["planner"]
    roomy = ModelManager(catalog.resolve, planner=planner, context_hint=None,
                         budget=MemoryBudget(machine=lambda: machine(ram=16 * GiB,
                                                                     gpus=(8 * GiB,))))
    gpu = roomy.plan_for(a).charge()["GPU0"] * 3 // 2
    one_gpu = machine(ram=16 * GiB, gpus=(gpu,))
    mgr = ModelManager(catalog.resolve, lambda *_a, **_k: FakeEngine(Path(), LlamaParams(), 1),
                       planner=planner, budget=MemoryBudget(machine=lambda: one_gpu),
                       context_hint=None)
    return mgr, a, b, gpu


def test_an_idle_model_gives_the_gpu_to_the_next_within_its_memory(
        tiny_llama: Path, quiet_cpus: None) -> None:
    """The GPU's profile figure already is the capacity for all our models: a second
    model planned onto it demotes the idle first (before, each was planned as if it had
    the GPU alone, and both were charged there: 1.33x the GPU)."""
    mgr, a, b, gpu = _two_on_one_gpu(tiny_llama)
    mgr.acquire(a).release()
    mgr.acquire(b).release()
    held = sum(lm.charge.get("GPU0", 0) for lm in mgr.loaded())
    assert held <= gpu, (held, gpu, [(lm.model.name, lm.tier, lm.charge) for lm in mgr.loaded()])
    assert {lm.model.name.split(":")[0]: lm.tier for lm in mgr.loaded()}["b"] == HOT


def test_a_busy_models_gpu_share_is_not_offered_the_next_goes_beside_it(
        tiny_llama: Path, quiet_cpus: None) -> None:
    """A model in use cannot give the GPU back: the next is planned on what is left
    (layers in RAM or a smaller context: the planner's choice) and both run, instead of
    a refusal to retry later."""
    mgr, a, b, gpu = _two_on_one_gpu(tiny_llama)
    with mgr.acquire(a), mgr.acquire(b):
        charges = {lm.model.name.split(":")[0]: (lm.tier, lm.charge) for lm in mgr.loaded()}
    assert [t for t, _ in charges.values()] == [HOT, HOT], charges
    on_gpu = {n: c.get("GPU0", 0) for n, (_, c) in charges.items()}
    assert on_gpu["a"] > 0 and on_gpu["b"] <= gpu - on_gpu["a"], charges
