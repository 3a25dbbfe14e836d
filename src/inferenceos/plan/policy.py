"""Scheduling policies: the planner's objective (pure).

- `latency`  — the lowest time per token for one user: one sequence slot, an f16 KV
  cache (quantized KV costs dequantization on every attention read), the largest
  ubatch that fits (up to 2048: the shortest TTFT on long prompts), every layer that
  fits on the accelerators (context shrinks before layers leave a GPU: the preflight's
  own order).
- `capacity` — the most context and concurrency in the memory budget: `CAPACITY_SLOTS`
  sequence slots, the model's training context per slot (the preflight halves it until
  it fits), a q8_0 KV cache (half the bytes of f16) and a 256-token ubatch (a smaller
  compute buffer leaves more memory to the KV cache).
- `throughput` — the most tokens per second summed over concurrent requests:
  `THROUGHPUT_SLOTS` sequence slots decoded together (continuous batching reads the
  weights once per step for all of them), the balanced context per slot, the KV type
  left to the planner (f16 unless memory forces less: a quantized cache costs every
  step a dequantization) and the largest ubatch up to 1024 that fits and prefills
  faster (several prompts arrive at once).
- `balanced` — the planner's defaults (one slot, 4096 tokens or what the request needs,
  f16 KV unless memory forces q8_0, ubatch sized to the prefill curve).
- `adaptive` — one of the above chosen from the model's recorded workload (telemetry):
  long prompts → capacity, concurrent short requests → throughput, single short
  requests → latency, no history or a mix → balanced.

`choose(policy, facts, history)` says what the policy changes; `apply_to_request` turns
it into the planner's `LoadRequest` (known here by its shape, `PolicyRequest`: the
entry point imports this module), `apply_to_plan` sizes the ubatch afterwards.
"""

from __future__ import annotations

from dataclasses import Field, dataclass, replace
from typing import Any, ClassVar, Protocol, TypeVar

from inferenceos.errors import UsageError
from inferenceos.plan.devices import Machine
from inferenceos.plan.memory import compute_terms
from inferenceos.plan.model_facts import ModelFacts
from inferenceos.plan.perf import Calibration, prefill_cost
from inferenceos.plan.plan import Change, Plan

POLICIES = ("latency", "throughput", "capacity", "balanced", "adaptive")
CAPACITY_SLOTS = 4
THROUGHPUT_SLOTS = 4  # Gemma 3 270M here: 4 streams 58.7 t/s summed against 41.7 alone
THROUGHPUT_MAX_UBATCH = 1024
LATENCY_MAX_UBATCH = 2048
CAPACITY_UBATCH = 256
LONG_PROMPT = 2048


class PolicyRequest(Protocol):
    """The fields of a load request a policy reads and may set: a dataclass with these
    (plan.entry.LoadRequest, which imports this module, so it is not named here)."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]

    @property
    def n_ctx(self) -> int: ...
    @property
    def n_seq(self) -> int: ...
    @property
    def need_tokens(self) -> int: ...
    @property
    def type_k(self) -> str | None: ...
    @property
    def type_v(self) -> str | None: ...
    @property
    def flash_attn(self) -> bool | None: ...


Req = TypeVar("Req", bound=PolicyRequest)


@dataclass(frozen=True)
class RecordedWorkload:
    """What the telemetry store says this model's requests looked like."""

    runs: int = 0
    concurrency_p90: float = 1.0
    prompt_p50: float = 0.0


@dataclass(frozen=True)
class PolicyChoice:
    """What a policy asks of the planner. None / 0: leave it to the planner."""

    policy: str  # as asked
    resolved: str  # adaptive resolves to one of the other four
    n_seq: int = 1
    max_context: bool = False  # ask for the training context (preflight may shrink it)
    kv_type: str | None = None
    max_ubatch: int = 0  # latency: the largest that fits up to this
    ubatch: int = 0  # capacity: exactly this (or what the preflight lowers it to)
    why: str = ""

    def changes(self) -> list[str]:
        """What differs from `balanced`, one phrase each."""
        out = []
        if self.n_seq > 1:
            out.append(f"{self.n_seq} sequence slots")
        if self.max_context:
            out.append("the training context per slot (shrunk to fit)")
        if self.kv_type:
            out.append(f"{self.kv_type} KV cache")
        if self.max_ubatch:
            out.append(f"largest ubatch that fits (up to {self.max_ubatch})")
        if self.ubatch:
            out.append(f"ubatch {self.ubatch}")
        return out


def choose(policy: str, facts: ModelFacts, history: RecordedWorkload | None = None) -> PolicyChoice:
    """The settings `policy` asks for on `facts` (UsageError for an unknown name)."""
    p = policy.strip().lower()
    if p not in POLICIES:
        raise UsageError(f"unknown policy {policy!r} (one of {', '.join(POLICIES)})")
    why = ""
    resolved = p
    if p == "adaptive":
        resolved, why = _adapt(history)
    quant_ok = facts.spec.key_length % 32 == 0 and facts.spec.value_length % 32 == 0
    if resolved == "latency":
        return PolicyChoice(p, resolved, kv_type="f16", max_ubatch=LATENCY_MAX_UBATCH, why=why)
    if resolved == "throughput":
        return PolicyChoice(p, resolved, n_seq=THROUGHPUT_SLOTS,
                            max_ubatch=THROUGHPUT_MAX_UBATCH, why=why)
    if resolved == "capacity":
        return PolicyChoice(
            p, resolved, n_seq=CAPACITY_SLOTS, max_context=True,
            kv_type="q8_0" if quant_ok else None, ubatch=CAPACITY_UBATCH, why=why,
        )
    return PolicyChoice(p, "balanced", why=why)


def _adapt(h: RecordedWorkload | None) -> tuple[str, str]:
    if h is None or h.runs == 0:
        return "balanced", "no recorded workload for this model yet"
    seen = f"{h.runs} recorded runs: p90 concurrency {h.concurrency_p90:g}, median prompt "
    seen += f"{h.prompt_p50:.0f} tokens"
    if h.prompt_p50 >= LONG_PROMPT:
        return "capacity", seen
    if h.concurrency_p90 > 1:
        return "throughput", seen
    if h.runs >= 3:
        return "latency", seen
    return "balanced", seen


def apply_to_request(choice: PolicyChoice, req: Req, facts: ModelFacts) -> Req:
    """`req` with the policy's asks; what the caller pinned (n_ctx, KV types) wins."""
    kw: dict[str, object] = {}
    if choice.n_seq > 1 and req.n_seq == 1:
        kw["n_seq"] = choice.n_seq
    if choice.max_context and not req.n_ctx:
        kw["need_tokens"] = max(req.need_tokens, facts.spec.context_length or 0)
    if choice.kv_type and req.type_k is None and req.type_v is None:
        kw["type_k"] = kw["type_v"] = choice.kv_type
        if choice.kv_type != "f16":
            kw["flash_attn"] = True  # a quantized V cache needs it
    return replace(req, **kw) if kw else req


def apply_to_plan(
    choice: PolicyChoice, plan: Plan, facts: ModelFacts, machine: Machine, cal: Calibration
) -> Plan:
    """The plan's ubatch as the policy wants it, within the memory the plan leaves."""
    from inferenceos.plan.footprint import estimate

    if not (choice.max_ubatch or choice.ubatch) or plan.disk_bound:
        return plan
    headroom = machine.cpu.memory_bytes - plan.memory.by_device.get("CPU", 0)
    headroom += plan.memory.compute.get("CPU", 0)

    def fits(n: int) -> bool:
        trial = replace(plan.ctx, n_ubatch=n, n_batch=max(n, plan.ctx.n_batch))
        return compute_terms(facts, trial).total <= headroom

    cur = plan.ctx.n_ubatch
    if choice.ubatch:
        n = min(choice.ubatch, cur)
    else:
        n = cur
        for cand in (1024, 2048):
            if cand <= choice.max_ubatch and cand <= plan.ctx.n_ctx and fits(cand):
                n = cand

        def tps(u: int) -> float:
            c = prefill_cost(facts, plan.placement, machine, plan.ctx, u, u, cal, plan.threads)
            return u / c.seconds

        if n != cur and tps(n) <= tps(cur):
            n = cur  # no faster prefill: keep the memory
    if n == cur:
        return plan
    ctx = replace(plan.ctx, n_ubatch=n, n_batch=max(n, plan.ctx.n_batch))
    ch = Change(f"ubatch {cur} → {n}", f"policy {choice.resolved}")
    return replace(
        plan, ctx=ctx, memory=estimate(facts, plan.placement, machine, ctx),
        changes=(*plan.changes, ch),
    )
