"""The roofline performance model: prefill and decode speed, TTFT, and what limits them.

Decode of one token reads every active weight once (the routed fraction of MoE experts)
plus the KV cache so far, and does ~2 FLOPs per active parameter. On each device the
step takes max(bytes / effective bandwidth, FLOPs / compute rate); devices run one after
the other (llama.cpp splits layers into a pipeline), activations cross the links
between them, and each step pays a fixed overhead (graph setup, sampling over the
vocabulary). Prefill is the same per ubatch of tokens, where weights are read once per
ubatch and compute dominates on CPUs.

The constants of `Calibration` are measured per machine, from two sources (see
docs/plan.md, "Self-calibration"): the few-second llama.cpp probe that `hardware` runs
(`hardware/llama_speed.py`, fitted by `plan/calibration.py`: basis "modelled"), and the
runs recorded in the telemetry store, which scale the prediction per model, per
quantization family and per machine (`telemetry/calibration.py`: basis "learned").
`plan.calibration_load.machine_calibration()` gives the machine-level value without
history (this module does no I/O);
`plan.calibration_load.load_calibration(machine, facts)` adds what was learned for one
model. `Calibration.default()` holds uncalibrated placeholders and says so in `source`,
which every report prints.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass
from typing import Any

from inferenceos.plan.devices import GPU_BW_EFFICIENCY, Device, Machine
from inferenceos.plan.memory import ContextSettings, kv_bytes_per_token
from inferenceos.plan.model_facts import ModelFacts
from inferenceos.plan.placement import Placement, head_tensor, output_head
from inferenceos.telemetry.calibration import DISK_SCALE_PRIOR

GB = 1e9
LINK_LATENCY_S = 20e-6  # per activation crossing between devices (assumed)

# Our own work per decoded token, outside llama.cpp's graph (engine_token_work): what a
# `run` or `serve` stream pays and llama-bench and the llama.cpp probe do not.
# `benchmarks/simulate_accuracy.py --control-plane` measures it: one thread's CPU time
# per token of generate_one (`run`'s decode path) less that of a bare llama_decode and
# argmax loop on the same context. 2026-12-06, commit 552f02f's engine: 85 us on the
# tiny model (74-188 over three rounds of 1024 tokens, load average ~6), 80-136 us on
# Gemma beyond its argmax (noisier: its 21 ms steps vary by more).
ENGINE_TOKEN_S = 85e-6
# Per vocabulary entry, the greedy argmax over the logits row llama.cpp just wrote (the
# engine's and the probe's alike: a view of the row, numpy's argmax). In place after a
# decode: 83-109 us for Gemma's 262k entries, 72-98 for Qwen's 152k, 10-14 for the tiny
# model's 287 (the same argmax on a warm array takes 18 us for 262k: the rest is
# reading the row). The engine's figure is a field of its own (Calibration) so that
# sampling moved elsewhere (llama.cpp's sampler chain) can say so.
ARGMAX_S_PER_VOCAB = 0.33e-9
LOGITS_S_PER_VOCAB = ARGMAX_S_PER_VOCAB


@dataclass(frozen=True)
class Calibration:
    """Measured constants of the perf model for one machine.

    `cpu_bw_efficiency`: fraction of the measured RAM read bandwidth decode achieves;
    `gemv_gbps_per_thread`: weight bytes one CPU thread streams through llama.cpp's
    matrix-vector kernels per second (decode): a core's load bandwidth limits them, not
    its FLOPs — paired runs here took 3.1x longer per token for Gemma 3 270M than for
    the probe model, its bytes ratio (3.1), not its FLOPs ratio (2.8);
    `gemm_gflops_per_thread`: the matrix-matrix rate per thread (prefill);
    `thread_scaling`: exponent of prefill's speedup with threads (1 = linear);
    `decode_thread_scaling`: the same for decode's matrix-vector kernels, fitted by the
    llama.cpp probe (calibration.py): two threads here gain 1.5-1.8x, not 2x, on models
    whose bytes are far from filling the RAM's bandwidth (q8_0 Qwen2.5-Coder-1.5B: 98.6
    ms per token at one thread, 56.9 at two, 29 GB/s where q4_K streams 38 GB/s);
    `token_overhead_s`: fixed cost per decode step; `ubatch_overhead_s` per prefill ubatch;
    `layer_overhead_s`: fixed cost per layer per decode step (launching its ~20-30 small
    graph nodes): 24-layer and 6-layer models of negligible weight bytes took 14 µs more
    per token per layer here, llama and gemma3 alike, at 1 and at 2 threads. It is what
    makes a deep model of small matrices slower than its bytes say.
    `cpu_cache_bytes`: the CPU's last-level cache (the hardware profile's L3; 0:
    unknown): a decode whose weights fit in `CACHE_SHARE` of it reads them from the
    cache, not the RAM, so the RAM's bandwidth does not bound it.
    `threads_timed`: this machine's decode was timed at two thread counts (the probe's
    fit, or a stored fit from such points), so the thread response is measured, not a
    prior's: only then may the cost model overrule the free-core rule's thread count
    (plan/thread_choice.py). A stored fit saved before the field existed loads without
    it (False).
    `engine_token_s` and `logits_s_per_vocab`: our own per-token work outside
    llama.cpp's graph, which a `run` or `serve` stream pays and the llama.cpp probe does
    not (`ENGINE_TOKEN_S`, `LOGITS_S_PER_VOCAB`; see `engine_token_work`).

    What history taught (`telemetry/calibration.py`): `decode_scale` / `prefill_scale`
    multiply the roofline's speeds (1 = the roofline as is); `disk_scale` multiplies the
    disk's measured rate for weights streamed through the mapping (learned from runs
    that streamed: under a memory limit they read slower than a sequential read, and
    this VM's disk drifts 2-4x; `DISK_SCALE_PRIOR` before any such run);
    `expert_odds`, for a routed model whose picks were recorded
    (telemetry/expert_heat.py), the chance a token picks each expert, coldest first
    (what a disk tier of experts holds: the streamer keeps the hot ones); `basis` is
    "modelled" (no recorded run used) or "learned"; `runs` how many recorded runs the scales
    rest on; `confidence` in [0, 1] how much to trust the figures (see docs/plan.md).
    """

    cpu_bw_efficiency: float = 0.7
    gemv_gbps_per_thread: float = 15.0
    gemm_gflops_per_thread: float = 200.0
    thread_scaling: float = 1.0
    decode_thread_scaling: float = 1.0
    token_overhead_s: float = 0.002
    ubatch_overhead_s: float = 0.002
    layer_overhead_s: float = 14e-6
    cpu_cache_bytes: int = 0
    threads_timed: bool = False
    engine_token_s: float = ENGINE_TOKEN_S
    logits_s_per_vocab: float = LOGITS_S_PER_VOCAB
    source: str = "uncalibrated"
    decode_scale: float = 1.0
    prefill_scale: float = 1.0
    disk_scale: float = DISK_SCALE_PRIOR
    expert_odds: tuple[float, ...] = ()
    basis: str = "modelled"
    runs: int = 0
    confidence: float = 0.1

    @classmethod
    def default(cls) -> Calibration:
        return _DEFAULT

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# Not yet fitted: the development VM's shared cores gave speeds that varied 2-3x
# between runs (docs/plan.md), too noisy to fit. Reports label these as uncalibrated.
_DEFAULT = Calibration(
    source="uncalibrated defaults (measure this machine with `inferenceos hardware "
    "--refresh`; every run recorded here refines it)"
)


@dataclass(frozen=True)
class StepCost:
    """Seconds one step spends on each resource; the largest names the bottleneck."""

    parts: dict[str, float]
    overhead_s: float

    @property
    def seconds(self) -> float:
        return sum(self.parts.values()) + self.overhead_s

    @property
    def bottleneck(self) -> str:
        if not self.parts:
            return "overhead"
        name, value = max(self.parts.items(), key=lambda kv: kv[1])
        return name if value >= self.overhead_s else "per-step overhead"


# Seconds per weight byte of llama.cpp's CPU matrix-vector kernels, relative to q8_0,
# besides each output row's fixed part (GEMV_ROW_BYTES). Q4_0, Q4_K, Q5_0 and Q6_K from
# real shapes (2026-12-05): Qwen2.5-Coder-1.5B requantized to each type alone
# (llama_model_quantize, pure), llama-bench tg32 at one thread (the kernels' own rate;
# two threads approach the RAM's): q8_0 98.6 ms per token for 1640 MB of matrices, q4_0
# 44.7 for 868, q4_K 39.0 for 868, q5_0 108.5 for 1061, q6_K 51.0 for 1266; each type's
# factor is its time less the 1.5B's 797k rows at GEMV_ROW_BYTES, over its bytes, against
# q8_0's (2026-12-06; 0.86 / 0.75 / 1.70 / 0.67 without the row term). q4_0 and q4_K
# are repacked for the CPU at load (interleaved rows), q5_0 is not. F32 fitted to the
# tiny random-weight llama of benchmarks/overhead.py (all f32, 20 MB: it stays in the
# 32 MB L3 here), one thread, against Gemma 3 270M's time per token: the least thread
# CPU time of 64 tokens, 0.519 against 19.76 ms (2026-12-06, load average ~7: the
# medians, 0.678 against 20.7, would say 0.47, but the tiny model's cached weights
# suffer most from neighbours' use of the cache). The other types are from earlier
# 1-thread probes of 256-wide matrices; types not measured count as q8_0.
TYPE_COST = {
    "Q8_0": 1.0, "Q4_0": 0.75, "Q4_1": 1.6, "Q5_0": 1.72, "Q5_1": 1.49, "Q2_K": 1.8,
    "Q3_K": 2.08, "Q4_K": 0.63, "Q5_K": 1.38, "Q6_K": 0.61, "F16": 0.84, "BF16": 0.74,
    "F32": 0.34,
}


# The same for prefill's matrix-matrix kernels, per parameter (1-thread CPU time of a
# 64-token ubatch over the same one-type probes): k-quants and q4_0 have fast paths,
# q4_1 / q5_1 do not. Gemma 3 270M's q5_0 body costs ~1.07x the stand-in probe's mix.
# Q4_0, Q4_K, Q5_0 and Q6_K re-measured where prefill runs (2026-12-05): 512-token
# ubatches at 2 threads, Qwen2.5-Coder-1.5B requantized to each type alone
# (llama_model_quantize, pure), llama-bench pp512 against its Q8_0: 77.9 t/s for q8_0,
# 98.7 q4_0, 63.6 q5_0, 97.6 q4_K, 132.3 q6_K. The 64-token figures had q4_0 and q4_K
# 1.4-1.7x too fast, which put the Q4_K_M 1.5B's predicted prefill 29-31 % high.
GEMM_TYPE_COST = {
    "Q8_0": 1.0, "Q4_0": 0.79, "Q4_1": 2.11, "Q5_0": 1.22, "Q5_1": 2.34, "Q2_K": 0.73,
    "Q3_K": 0.48, "Q4_K": 0.80, "Q5_K": 0.4, "Q6_K": 0.59, "F16": 0.75, "BF16": 0.51,
    "F32": 0.75,
}
BYTES_PER_PARAM = {
    "Q8_0": 1.0625, "Q4_0": 0.5625, "Q4_1": 0.625, "Q5_0": 0.6875, "Q5_1": 0.75,
    "Q2_K": 0.328125, "Q3_K": 0.4296875, "Q4_K": 0.5625, "Q5_K": 0.6875, "Q6_K": 0.8203125,
    "F16": 2.0, "BF16": 2.0, "F32": 4.0,
}


def gemm_weight(facts: ModelFacts) -> float:
    """The parameter-weighted `GEMM_TYPE_COST` of the model's tensors (1.0: as q8_0).
    F32 tensors (norms) are left out: they take no matrix product."""
    num = den = 0.0
    for t, b in facts.spec.quant_types.items():
        name = t.upper()
        if name == "F32":
            continue
        params = b / BYTES_PER_PARAM.get(name, 1.0)
        num += params * GEMM_TYPE_COST.get(name, 1.0)
        den += params
    return num / den if den > 0 else 1.0


# A CPU matrix-matrix product costs per output element besides its multiply-adds:
# each (row, token) dot product of llama.cpp's quantized kernels has a fixed part. In
# FLOP-equivalents per output row per token, fitted with the FLOPs' rate to llama-bench
# pp64 and pp512 at one thread of eleven llama-, qwen2- and gemma3-shaped pure-q8_0
# models, n_embd 512-2048 (2026-12-05: 747-816, 5.4-5.9 ns at 138 GFLOP/s): the FLOPs
# alone were 12 % rms off, from -16 % (n_embd 512) to +18 % (2048); with it 5.5 %.
# It is why a narrow model (Gemma 3 270M, 640 wide) prefills slower per FLOP than
# the probe it was predicted from.
GEMM_ROW_FLOPS = 750.0
# Per layer, token and embedding element, what an architecture computes besides the
# products and the attention that a llama does not (gemma3: four norms where llama has
# two, q/k norms, GELU): gemma3-shaped stand-ins took 0-17 % longer than llama ones of
# the same shapes at n_embd 640, 1-5 % at 2048 (two rounds); with the row term, the fit
# gave 2436 FLOP-equivalents. Architectures not measured count as llama.
ARCH_LAYER_FLOPS_PER_EMBD = {"gemma3": 2400.0}


def prefill_row_factor(facts: ModelFacts) -> float:
    """What a CPU prefill's weight products cost per multiply-add, with
    `GEMM_ROW_FLOPS` per output row: 1 + that / (2 x the inputs per row), over the
    layers' weights as a token uses them (a routed tensor: the experts used of those it
    stacks). Per parameter, so it follows the weights to whichever device runs them."""
    s = facts.spec
    share = s.expert_used_count / s.expert_count if s.expert_count > 0 else 1.0
    rows = params = 0.0
    for t in facts.tensors:
        if t.layer < 0 or t.n_dims < 2:
            continue
        if t.n_dims > 2:  # rows per expert, elements of all of them
            rows += t.rows * max(s.expert_used_count, 1)
            params += t.n_elements * share
        else:
            rows += t.rows
            params += t.n_elements
    return 1.0 + GEMM_ROW_FLOPS * rows / (2.0 * params) if params > 0 else 1.0


def prefill_arch_work(facts: ModelFacts) -> float:
    """FLOP-equivalents per token and layer the architecture computes on a CPU besides
    products and attention (`ARCH_LAYER_FLOPS_PER_EMBD`; 0 for a llama)."""
    s = facts.spec
    return ARCH_LAYER_FLOPS_PER_EMBD.get(s.architecture, 0.0) * s.embedding_length


def gemv_weight(facts: ModelFacts) -> float:
    """What a decode's matrix-vector kernels cost per weight byte they read, against
    q8_0 streamed alone (1.0): `TYPE_COST` weighted by the bytes a decoded token reads
    (`decode_reads`: not an untied token embedding, of which it reads one row), plus
    the per-row term (`GEMV_ROW_BYTES`) spread over those bytes."""
    rows, read, typed = decode_reads(facts)
    if read <= 0:
        return 1.0
    return (typed + GEMV_ROW_BYTES * rows) / read


# A CPU matrix-vector product costs per output row besides the bytes it streams (each
# row's dot product has a fixed part: the loop set-up, the reduction, the store), in
# q8_0-byte equivalents at the kernels' calibrated rate. Pure-q8_0 requantizations of
# the probe, Gemma 3 270M and Qwen2.5-Coder-0.5B / -1.5B decoded at 10.2, 12.9, 20.9 and
# 58.2 ms per token (llama-bench, 2 threads, 2026-12-05), which 29.5 GB/s plus ~7 ns per
# output row reproduces within 3 %: 7 ns at 29.5 GB/s is 206 bytes. It is what makes a
# model of thin rows slow for its bytes: Gemma's 262k-row head and 640-wide layers
# (1.57 rows per KB read) against the 0.5B's 1.16 and the 1.5B's 0.81. One thread's
# CPU time per token of the three Q4_K_M files (2026-12-06, the least of 64 tokens:
# 19.8, 31.1, 47.1 ms) against the model fitted on Gemma: 0.5B +5 % slow, 1.5B -7 %
# fast (+16 % / +11 % with no row term and the untied embedding counted as read); row
# figures of 200-250 fitted those three best.
GEMV_ROW_BYTES = 206.0


def decode_reads(facts: ModelFacts) -> tuple[float, float, float]:
    """(output rows, weight bytes, bytes x TYPE_COST) of the matrix-vector products one
    decoded token runs: every layer matrix (a routed tensor: the experts a token uses)
    and the output head (the token embedding when tied), one row per vocabulary entry.
    Per model, so the rows per byte follow its weights to whichever device holds them
    (as `prefill_row_factor`)."""
    s = facts.spec
    share = s.expert_used_count / s.expert_count if s.expert_count > 0 else 1.0
    head = head_tensor(facts)
    rows = read = typed = 0.0
    for t in facts.tensors:
        if t is not head and (t.layer < 0 or t.n_dims < 2):
            continue
        n_bytes, n_rows = float(t.n_bytes), float(t.rows)
        if t.n_dims > 2:  # rows per expert, bytes of all of them
            n_bytes, n_rows = n_bytes * share, n_rows * max(s.expert_used_count, 1)
        rows += n_rows
        read += n_bytes
        typed += n_bytes * TYPE_COST.get(t.ggml_type.upper(), 1.0)
    return rows, read, typed


def engine_token_work(facts: ModelFacts, cal: Calibration, engine: bool = True) -> float:
    """Seconds of CPU work per decoded token outside llama.cpp's graph, in one thread
    beside it: with `engine` our own (`Calibration.engine_token_s`: the scheduler's
    step, the sampler chain's accept, output processing and detokenization, and
    `logits_s_per_vocab` per vocabulary entry: the greedy argmax over the logits row
    and what else follows the vocabulary's size), else the llama.cpp probe's (its
    argmax, `ARGMAX_S_PER_VOCAB`). A faster control plane lowers the first."""
    vocab = max(facts.spec.vocab_size, 0)
    if not engine:
        return ARGMAX_S_PER_VOCAB * vocab
    return cal.engine_token_s + cal.logits_s_per_vocab * vocab


def cpu_threads_rate(dev: Device, cal: Calibration, threads: int, gemm: bool) -> float:
    """Bytes/s (decode) or FLOP/s (prefill) of `threads` CPU threads on `dev` (0: all of
    the device's): the per-thread rate times threads ** the phase's scaling exponent."""
    n = _cpu_threads(dev, threads)
    if gemm:
        return cal.gemm_gflops_per_thread * GB * n**cal.thread_scaling
    return cal.gemv_gbps_per_thread * GB * n**cal.decode_thread_scaling


def _cpu_threads(dev: Device, threads: int) -> int:
    """The threads that compute on `dev` for a request of `threads` (0: all of its)."""
    return max(1, min(threads or dev.threads, dev.threads if dev.threads > 0 else threads))


def _device_time(
    dev: Device, bytes_read: float, flops: float, cal: Calibration, threads: int, gemm: bool,
    kernel_weight: float = 1.0,
) -> tuple[str, float]:
    """(resource name, seconds) for `bytes_read` and `flops` on `dev`. A worker's CPU
    (an RPC device) runs at the CPU rates with the worker's own threads.
    `kernel_weight`: the weights' `gemv_weight` (decode) or `gemm_weight` (prefill)."""
    if dev.computes_like_cpu:
        threads = 0 if dev.is_remote else threads
        bw = dev.bandwidth_gbps * GB * cal.cpu_bw_efficiency
        if gemm:
            rate = cpu_threads_rate(dev, cal, threads, gemm=True)
            t_comp = flops * kernel_weight / rate
        else:  # per-thread streaming of the weights (see Calibration)
            rate = cpu_threads_rate(dev, cal, threads, gemm=False)
            t_comp = bytes_read * kernel_weight / rate
        if not gemm and not dev.is_remote and bytes_read <= cal.cpu_cache_bytes * CACHE_SHARE:
            # the weights stay in the cache: the RAM binds neither their reads nor the
            # threads' scaling (the per-thread rate times the threads)
            linear = cal.gemv_gbps_per_thread * GB * _cpu_threads(dev, threads)
            return f"{dev.name} compute", bytes_read * kernel_weight / linear
    else:
        bw = dev.bandwidth_gbps * GB * GPU_BW_EFFICIENCY
        t_comp = flops / (max(dev.tflops, 1e-3) * 1e12)
    t_mem = bytes_read / bw
    if t_mem >= t_comp:
        return f"{dev.name} memory bandwidth", t_mem
    return f"{dev.name} compute", t_comp


device_time = _device_time  # the same rates for a projector's encoder (plan/projector.py)

# The share of the last-level cache a decode's weights may take and still stay there
# between tokens (the KV cache, activations, the logits row and the engine's own data
# take the rest). The tiny llama of benchmarks/overhead.py (20 MB of f32 in a 32 MB L3)
# decoded at 2,068 t/s through `run` on 2 threads, where the RAM's 36 GB/s would allow
# at most ~1,600 for its bytes; and two threads decoded it 1.93x as fast as one
# (2,215 against 1 / 0.87 ms of one thread's CPU time, 2026-12-06) where the models that
# stream from RAM gained 1.47-1.54x (Gemma, both Qwen2.5-Coder): held in the cache,
# the threads scale linearly.
CACHE_SHARE = 0.75


def decode_cost(
    facts: ModelFacts,
    placement: Placement,
    machine: Machine,
    ctx: ContextSettings,
    n_past: int,
    cal: Calibration,
    threads: int = 0,
    engine: bool = True,
) -> StepCost:
    """Cost of generating one token with `n_past` tokens already in the cache, as our
    engine decodes it (`engine`; False: as the llama.cpp probe's bare loop does, which
    is what the probe's fit compares with): `engine_token_work` is in the overhead."""
    parts: dict[str, float] = {}
    kv_tok = kv_bytes_per_token(facts, ctx) / max(facts.spec.block_count, 1)
    weight = gemv_weight(facts)
    for dev in machine.devices:
        load = placement.decode_load(dev.name)
        kv_read = kv_tok * load.layers * _kv_span(facts, ctx, n_past)
        if dev.computes_like_cpu:
            kv_read *= _cpu_kv_reads(facts)
        flops = 2.0 * load.active_params + 4.0 * load.layers * _attn_width(facts) * n_past
        if load.bytes_read + kv_read <= 0:
            continue
        # the KV cache (f16) streams at the q8_0-like rate; the weights at their types'
        k = (load.bytes_read * weight + kv_read) / (load.bytes_read + kv_read)
        name, t = _device_time(dev, load.bytes_read + kv_read, flops, cal, threads, gemm=False,
                               kernel_weight=k)
        parts[name] = parts.get(name, 0.0) + t
    _add_disk_and_links(parts, placement, machine, facts, tokens=1, n_kv=n_past + 1,
                        disk_rate=disk_rate(machine, cal), expert_odds=cal.expert_odds)
    overhead = (cal.token_overhead_s + cal.layer_overhead_s * facts.spec.block_count
                + engine_token_work(facts, cal, engine))
    return _scaled(StepCost(parts, overhead), cal.decode_scale)


def prefill_cost(
    facts: ModelFacts,
    placement: Placement,
    machine: Machine,
    ctx: ContextSettings,
    n_tokens: int,
    n_ubatch: int,
    cal: Calibration,
    threads: int = 0,
) -> StepCost:
    """Cost of evaluating a prompt of `n_tokens` in ubatches of `n_ubatch`."""
    parts: dict[str, float] = {}
    n_ub = max(1, -(-n_tokens // max(n_ubatch, 1)))
    # the output head runs for the tokens whose logits are asked for: one, the last
    # (Gemma 3 270M: 168M of its 268M parameters are the 262k-row head)
    _, head_params = output_head(facts)
    weight = gemm_weight(facts)
    rows, arch = prefill_row_factor(facts), prefill_arch_work(facts)
    for dev in machine.devices:
        load = placement.decode_load(dev.name)
        if load.bytes_read <= 0:
            continue
        head = head_params if dev.name == placement.output_device else 0
        body = max(load.active_params - head, 0.0)
        # attention: each token attends to n_tokens/2 earlier ones on average
        per_layer = 4.0 * _attn_width(facts) * n_tokens / 2
        if dev.computes_like_cpu:  # the CPU kernels' work besides the multiply-adds
            body, per_layer = body * rows, per_layer + arch
        flops = 2.0 * head + n_tokens * (2.0 * body + load.layers * per_layer)
        name, t = _device_time(dev, load.bytes_read * n_ub, flops, cal, threads, gemm=True,
                               kernel_weight=weight)
        parts[name] = parts.get(name, 0.0) + t
    _add_disk_and_links(
        parts, placement, machine, facts, tokens=n_tokens, ubatches=n_ub, n_kv=n_tokens,
        disk_rate=disk_rate(machine, cal), expert_odds=cal.expert_odds,
    )
    return _scaled(StepCost(parts, cal.ubatch_overhead_s * n_ub), cal.prefill_scale)


DISK_PART = "disk read (mmap)"


def disk_rate(machine: Machine, cal: Calibration) -> float:
    """Bytes per second weights streamed from the file are read at: the measured disk's
    rate times what runs that streamed taught (`Calibration.disk_scale`)."""
    return machine.disk_gbps * (cal.disk_scale if cal.disk_scale > 0 else 1.0) * GB


def disk_tier(facts: ModelFacts, odds: tuple[float, ...] = ()) -> list[tuple[float, float]]:
    """The disk tier in the order it fills, as (bytes, chance a token reads them)
    segments. On a dense model one segment, every byte read. With routed experts the
    streamer keeps every layer's dense part before any expert and the hottest experts
    first (engine/weights/resident_choice.py), so the tier is the coldest experts first, each
    at its heat (`odds`, coldest first: Calibration.expert_odds; unrecorded, all at
    used/experts; equal odds merged), then the dense bytes, read whole."""
    s = facts.spec
    if not s.is_moe or s.expert_count <= 0:
        return [(float("inf"), 1.0)]
    total = float(sum(layer.expert_bytes for layer in s.layers))
    odds = odds or (s.expert_used_count / s.expert_count,)
    size = total / len(odds)  # the experts of one model are alike in size
    groups: list[tuple[float, float]] = []
    for p in odds:
        if groups and groups[-1][1] == p:
            groups[-1] = (groups[-1][0] + size, p)
        else:
            groups.append((size, p))
    return [*groups, (float("inf"), 1.0)]


def read_share(p: float, tokens: float) -> float:
    """The share of a unit that a ubatch of `tokens` tokens reads, each reading it with
    chance `p`: 1 - (1 - p)^tokens (decode: p; a prompt's ubatch: nearly 1)."""
    return 1.0 - (1.0 - min(1.0, p)) ** max(1.0, tokens)


def streamed_bytes(disk_bytes: int, facts: ModelFacts, tokens: float,
                   odds: tuple[float, ...] = ()) -> float:
    """Bytes of the `disk_bytes` left in the file that a ubatch of `tokens` tokens
    reads: the disk tier (`disk_tier`) filled in order, each segment at its read share.
    On a dense model all of them; a 2-of-4 MoE's decode reads half its streamed
    experts. The picked experts are read exactly (engine/weights/prefetch.py), so this is what
    the disk delivers."""
    read, left = 0.0, float(disk_bytes)
    for size, p in disk_tier(facts, odds):
        if left <= 0:
            break
        take = min(left, size)
        read += take * read_share(p, tokens)
        left -= take
    return read


def _scaled(cost: StepCost, speed_scale: float) -> StepCost:
    """`cost` for a machine `speed_scale` times faster than the roofline says (what
    recorded runs taught about its compute and memory). The disk read keeps its time:
    it is the measured disk's, and runs that streamed are not learned from
    (plan/calibration_load.py)."""
    if speed_scale == 1.0 or speed_scale <= 0:
        return cost
    k = 1.0 / speed_scale
    return StepCost({n: v if n == DISK_PART else v * k for n, v in cost.parts.items()},
                    cost.overhead_s * k)


def _attn_width(facts: ModelFacts) -> int:
    """FLOP width of attention per cached token per layer: n_head·(d_k + d_v)/2."""
    s = facts.spec
    return max(s.head_count, 1) * (s.key_length + s.value_length) // 2


def _cpu_kv_reads(facts: ModelFacts) -> float:
    """How many times a CPU decode step goes through each cached K/V row: once per query
    head (n_head / n_head_kv with grouped-query attention). llama.cpp's CPU attention
    walks the cache per query head, not once per group, so a step's cost grows with
    depth as if the cache were that many times larger. Measured (llama-bench, 2
    threads, tg64 at depth 0 and 512): Gemma 3 270M +2.0 ms per token (4 query heads
    per KV head), Qwen2.5-Coder-0.5B +1.7 ms (7), 1.5B +3.5-5.4 ms (6): the cache's
    bytes times the ratio at the calibrated rate predict +1.5, +1.8 and +3.5 ms, the
    cache's bytes alone a seventh to a quarter of that."""
    s = facts.spec
    return max(s.head_count, 1) / max(s.head_count_kv or s.head_count, 1)


def _kv_span(facts: ModelFacts, ctx: ContextSettings, n_past: int) -> float:
    """Average cells a layer reads: SWA layers stop at their window unless swa_full keeps
    the whole cache (llama.cpp then still masks, but reads, every cell)."""
    s = facts.spec
    if not s.sliding_window or ctx.swa_full:
        return float(n_past)
    n_swa = sum(1 for layer in s.layers if layer.is_swa)
    frac = n_swa / max(s.block_count, 1)
    return (1 - frac) * n_past + frac * min(n_past, s.sliding_window)


def _add_disk_and_links(
    parts: dict[str, float],
    placement: Placement,
    machine: Machine,
    facts: ModelFacts,
    tokens: int,
    *,
    disk_rate: float,
    expert_odds: tuple[float, ...] = (),
    ubatches: int = 1,
    n_kv: int = 0,
) -> None:
    if placement.disk_bytes > 0:
        # weights that do not fit in RAM are re-read from the file for every ubatch
        per_ubatch = streamed_bytes(placement.disk_bytes, facts, tokens / max(1, ubatches),
                                    expert_odds)
        parts[DISK_PART] = per_ubatch * ubatches / disk_rate
    remote = {d.name: d for d in machine.accelerators if d.is_remote}
    crossings = _local_crossings(placement, remote)
    if crossings:
        act = facts.spec.embedding_length * 4 * tokens
        local = [d.link_gbps for d in machine.accelerators if d.link_gbps and not d.is_remote]
        link = min(local, default=12.0)
        parts["host-device link"] = crossings * (LINK_LATENCY_S * ubatches + act / (link * GB))
    for dev in remote.values():
        t = _rpc_link_time(dev, placement, facts, tokens, ubatches, n_kv)
        if t:
            parts[f"link {dev.name}"] = t


# llama.cpp's RPC client (ggml-rpc.cpp, protocol 7) per evaluation and remote split: the
# split's inputs go out without waiting (the activations, positions and KQ mask:
# SET_TENSOR), the graph runs (GRAPH_RECOMPUTE when the graph is unchanged, as in
# decode; GRAPH_COMPUTE with the serialized graph otherwise), and its output comes back
# with GET_TENSOR: one round trip, which also waits for the remote compute. Each message
# costs a little software time at both ends besides the wire.
RPC_MESSAGES_PER_SPLIT = 5
RPC_MESSAGE_S = 15e-6
RPC_GRAPH_BYTES_PER_LAYER = 12_000  # ~40 serialized tensors of ~300 B
# A worker on this very machine (`Device.co_located`) shares its cores with the client,
# and every visit hands the token from thread to thread: the client's scheduler to its
# RPC dispatcher thread (each SET_TENSOR and GET_TENSOR waits for that hand-off), to the
# worker's server thread and its OpenMP team, and back. Measured per visit on Gemma 3
# 270M, paired alternating runs against the local model on 2 shared cores (1 and 2
# threads per process, one worker or two, 2 to 16 layers on a worker): 0.8-4.5 ms,
# median 2.4 ms, independent of the layer count (docs/cluster.md). The 0.5 ms used
# before came from a tiny 6-layer model and predicted Gemma's split decode 24-51 % fast.
RPC_COLOCATED_VISIT_S = 2.4e-3


def _runs(placement: Placement) -> list[str]:
    """The devices an evaluation passes through, in order, consecutive repeats merged:
    the input layer (CPU), the layers, the output head."""
    seq = ["CPU", *placement.dense, placement.output_device]
    return [d for i, d in enumerate(seq) if i == 0 or seq[i - 1] != d]


def _local_crossings(placement: Placement, remote: dict[str, Device]) -> int:
    """Activation crossings between local devices (the RPC ones are costed apart)."""
    if not remote:
        return placement.crossings
    detours = 2 * sum(1 for i in placement.detours if placement.dense[i] not in remote)
    seq = [*placement.dense, placement.output_device]  # as `Placement.crossings` counts
    hops = sum(1 for a, b in itertools.pairwise(seq)
               if a != b and a not in remote and b not in remote)
    return hops + detours


def _rpc_link_time(
    dev: Device, placement: Placement, facts: ModelFacts, tokens: int, ubatches: int, n_kv: int
) -> float:
    """Seconds per evaluation of `tokens` spent on the network for remote device `dev`."""
    runs = sum(1 for d in _runs(placement) if d == dev.name)
    if not runs:
        return 0.0
    s = facts.spec
    act = s.embedding_length * 4 * tokens  # f32 activations, in and out
    mask = 2 * max(n_kv, 1) * tokens * (2 if s.sliding_window else 1)  # f16 KQ mask(s)
    out = act
    if placement.output_device == dev.name:
        out = s.vocab_size * 4  # the logits of the one output row, instead
    graph = 0 if tokens == 1 else RPC_GRAPH_BYTES_PER_LAYER * placement.decode_load(dev.name).layers
    wire = runs * (act + mask + out + graph) / (max(dev.link_gbps, 1e-3) * GB)
    visit = dev.rtt_s + RPC_MESSAGES_PER_SPLIT * RPC_MESSAGE_S
    if dev.co_located:
        visit += RPC_COLOCATED_VISIT_S
    return runs * ubatches * visit + wire
