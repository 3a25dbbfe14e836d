"""simulate = plan + performance model → a Prediction, from metadata alone.

`simulate(path, machine, ...)` reads the GGUF header (never tensor data), makes a plan
with the preflight, and predicts prefill and decode speed, TTFT, total time, peak memory
per tier (each device, plus weights left on disk), memory traffic per token, the
bottleneck and a recommendation. `plan_for_run` is the same without the prediction,
for `inferenceos run`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from inferenceos.errors import UsageError
from inferenceos.hardware.cpu_load import CpuLoad
from inferenceos.model.projector import load_projector
from inferenceos.plan import speculative as spec
from inferenceos.plan.calibration_load import machine_calibration
from inferenceos.plan.devices import Machine
from inferenceos.plan.model_facts import ModelFacts, load_model_facts
from inferenceos.plan.perf import (
    Calibration,
    StepCost,
    decode_cost,
    engine_token_work,
    prefill_cost,
)
from inferenceos.plan.plan import Plan
from inferenceos.plan.policy import PolicyChoice, apply_to_plan, apply_to_request
from inferenceos.plan.projector import EncoderTime, encoder_time
from inferenceos.plan.speculative import DraftPrediction

DEFAULT_CTX = 4096


@dataclass(frozen=True)
class Workload:
    """What the user will do: prompt and output lengths, requested context."""

    prompt_tokens: int = 512
    output_tokens: int = 128
    n_ctx: int | None = None  # None: the planner picks (DEFAULT_CTX or the model's)
    image_tokens: int = 0  # media tokens in the prompt besides its text tokens


@dataclass(frozen=True)
class Prediction:
    """What `simulate --json` prints (see `to_json` for the keys)."""

    plan: Plan
    machine: Machine
    workload: Workload
    prefill_tps: float
    decode_tps: float
    ttft_s: float
    total_s: float
    peak_memory: dict[str, int]
    traffic_per_token: dict[str, float]
    bottleneck: str
    recommendation: str
    calibration: Calibration
    decode_parts: dict[str, float] = field(default_factory=dict)
    policy: PolicyChoice | None = None
    # the projector's encoder for the workload's image tokens (None: no projector)
    encoder: EncoderTime | None = None
    # speculative decoding's expected gain (`with_draft`; None: not asked)
    draft: DraftPrediction | None = None
    # the drafter the plan itself picked (`run` and `serve` draft with it), priced as
    # `with_draft` prices one; None: the plan decodes plainly (`with_planned_draft`)
    planned_draft: DraftPrediction | None = None
    # seconds per decoded token of our own work outside llama.cpp (perf.engine_token_work)
    engine_s: float = 0.0

    @property
    def draft_decode_tps(self) -> float:
        """Decode t/s with the drafter of `draft` (plain decode without one)."""
        return self.decode_tps * (self.draft.speedup if self.draft else 1.0)

    @property
    def expected_decode_tps(self) -> float:
        """Decode t/s as `run` will decode with this plan: with the plan's own drafter
        when it picked one (`planned_draft`), else plain decoding's."""
        d = self.planned_draft
        return self.decode_tps * (d.speedup if d is not None else 1.0)

    @property
    def decode_assumes(self) -> str:
        """What `expected_decode_tps` assumes, in words: 'plain decoding' or the plan's
        drafter, its speedup and what it rests on."""
        d = self.planned_draft
        if d is None:
            return "plain decoding (the plan picks no drafter)"
        name = d.drafter if d.drafter in ("ngram", "self") else Path(d.drafter).name
        return f"{name} drafts, x{d.speedup:.2f} ({d.basis})"

    @property
    def feasible(self) -> bool:
        return self.plan.feasible

    def to_json(self) -> dict[str, Any]:
        return {
            "feasible": self.plan.feasible,
            "disk_bound": self.plan.disk_bound,
            "prefill_tps": round(self.prefill_tps, 2),
            "decode_tps": round(self.decode_tps, 2),
            "ttft_s": round(self.ttft_s, 4),
            "total_s": round(self.total_s, 3),
            "peak_memory_bytes": self.peak_memory,
            "traffic_bytes_per_token": {k: round(v) for k, v in self.traffic_per_token.items()},
            "bottleneck": self.bottleneck,
            "recommendation": self.recommendation,
            "decode_seconds_by_resource": {k: round(v, 6) for k, v in self.decode_parts.items()},
            "engine_seconds_per_token": round(self.engine_s, 6),
            "expected_decode_tps": round(self.expected_decode_tps, 2),
            "decode_assumes": self.decode_assumes,
            "encoder": self.encoder.to_json() if self.encoder is not None else None,
            "speculative": None if self.draft is None else {
                **self.draft.to_json(), "decode_tps": round(self.draft_decode_tps, 2)},
            "workload": self.workload.__dict__,
            "machine": self.machine.to_json(),
            "basis": self.calibration.basis,
            "confidence": self.calibration.confidence,
            "calibration_runs": self.calibration.runs,
            "calibration": self.calibration.to_json(),
            "plan": self.plan.to_json(),
        }


def plan_for_run(
    facts: ModelFacts,
    machine: Machine,
    n_ctx: int | None = None,
    threads: int = 0,
    type_k: str = "f16",
    type_v: str = "f16",
    flash_attn: bool | None = None,
    n_seq: int = 1,
    calibration: Calibration | None = None,
    swa_full: bool = True,
    allow_kv_quantization: bool = True,
    need_tokens: int = 0,
    mmproj: str | Path | None = None,
) -> Plan:
    """The plan `run` should load: preflight-checked, ubatch sized to the headroom.

    `swa_full` defaults to llama.cpp's own default (True) because the engine's
    LlamaParams cannot yet ask for False; pass False once it can (SWA models then need
    far less KV). With `allow_kv_quantization` False the preflight never picks a
    quantized cache (for engines that cannot load one). Without `n_ctx` the context
    holds at least `need_tokens` (prompt + output). `mmproj`: a multimodal projector
    loaded with the model (`Plan.projector` says where its encoder goes: pass
    `plan.projector.use_gpu` to the engine). Raises PlanRefused (an InferenceOSError)
    when nothing fits.
    """
    from inferenceos.plan.entry import LoadRequest, plan_load

    req = LoadRequest(
        n_ctx=(n_ctx or 0) // max(1, n_seq), n_seq=n_seq, threads=threads,
        type_k=type_k if type_k != "f16" or not allow_kv_quantization else None,
        type_v=type_v if type_v != "f16" or not allow_kv_quantization else None,
        flash_attn=flash_attn, swa_full=swa_full, need_tokens=need_tokens, mmproj=mmproj,
    )
    return plan_load(facts, machine, req, calibration)


def simulate(
    path: str | Path,
    machine: Machine,
    workload: Workload,
    threads: int = 0,
    type_k: str = "f16",
    type_v: str = "f16",
    calibration: Calibration | None = None,
    policy: PolicyChoice | None = None,
    cpu_load: CpuLoad | None = None,
    mmproj: str | Path | None = None,
    kv_quality: str | None = None,
    explain: bool = False,
    draft: str | None = None,
) -> Prediction:
    """Plan and predict for `path` on `machine` (metadata only). `policy` (plan/policy.py)
    changes the objective; `cpu_load` makes the thread count load-aware; `mmproj` a
    multimodal projector loaded beside the model (its memory in the plan, its encoder
    time in the TTFT of `workload.image_tokens`); `kv_quality` the lowest KV precision
    the plan may take; with `explain` the plan keeps the alternatives it rejected;
    `draft` is the plan's drafter request (LoadRequest.draft: auto lets it choose). The
    predicted decode is plain decoding's (`with_draft` adds a drafter's)."""
    from inferenceos.plan.entry import LoadRequest, plan_load

    facts = load_model_facts(path)
    cal = calibration or machine_calibration()
    explicit = type_k != "f16" or type_v != "f16"
    req = LoadRequest(
        n_ctx=workload.n_ctx or 0, threads=threads,
        type_k=type_k if explicit else None, type_v=type_v if explicit else None,
        need_tokens=workload.prompt_tokens + workload.output_tokens,
        prompt_tokens=workload.prompt_tokens, cpu_load=cpu_load,
        mmproj=mmproj, image_tokens=workload.image_tokens, kv_quality=kv_quality,
        explain=explain, draft=draft,
    )
    if policy is not None:
        req = apply_to_request(policy, req, facts)
    plan = plan_load(facts, machine, req, cal)
    if policy is not None:
        plan = apply_to_plan(policy, plan, facts, machine, cal)
    return with_planned_draft(replace(predict(facts, machine, plan, workload, cal),
                                      policy=policy))


def predict(
    facts: ModelFacts, machine: Machine, plan: Plan, w: Workload, cal: Calibration
) -> Prediction:
    """The performance half of simulate, for an existing plan."""
    pl, ctx = plan.placement, plan.ctx
    # image tokens are decoded like prompt tokens once the encoder has made them
    n_in = w.prompt_tokens + w.image_tokens
    pre = prefill_cost(facts, pl, machine, ctx, n_in, ctx.n_ubatch, cal, plan.threads)
    mid = n_in + w.output_tokens // 2
    dec = decode_cost(facts, pl, machine, ctx, mid, cal, plan.threads)
    enc = _encoder(plan, machine, w, cal)
    ttft = pre.seconds + cal.token_overhead_s + (enc.seconds if enc is not None else 0.0)
    total = ttft + max(w.output_tokens - 1, 0) * dec.seconds
    peak = dict(plan.memory.by_device)
    if pl.disk_bytes:
        peak["CPU"] = machine.cpu.memory_bytes
        # what the limit must hold, and what the kernel may reclaim (docs/plan.md, Tiers)
        tiers = plan.memory.tiers(machine.cpu.memory_bytes)
        peak["CPU anonymous"] = tiers["anonymous"]
        peak["CPU page cache"] = tiers["page cache"]
        peak["disk (mmap)"] = pl.disk_bytes
    traffic = {d: pl.decode_load(d).bytes_read for d in pl.loads}
    engine = engine_token_work(facts, cal) / (cal.decode_scale if cal.decode_scale > 0 else 1.0)
    return Prediction(
        plan=plan,
        machine=machine,
        workload=w,
        prefill_tps=n_in / pre.seconds if pre.seconds else 0.0,
        decode_tps=1.0 / dec.seconds if dec.seconds else 0.0,
        ttft_s=ttft,
        total_s=total,
        peak_memory=peak,
        traffic_per_token=traffic,
        bottleneck=dec.bottleneck,
        recommendation=recommend(plan, dec, machine),
        calibration=cal,
        decode_parts=dict(dec.parts),
        encoder=enc,
        engine_s=engine,
    )


def _encoder(plan: Plan, machine: Machine, w: Workload, cal: Calibration) -> EncoderTime | None:
    """The encoder time of the plan's projector for `w.image_tokens` (None without one)."""
    if plan.projector is None:
        return None
    pf = load_projector(plan.projector.path)
    return encoder_time(pf, plan.projector, machine, w.image_tokens, cal, plan.threads)


def with_draft(pred: Prediction, drafter: str, task: str | None = None,
               learned: bool = True) -> Prediction:
    """`pred` with the speedup `drafter` ('ngram', 'self' or a draft .gguf) should give
    (plan/speculative.py): learned from the model's recorded drafted runs when
    `learned` and no `task` is named, else the task's prior. The cost of a draft token
    is the plan's where it priced the drafter (plan/draft_choice.py), else a draft
    model's size against the model's plus the prior row. A draft model's weights are a
    peak-memory entry of their own (the engine loads it beside the model, with the
    model's placement)."""
    facts = load_model_facts(pred.plan.model_path)
    target = facts.spec.tensor_bytes
    cost, peak = None, pred.peak_memory
    kind = spec.drafter_kind(drafter)
    if kind == "model":
        draft_facts = load_model_facts(drafter)
        cost = spec.model_draft_cost(draft_facts.spec.tensor_bytes, target)
        peak = {**peak, "draft model": draft_facts.spec.tensor_bytes}
    elif kind == "self":
        cost = spec.self_draft_bytes(facts) / max(target, 1) + spec.VERIFY_ROW_COST
    elif kind != "ngram":
        raise UsageError(f"unknown drafter {drafter!r} (use ngram, self or a .gguf path)")
    priced = pred.plan.draft.option(drafter) if pred.plan.draft is not None else None
    if priced is not None:  # the plan's own price: its verification row, not the prior's
        cost = priced.cost
    evidence = spec.learned_draft(facts.spec.path, drafter) if learned else None
    return replace(pred, draft=spec.predict_draft(drafter, task, cost, evidence),
                   peak_memory=peak)


def with_planned_draft(pred: Prediction) -> Prediction:
    """`pred` with the drafter its plan picked priced (`planned_draft`, as `with_draft`
    prices it: the plan's cost per draft token, what this model's recorded runs
    measured), so that `expected_decode_tps` is what `run` will decode at. Unchanged
    when the plan decodes plainly."""
    d = pred.plan.draft
    if d is None or d.drafter is None or spec.drafter_kind(d.drafter) not in (
            "ngram", "self", "model"):  # a plugin drafter: nothing prices it
        return pred
    priced = with_draft(pred, d.drafter)
    return replace(pred, planned_draft=priced.draft)


def recommend(plan: Plan, dec: StepCost, machine: Machine) -> str:
    """One actionable sentence from the bottleneck."""
    b = dec.bottleneck
    if plan.disk_bound:
        return (
            "weights stream from disk at every token: use a smaller quantization, add "
            "RAM or a GPU, or put the file on faster storage"
        )
    if b.startswith("link RPC["):
        worker = b.removeprefix("link ")
        return (
            f"round trips to {worker} limit decode (one per token per remote block): give "
            "this machine more memory (--ram) so fewer layers go remote, or use a "
            "lower-latency network"
        )
    if "link" in b:
        return "activations cross the host-device link often: keep more layers on one device"
    if b.startswith("CPU memory") and machine.accelerators:
        return "the CPU's memory bandwidth limits decode: free GPU memory to offload more"
    if b.startswith("CPU memory"):
        return (
            "decode is memory-bandwidth bound: a smaller quantization (fewer bytes per "
            "token) or a GPU would speed it up; more threads will not"
        )
    if b.startswith("CPU compute"):
        return "decode is compute bound on the CPU: more threads or a GPU would help"
    if "overhead" in b:
        return "per-token overhead dominates (a small model): batching requests raises throughput"
    return f"{b} limits decode"
