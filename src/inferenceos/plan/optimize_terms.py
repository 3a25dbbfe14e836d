"""perf.py's cost model, written as linear terms of the placement decisions.

For one `ContextSettings` the roofline in `perf.py` is, per device, the max of two sums
(memory time, compute time) over what the device holds, plus link and disk terms that
depend only on which devices are used, where the blocks meet and how many weight bytes
stay on disk. This module computes, for every decision the optimizer can take (layer i's
attention and KV on device d, its FFN group on d, its routed experts on d, the output
head on d), the seconds it adds to each of those sums, for decode (one token at the
workload's middle context) and for prefill (the workload's prompt). `optimize_milp.py`
turns them into a MILP; `optimize_exhaustive.py` never uses them (it asks perf.py
itself), which is what makes the equality tests a check of this translation.

Contract: for any placement in the optimizer's space, summing these terms as
`optimize_milp` does gives `perf.decode_cost(...).seconds` and `perf.prefill_cost(...)
.seconds` up to the fixed per-step overheads (constants) and float rounding. One
exception: a CPU whose decode weights fit in its cache (`Calibration.cpu_cache_bytes`,
`perf.CACHE_SHARE`) is not bound by its RAM in perf.py, and these terms keep the bound
(not linear in the items: a model of a few tens of MB, whose placement it never decides).
"""

from __future__ import annotations

from dataclasses import dataclass

from inferenceos.plan.devices import Device, Machine
from inferenceos.plan.memory import ContextSettings, kv_bytes_per_token
from inferenceos.plan.model_facts import ModelFacts
from inferenceos.plan.perf import (
    GB,
    GPU_BW_EFFICIENCY,
    LINK_LATENCY_S,
    RPC_COLOCATED_VISIT_S,
    RPC_GRAPH_BYTES_PER_LAYER,
    RPC_MESSAGE_S,
    RPC_MESSAGES_PER_SPLIT,
    Calibration,
    _attn_width,
    _cpu_kv_reads,
    _kv_span,
    cpu_threads_rate,
    disk_rate,
    disk_tier,
    gemm_weight,
    gemv_weight,
    prefill_arch_work,
    prefill_row_factor,
    read_share,
)
from inferenceos.plan.placement import LayerParts, output_head, routed_fraction


@dataclass(frozen=True)
class Work:
    """What one item costs on one device: (memory seconds, compute seconds)."""

    mem: float
    comp: float


@dataclass(frozen=True)
class Phase:
    """One evaluation the objective counts: decode (1 token) or prefill (the prompt)."""

    tokens: int
    ubatches: int
    n_kv: int  # cells the KQ mask spans (RPC wire bytes)
    n_past: int  # decode: tokens in the cache; prefill: unused
    weight: float  # seconds of this phase per second of objective (count / scale)
    decode: bool
    scale: float = 1.0  # the learned speed scale `weight` divides by (not the disk's)


def phases(
    prompt: int, output: int, n_ubatch: int, cal: Calibration
) -> tuple[Phase, Phase]:
    """(decode, prefill) as `simulate.predict` evaluates them: decode at the middle of
    the output, weighed by the tokens after the first; prefill once; in milliseconds."""
    n_ub = max(1, -(-prompt // max(n_ubatch, 1)))
    mid = prompt + output // 2
    ms = 1e3  # the objective in milliseconds: coefficients near 1 keep HiGHS fast
    d, p = _scale(cal.decode_scale), _scale(cal.prefill_scale)
    dec = Phase(1, 1, mid + 1, mid, ms * max(output - 1, 1) / d, True, d)
    pre = Phase(prompt, n_ub, prompt, 0, ms / p, False, p)
    return dec, pre


def _scale(s: float) -> float:
    return s if s > 0 else 1.0


class Terms:
    """The linear cost terms of one model, machine, context and workload phase."""

    def __init__(
        self, facts: ModelFacts, machine: Machine, ctx: ContextSettings,
        parts: list[LayerParts], cal: Calibration, threads: int, ph: Phase,
    ) -> None:
        self.facts, self.machine, self.ctx, self.parts = facts, machine, ctx, parts
        self.cal, self.threads, self.ph = cal, threads, ph
        self.frac = routed_fraction(facts)
        self.head_bytes, self.head_params = output_head(facts)
        self.gemv = gemv_weight(facts)
        self.gemm = gemm_weight(facts)
        n = max(facts.spec.block_count, 1)
        self.kv_tok = kv_bytes_per_token(facts, ctx) / n
        self.span = _kv_span(facts, ctx, ph.n_past)
        self.attn = _attn_width(facts)
        self.kv_reads = _cpu_kv_reads(facts)
        self.rows, self.arch = prefill_row_factor(facts), prefill_arch_work(facts)

    # -- per device rates ------------------------------------------------------------

    def _rates(self, dev: Device) -> tuple[float, float, bool]:
        """(memory bytes/s, compute rate, cpu-like) as perf._device_time uses them:
        the compute rate is bytes/s for CPU decode, FLOP/s otherwise."""
        cal = self.cal
        if dev.computes_like_cpu:
            threads = 0 if dev.is_remote else self.threads
            rate = cpu_threads_rate(dev, cal, threads, gemm=not self.ph.decode)
            return dev.bandwidth_gbps * GB * cal.cpu_bw_efficiency, rate, True
        return dev.bandwidth_gbps * GB * GPU_BW_EFFICIENCY, max(dev.tflops, 1e-3) * 1e12, False

    def _work(self, dev: Device, bytes_read: float, kv: float, flops: float) -> Work:
        bw, rate, cpu = self._rates(dev)
        ph = self.ph
        if ph.decode:
            mem = (bytes_read + kv) / bw
            comp = (bytes_read * self.gemv + kv) / rate if cpu else flops / rate
        else:
            mem = bytes_read * ph.ubatches / bw
            comp = flops * self.gemm / rate if cpu else flops / rate
        return Work(mem * ph.weight, comp * ph.weight)

    # -- items -----------------------------------------------------------------------

    def attention(self, dev: Device, p: LayerParts) -> Work:
        """What stays with the layer: its attention weights, norms, KV cache reads and
        the per-layer work (attention's FLOPs, the architecture's extra)."""
        ph = self.ph
        if ph.decode:
            kv = self.kv_tok * self.span
            if dev.computes_like_cpu:  # the CPU walks the cache per query head (perf)
                kv *= self.kv_reads
            flops = 2.0 * p.attention_params + 4.0 * self.attn * ph.n_past
            return self._work(dev, p.attention_bytes, kv, flops)
        params, per_layer = float(p.attention_params), 4.0 * self.attn * ph.tokens / 2
        if dev.computes_like_cpu:  # as perf.prefill_cost
            params, per_layer = params * self.rows, per_layer + self.arch
        flops = ph.tokens * (2.0 * params + per_layer)
        return self._work(dev, p.attention_bytes, 0.0, flops)

    def ffn(self, dev: Device, p: LayerParts) -> Work:
        """The layer's FFN group (placement.FFN_ROLE) on `dev`."""
        return self._matrices(dev, p.ffn_bytes, float(p.ffn_params))

    def experts(self, dev: Device, p: LayerParts) -> Work:
        """The layer's routed experts on `dev`: the share a token uses."""
        return self._matrices(dev, p.expert_bytes * self.frac, p.expert_params * self.frac)

    def _matrices(self, dev: Device, bytes_read: float, params: float) -> Work:
        """Weights read once per step and multiplied per token (no KV, no per-layer
        work): an FFN group or the experts a token routes to."""
        if self.ph.decode:
            return self._work(dev, bytes_read, 0.0, 2.0 * params)
        if dev.computes_like_cpu:  # as perf.prefill_cost
            params *= self.rows
        return self._work(dev, bytes_read, 0.0, 2.0 * params * self.ph.tokens)

    def head(self, dev: Device) -> Work:
        return self._work(dev, self.head_bytes, 0.0, 2.0 * self.head_params)

    # -- links and disk ----------------------------------------------------------------

    def crossing(self) -> float:
        """Seconds of one local activation crossing (perf._add_disk_and_links)."""
        ph = self.ph
        act = self.facts.spec.embedding_length * 4 * ph.tokens
        local = [d.link_gbps for d in self.machine.accelerators if d.link_gbps and not d.is_remote]
        link = min(local, default=12.0)
        return (LINK_LATENCY_S * ph.ubatches + act / (link * GB)) * ph.weight

    def rpc(self, dev: Device) -> tuple[float, float, float]:
        """(seconds if `dev` is used at all, more per layer on it, more if it holds the
        output head) — perf._rpc_link_time with one run per device (contiguity)."""
        ph, s = self.ph, self.facts.spec
        link = max(dev.link_gbps, 1e-3) * GB
        act = s.embedding_length * 4 * ph.tokens
        mask = 2 * max(ph.n_kv, 1) * ph.tokens * (2 if s.sliding_window else 1)
        visit = dev.rtt_s + RPC_MESSAGES_PER_SPLIT * RPC_MESSAGE_S
        if dev.co_located:
            visit += RPC_COLOCATED_VISIT_S
        used = ph.ubatches * visit + (act + mask + act) / link
        per_layer = 0.0 if ph.tokens == 1 else RPC_GRAPH_BYTES_PER_LAYER / link
        head = (s.vocab_size * 4 - act) / link
        return used * ph.weight, per_layer * ph.weight, head * ph.weight

    def disk_per_byte(self) -> float:
        # the disk's time is not scaled by the compute's learned speed (perf._scaled),
        # but by its own streaming rate (Calibration.disk_scale)
        rate = disk_rate(self.machine, self.cal)
        return self.ph.ubatches / rate * self.ph.weight * self.ph.scale

    def disk_segments(self) -> list[tuple[float, float]]:
        """perf.streamed_bytes as a convex piecewise-linear cost of the disk bytes:
        (bytes, seconds per byte) segments in the order the disk tier fills
        (perf.disk_tier), each byte at its read share for this phase's ubatch. The
        costs rise from segment to segment, so a minimisation fills them in order and
        the sum is exact."""
        per = self.disk_per_byte()
        tokens = self.ph.tokens / max(1, self.ph.ubatches)
        return [(size, per * read_share(p, tokens))
                for size, p in disk_tier(self.facts, self.cal.expert_odds)]
