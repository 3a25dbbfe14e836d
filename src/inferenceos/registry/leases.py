"""Loaded models and the leases requests hold on them.

A `ResidentModel` is one model the manager holds in memory, hot or warm: its engine
(an `engine.client.EngineClient`) with its plan, tier and bookkeeping. (It was named
LoadedModel, which is also engine/session.py's llama.cpp model and context.) A `Lease`
is one request's hold on it (while leased, a model is never demoted or unloaded).
Times come from `time.monotonic` unless stated.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from inferenceos.engine.client import EngineClient
from inferenceos.plan.llama_params import LlamaParams
from inferenceos.plan.plan import Plan
from inferenceos.registry.catalog import ResolvedModel

HOT, WARM, COLD = "hot", "warm", "cold"


@dataclass
class ResidentModel:
    """A model in the manager's memory (hot or warm): its engine and bookkeeping.

    `charge` is what the model holds per device in its current tier: the plan's own
    figures (`Plan.charge`), never a separate estimate. `reason` says why the model
    has its current size / tier (what `ps` shows).
    """

    model: ResolvedModel
    engine: EngineClient
    plan: Plan
    slots: int
    loaded_at: float
    keep_alive: float
    last_used: float
    tier: str = HOT
    pinned: bool = False
    refs: int = 0
    expires_at: float | None = None  # monotonic deadline once idle; None: never
    reason: str = ""
    hot_reason: str = ""  # the reason it had when hot, kept while warm (shown on waking)
    key: tuple[Any, ...] = field(default_factory=tuple)  # the load request it answers
    extra: dict[str, int] = field(default_factory=dict)  # e.g. a draft model, per device
    kv_cache_ram: int = 0  # of `extra`: the KV cache's RAM tier budget (engine/kv/store.py)

    @property
    def charge(self) -> dict[str, int]:
        """The plan's figures for the tier, plus what the worker holds besides the
        model (a speculative draft model's weights and KV stay in both tiers)."""
        charge = self.plan.charge(warm=self.tier == WARM)
        for dev, b in self.extra.items():
            charge[dev] = charge.get(dev, 0) + b
        return charge

    @property
    def memory_bytes(self) -> int:
        return sum(self.charge.values())

    @property
    def vram_bytes(self) -> int:
        return sum(b for d, b in self.charge.items() if d != "CPU")

    @property
    def settings(self) -> LlamaParams:
        """The llama parameters the engine was loaded with (the plan's)."""
        return self.plan.params()

    @property
    def n_ctx(self) -> int:
        """Context of one sequence."""
        return self.plan.ctx.n_ctx // max(1, self.slots)

    def expires_wall(self, now: float) -> float | None:
        """Wall-clock expiry (for /api/ps): when busy, as if released now."""
        if self.keep_alive < 0:
            return None
        deadline = self.expires_at if self.refs == 0 and self.expires_at else now + self.keep_alive
        return time.time() + (deadline - now)


class Releaser(Protocol):
    """Who hands leases out and takes them back (the `ModelManager`)."""

    def _release(self, lm: ResidentModel) -> None: ...


@dataclass
class Lease:
    """A loaded model in use by one request; `release()` (or `with`) hands it back."""

    manager: Releaser
    loaded: ResidentModel
    fresh: bool = False  # this acquire loaded the model (cold → hot)
    woke: bool = False  # this acquire promoted it (warm → hot)
    released: bool = field(default=False)

    @property
    def engine(self) -> EngineClient:
        return self.loaded.engine

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.manager._release(self.loaded)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
