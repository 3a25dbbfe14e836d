"""The model pool `inferenceos serve` answers from, built once from its options.

`model_pool` makes the ModelManager (nothing loaded yet) with its engines' KV cache
tiers, the planner's base request and the pinned models resolved; `kv_cache_kw` is
the KV cache budgets `serve` gives each engine (and `simulate` predicts with). The
server itself (settings, the app, listening) stays the CLI's to start: this layer may
not import `server`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inferenceos.plan.entry import LoadRequest
    from inferenceos.plan.plan import Plan
    from inferenceos.registry.catalog import Catalog, ResolvedModel
    from inferenceos.registry.manager import ModelManager


@dataclass(frozen=True)
class PoolOptions:
    """How many models the server holds and for how long, and each one's batch, queue
    and KV cache tiers: the flags as given."""

    parallel: int = 4
    queue: int = 32
    keep_alive: float = 300.0
    max_models: int = 0
    memory_budget: str | None = None
    pin: tuple[str, ...] = ()
    kv_cache_ram: str | None = None
    kv_cache_disk: str | None = None

    def memory_cap(self) -> int | None:
        """--memory-budget in bytes (None: no cap); UsageError for a bad size."""
        from inferenceos.units import parse_size

        return parse_size(self.memory_budget) if self.memory_budget else None


def model_pool(
    cfg: Any, catalog: Catalog, pool: PoolOptions, request: Callable[..., LoadRequest], *,
    kv_policy: str, on_load: Callable[[str, Plan], None],
    lora: tuple[tuple[str, float], ...] = (), default_model: str = "",
) -> tuple[ModelManager, list[str]]:
    """The model pool and the names of the pinned models (`pool.pin`, then the config's
    server.pin), each resolved now (an unknown one fails). `request(reads_attention=,
    cached_turns=)` is the caller's base LoadRequest; it is validated here. `lora`: the
    `--lora` adapters of `default_model`, planned with it (as a preset's ADAPTERs are
    with the preset: `adapter_files`)."""
    from inferenceos.registry.budget import MemoryBudget
    from inferenceos.registry.manager import ModelManager, engine_factory

    kv_cache = kv_cache_kw(pool.kv_cache_ram, pool.kv_cache_disk, cfg, pool.memory_cap())
    base = request(
        reads_attention=reads_attention(kv_policy),
        # returning turns restore their history from the KV cache (plan/flash_attn.py)
        cached_turns=kv_cache["kv_cache_ram"] > 0 or kv_cache["kv_cache_disk"] > 0,
    )
    base.validate()
    pinned = [*pool.pin, *config_pins(cfg.get("server.pin"))]
    pins = [catalog.resolve(p).name for p in pinned]
    manager = ModelManager(
        catalog.resolve, factory=engine_factory(pool.queue, kv_policy=kv_policy, **kv_cache),
        budget=MemoryBudget(total_cap=pool.memory_cap()),
        base=base, slots=pool.parallel, keep_alive_s=pool.keep_alive,
        max_loaded=pool.max_models or None, pinned=pins, on_load=on_load,
        adapters=adapter_files(catalog, default_model, lora),
    )
    return manager, pins


def adapter_files(catalog: Catalog, default_model: str, lora: tuple[tuple[str, float], ...]
                  ) -> Callable[[ResolvedModel], tuple[str, ...]]:
    """The LoRA files a model is loaded with, for the planner to price: the server's
    `--lora` files for the default model, a preset's ADAPTER blobs for the preset."""
    from inferenceos.registry.presets import Preset

    default = catalog.resolve(default_model).name if default_model and lora else ""

    def files(model: ResolvedModel) -> tuple[str, ...]:
        out = [p for p, _ in lora] if default and model.name == default else []
        if model.preset is not None:
            out += [str(catalog.store.blob_path(d))
                    for d, _ in Preset.from_json(model.preset).adapters]
        return tuple(out)

    return files


def reads_attention(kv_policy: str) -> bool:
    """H2O reads attention probabilities, which llama.cpp has only with flash attention
    off: the planner must plan for that (UsageError for an unknown policy)."""
    from inferenceos.engine.kv.policies import load_policy

    return bool(getattr(load_policy(kv_policy), "needs_attention", False))


def config_pins(value: object) -> list[str]:
    """server.pin: model names separated by commas."""
    return [p.strip() for p in str(value or "").split(",") if p.strip()]


def kv_cache_kw(ram: str | None, disk: str | None, cfg: Any,
                memory_budget: int | None = None) -> dict[str, Any]:
    """The engines' KV cache budgets (engine/kv/store.py): the flags, else the config
    keys, else defaults from the free RAM and disk (under a --memory-budget, at most an
    eighth of it per model: the manager charges it); its disk tier under the data dir."""
    from inferenceos.engine.kv.store import default_budgets
    from inferenceos.paths import data_dir
    from inferenceos.units import parse_size

    root = data_dir() / "kv-cache"
    auto_ram, auto_disk = default_budgets(root)
    if memory_budget is not None:
        auto_ram = min(auto_ram, memory_budget // 8)
    ram = ram if ram is not None else cfg.get("kv_cache.ram")
    disk = disk if disk is not None else cfg.get("kv_cache.disk")
    return {"kv_cache_ram": parse_size(ram) if ram else auto_ram,
            "kv_cache_disk": parse_size(disk) if disk else auto_disk, "kv_cache_dir": root}
