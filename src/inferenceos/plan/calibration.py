"""Calibrating the roofline: from the hardware probe, and from recorded runs (pure).

- `probe_calibration(speed, probe_facts, machine)`: the perf constants that make the
  roofline reproduce what llama.cpp measured on the probe model at `hardware` time
  (`hardware/llama_speed.py`). Decode: the RAM bandwidth efficiency and the
  per-thread matrix-vector streaming rate are scaled together until the modelled time
  per token matches; prefill: the matrix-matrix rate. The per-step and per-layer
  overheads keep their priors (measured, see `perf.Calibration`): one probe cannot tell
  a fixed cost from a bandwidth (docs/plan.md, "Self-calibration").
- `observation(...)`: one recorded run turned into measured / modelled ratios, for the
  fit in `telemetry/calibration.py`.
- `with_learned(cal, learned)`: a Calibration carrying what was learned.
- `quant_family(facts)`: the key under which what one model taught transfers to others.

No I/O here: `plan/calibration_load.py` reads the profile and the store.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from typing import Any

from inferenceos.hardware.profile import LlamaSpeed
from inferenceos.plan.devices import Machine
from inferenceos.plan.memory import ContextSettings
from inferenceos.plan.model_facts import ModelFacts
from inferenceos.plan.perf import GB, Calibration, decode_cost, prefill_cost, streamed_bytes
from inferenceos.plan.placement import place
from inferenceos.telemetry.calibration import (
    MIN_DECODE_TOKENS,
    MIN_PREFILL_TOKENS,
    Learned,
    Observation,
)

# Priors for what the probe cannot separate; see docs/plan.md "Self-calibration".
# The decode kernels' thread scaling before a probe has timed two thread counts: the
# exponent fitted where it did (2026-12-06, this project's 2-core host, Gemma's quiet
# probe: 22.1 ms a token at one thread, 14.7 at two, 2 ** 0.59). A probe timed beside
# other work runs at the free cores only (one here); linear scaling then promised a
# second thread 2x, and a fresh data dir's first prediction for two threads was Gemma
# 90 t/s where the quiet machine decodes ~66.
PRIOR_DECODE_THREAD_SCALING = 0.6
PRIOR = Calibration(token_overhead_s=10e-6, ubatch_overhead_s=0.001,  # measured: see perf
                    decode_thread_scaling=PRIOR_DECODE_THREAD_SCALING)
FAMILY_SHARE = 0.05  # a tensor type carrying ≥ 5 % of the weight bytes is in the family


def quant_family(facts_or_types: ModelFacts | dict[str, int]) -> str:
    """The ggml types carrying most of the weights, e.g. "q4_k+q5_0+q6_k+q8_0".

    Two models with the same family run the same kernels over the same bytes per
    weight, so their measured/modelled ratios agree: what one taught transfers.
    """
    types = (
        facts_or_types.spec.quant_types
        if isinstance(facts_or_types, ModelFacts)
        else facts_or_types
    )
    total = sum(types.values()) or 1
    keep = sorted(t.lower() for t, b in types.items() if b >= FAMILY_SHARE * total)
    return "+".join(keep) or "unknown"


def _cpu_only(machine: Machine, threads: int) -> Machine:
    cpu = replace(machine.cpu, threads=max(threads, 1))
    return replace(machine, devices=(cpu,))


def _solve(f: Any, target: float) -> float:
    """k in [1e-3, 1e3] with f(k) ≈ target, for f decreasing in k (bisection on log k)."""
    lo, hi = math.log(1e-3), math.log(1e3)
    for _ in range(60):
        mid = (lo + hi) / 2
        if f(math.exp(mid)) > target:
            lo = mid
        else:
            hi = mid
    return math.exp((lo + hi) / 2)


UNBOUNDED_BW = 1e3  # a RAM efficiency that makes memory never the limit (in a fit)
# The share of the measured RAM read bandwidth that decode reaches when the weights'
# bytes, not the kernels, hold it back. This 2-vCPU VM's two-thread bandwidth test reads
# in two states that last seconds (2026-12-05): ~37 GB/s, each thread at ~19, and
# ~60-69, each at ~33 (calls a second apart: 38.8, 48.4, 36.6, 35.9, 37.9, 66.0, 60.7,
# 60.0). Qwen2.5-Coder-1.5B Q4_K_M decoded at 27.6-30.6 t/s both days (~31-34 GB/s;
# its q4_K-only requantization 37.7 GB/s on a day the test read 61.4), so llama.cpp's
# two threads were held back by their kernels, not by the state the test saw. At 0.6
# the first-use decode predictions followed the test: 1.5B +4 % when it read 62, −20 %
# when it read 37. At 0.9 memory binds only when the test reads the slow state, and
# then near what the model streamed (1.5B: +0.7 % and −6.3 % at first use). A probe of
# ~220 MB on a few threads never gets near, so the fit takes it as known: at least, for
# memory is never slower than the probe itself streamed (its bytes per token over its
# time).
RAM_EFFICIENCY = 0.9


def _bisect(f: Any, lo: float, hi: float, target: float) -> float:
    """x in [lo, hi] with f(x) ≈ target, for f decreasing in x (clamped at the ends)."""
    if f(lo) <= target:
        return lo
    if f(hi) >= target:
        return hi
    for _ in range(50):
        mid = (lo + hi) / 2
        if f(mid) > target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _fit_two_points(
    prior: Calibration, facts: ModelFacts, machine: Machine, ctx: ContextSettings,
    n_past: int, threads: int, t_n: float, t_1: float, streamed_gbps: float = 0.0,
) -> Calibration:
    """Decode measured at `threads` (`t_n` s per token) and at one thread (`t_1`):

    - one thread is taken as the kernels' own rate (memory unbounded): it sets
      `gemv_gbps_per_thread`;
    - with memory at `RAM_EFFICIENCY` of the measured bandwidth (or at what the probe
      streamed, `streamed_gbps`, when that is more), `threads` threads
      speed the kernels up by threads ** `decode_thread_scaling`, the exponent that
      makes the roofline's `threads`-thread time `t_n`;
    - when even linear scaling at that memory rate is slower than `t_n`, memory is
      faster than assumed: scaling stays linear and the RAM efficiency is what makes
      the time `t_n`, at most 1 (the measured bandwidth).

    Why: a few threads do not scale linearly long before the RAM's bandwidth is the
    limit. Here the ~220 MB probe gained 1.4-1.5x from a second thread and q8_0 Qwen
    1.5B 1.73x, while q4_K streams 38 GB/s at two threads. The fit before this one put
    the whole shortfall on memory (~23 GB/s), and so predicted every model whose bytes
    fill the bandwidth 30-40 % too slow (Qwen2.5-Coder-1.5B's first-use decode)."""
    m1, mn = _cpu_only(machine, 1), _cpu_only(machine, threads)
    pl1, pln = place(facts, m1, ctx, {}), place(facts, mn, ctx, {})
    free = replace(prior, cpu_bw_efficiency=UNBOUNDED_BW)

    def one(k: float) -> float:
        c = replace(free, gemv_gbps_per_thread=prior.gemv_gbps_per_thread * k)
        return decode_cost(facts, pl1, m1, ctx, n_past, c, 1, engine=False).seconds

    gemv = prior.gemv_gbps_per_thread * _solve(one, t_1)
    bw = mn.cpu.bandwidth_gbps
    floor = min(max(RAM_EFFICIENCY, streamed_gbps / bw if bw > 0 else 0.0), 1.0)
    fitted = replace(prior, gemv_gbps_per_thread=gemv, cpu_bw_efficiency=floor)

    def many(scaling: float, eff: float = floor) -> float:
        c = replace(fitted, decode_thread_scaling=scaling, cpu_bw_efficiency=eff)
        return decode_cost(facts, pln, mn, ctx, n_past, c, threads, engine=False).seconds

    if many(1.0) > t_n:  # memory is faster than the prior says (but not than measured)
        eff = min(_solve(lambda e: many(1.0, e), t_n), 1.0)
        return replace(fitted, decode_thread_scaling=1.0, cpu_bw_efficiency=eff)
    return replace(fitted, decode_thread_scaling=_bisect(many, 0.0, 1.0, t_n))


# How much slower a real model decodes than the llama-shaped stand-in of the same shapes
# and tensor types (hardware/llama_speed.py writes it when the built-in model is not
# there yet), at one thread and at two: llama-bench tg32 here, pure q8_0 stand-ins of
# Gemma 3 270M's, Qwen2.5-Coder-0.5B's and -1.5B's shapes against those models
# requantized to q8_0, three interleaved rounds (2026-12-05): 1.20-1.37, 1.16-1.37 and
# 1.51-1.58 at one thread; 1.12-1.24, 1.06-1.20 and 1.30-1.42 at two. Prefill showed no
# such gap (Qwen 0.5B's shape: 269 against 265 t/s at pp512). The cause is not known:
# random instead of zero weights, the mapping and the context length in the header
# changed nothing. Without it the stand-in's first-use decode predictions ran 17-35 %
# fast.
STAND_IN_DECODE_SLOWER = (1.3, 1.2)  # (one thread, more threads)


def probe_calibration(
    speed: LlamaSpeed, facts: ModelFacts, machine: Machine, prior: Calibration = PRIOR,
    cache_bytes: int = 0,
) -> Calibration:
    """The Calibration under which the roofline reproduces the probe's measurement (for
    the synthetic stand-in: what a real model of its shapes would measure, see
    `STAND_IN_DECODE_SLOWER`), with the CPU's last-level cache of `cache_bytes`
    (`Calibration.cpu_cache_bytes`; the probe models are far larger)."""
    m = _cpu_only(machine, speed.threads)
    ctx = ContextSettings(
        n_ctx=speed.n_ctx, n_batch=speed.n_ubatch, n_ubatch=speed.n_ubatch,
        flash_attn=speed.flash_attn,
    )
    pl = place(facts, m, ctx, {})
    n_past = speed.prompt_tokens + speed.decode_tokens // 2
    one, many = STAND_IN_DECODE_SLOWER if speed.probe == "synthetic" else (1.0, 1.0)
    t_dec = speed.decode_s / max(speed.decode_tokens, 1) * (many if speed.threads > 1 else one)
    t_pre = speed.prefill_s
    cal = prior
    fixed = prior.token_overhead_s + prior.layer_overhead_s * facts.spec.block_count
    t_dec1 = (speed.decode_s_1thread or 0) / max(speed.decode_tokens, 1) * one
    if t_dec > fixed and t_dec1 > fixed and speed.threads > 1:
        streamed = pl.decode_load(m.cpu.name).bytes_read / (t_dec / many) / GB
        cal = replace(_fit_two_points(prior, facts, machine, ctx, n_past, speed.threads,
                                      t_dec, t_dec1, streamed), threads_timed=True)
    elif t_dec > fixed:

        def dec(k: float) -> float:
            c = replace(
                prior,
                cpu_bw_efficiency=prior.cpu_bw_efficiency * k,
                gemv_gbps_per_thread=prior.gemv_gbps_per_thread * k,
            )
            return decode_cost(facts, pl, m, ctx, n_past, c, speed.threads,
                               engine=False).seconds

        k = _solve(dec, t_dec)
        cal = replace(
            cal,
            cpu_bw_efficiency=prior.cpu_bw_efficiency * k,
            gemv_gbps_per_thread=prior.gemv_gbps_per_thread * k,
        )
    if t_pre > prior.ubatch_overhead_s:

        def pre(k: float) -> float:
            c = replace(cal, gemm_gflops_per_thread=prior.gemm_gflops_per_thread * k)
            n = speed.prompt_tokens
            return prefill_cost(facts, pl, m, ctx, n, speed.n_ubatch, c, speed.threads).seconds

        k = _solve(pre, t_pre)
        cal = replace(cal, gemm_gflops_per_thread=prior.gemm_gflops_per_thread * k)
    return replace(
        cal,
        source=(
            f"llama.cpp probe at hardware time ({speed.threads} threads: "
            f"{speed.decode_tps:.0f} t/s decode, {speed.prefill_tps:.0f} t/s prefill "
            f"of the {speed.probe} probe model)"
        ),
        basis="modelled",
        runs=0,
        confidence=0.5,
        cpu_cache_bytes=max(int(cache_bytes), 0),
    )


def modelled_speeds(
    facts: ModelFacts,
    machine: Machine,
    cal: Calibration,
    ctx: ContextSettings,
    threads: int,
    prompt_tokens: int,
    output_tokens: int,
) -> tuple[float, float]:
    """(prefill t/s, decode t/s) the roofline predicts, as `simulate` computes them."""
    from inferenceos.plan.preflight import Leeway, make_plan

    plan = make_plan(facts, machine, ctx, threads=threads, leeway=Leeway(pinned_ctx=True))
    pl, c, th = plan.placement, plan.ctx, plan.threads
    pre = prefill_cost(facts, pl, machine, c, max(prompt_tokens, 1), c.n_ubatch, cal, th)
    dec = decode_cost(facts, pl, machine, c, prompt_tokens + output_tokens // 2, cal, th)
    return max(prompt_tokens, 1) / pre.seconds, 1.0 / dec.seconds


def run_context(
    n_ctx: int | None, n_ubatch: int | None, n_batch: int | None, settings: dict[str, Any]
) -> ContextSettings:
    """The ContextSettings a recorded run used (what its settings say; defaults else)."""

    def kv(name: str) -> str:
        v = settings.get(name)
        return v if isinstance(v, str) and v in ("f16", "q8_0", "q4_0", "f32", "bf16") else "f16"

    fa = settings.get("flash_attn", settings.get("flash_attn_type", True))
    ub = n_ubatch or 512
    return ContextSettings(
        n_ctx=n_ctx or 4096,
        n_batch=max(n_batch or 512, ub),
        n_ubatch=ub,
        type_k=kv("type_k"),
        type_v=kv("type_v"),
        flash_attn=bool(fa) if not isinstance(fa, int) else fa != 0,
    )


def observation(
    facts: ModelFacts,
    machine: Machine,
    cal: Calibration,
    *,
    model: str,
    ctx: ContextSettings,
    threads: int,
    prompt_tokens: int,
    output_tokens: int,
    cached_tokens: int,
    prefill_tps: float | None,
    decode_tps: float | None,
    memo: dict[tuple[Any, ...], tuple[float, float]] | None = None,
) -> Observation | None:
    """A recorded single-stream run as measured / modelled ratios (None: unusable).
    `memo` keeps modelled speeds across calls (recorded runs repeat their settings)."""
    fresh = prompt_tokens - cached_tokens
    use_pre = bool(prefill_tps) and fresh >= MIN_PREFILL_TOKENS
    use_dec = bool(decode_tps) and output_tokens >= MIN_DECODE_TOKENS
    if not (use_pre or use_dec):
        return None
    base = replace(cal, decode_scale=1.0, prefill_scale=1.0)
    key = (model, ctx, threads, fresh, output_tokens)
    if memo is not None and key in memo:
        p_tps, d_tps = memo[key]
    else:
        try:
            p_tps, d_tps = modelled_speeds(
                facts, machine, base, ctx, threads, max(fresh, 1), output_tokens
            )
        except Exception:  # a run the planner cannot model teaches nothing
            return None
        if memo is not None:
            memo[key] = (p_tps, d_tps)
    return Observation(
        model=model,
        family=quant_family(facts),
        threads=threads,
        decode_ratio=(decode_tps or 0) / d_tps if use_dec and d_tps > 0 else None,
        prefill_ratio=(prefill_tps or 0) / p_tps if use_pre and p_tps > 0 else None,
    )


def modelled_compute_tps(facts: ModelFacts, held: Machine, cal: Calibration,
                         ctx: ContextSettings, threads: int, output_tokens: int) -> float | None:
    """The decode speed the roofline (`cal`) gives a model whose weights `held` holds
    (None when the planner cannot model the run)."""
    try:
        return modelled_speeds(facts, held, cal, ctx, threads, 1, output_tokens)[1]
    except Exception:  # a run the planner cannot model teaches nothing
        return None


def disk_ratio(
    facts: ModelFacts,
    held: Machine,
    *,
    compute_tps: float | None,
    resident_bytes: int,
    output_tokens: int,
    decode_tps: float | None,
    expert_odds: tuple[float, ...] = (),
) -> float | None:
    """A recorded run that streamed, as the rate it read its weights at against the
    disk's measured one (`held.disk_gbps`), or None when it cannot tell: a decode step's
    time less its compute's (`compute_tps`, `modelled_compute_tps` on a machine that
    holds the weights) is the time it read the plan's disk tier in: every CPU weight
    byte the page cache did not keep (`resident_bytes`, the run's page-cache tier),
    of which a token reads the experts it picks (perf.streamed_bytes: what simulate
    charges, so the rate learned is the one it applies).
    Only CPU-only runs: with layers on a device the disk tier is not known here."""
    disk = streamed_bytes(facts.spec.tensor_bytes - resident_bytes, facts, 1, expert_odds)
    if not decode_tps or not compute_tps or output_tokens < MIN_DECODE_TOKENS or disk <= 0:
        return None
    reading = 1.0 / decode_tps - 1.0 / compute_tps
    if reading <= 0.1 / decode_tps:  # compute-bound after all: the rate is not seen
        return None
    return disk / reading / (held.disk_gbps * 1e9)


def with_disk(cal: Calibration, scale: float, runs: int) -> Calibration:
    """`cal` with a learned disk streaming rate (unchanged when `runs` is 0)."""
    if runs == 0:
        return cal
    return replace(cal, disk_scale=scale, source=f"{cal.source}; disk streaming rate "
                   f"{scale:.2f}x the measured disk's, from {runs} run"
                   f"{'s' * (runs != 1)} that streamed")


def with_learned(cal: Calibration, learned: Learned | None) -> Calibration:
    """`cal` carrying `learned`'s scales (unchanged when nothing was learned)."""
    if learned is None or learned.runs == 0:
        return cal
    return replace(
        cal,
        decode_scale=learned.decode_scale,
        prefill_scale=learned.prefill_scale,
        basis="learned",
        runs=learned.runs,
        confidence=learned.confidence,
        source=f"{learned.describe()}, over {cal.source}",
    )


MIN_FREE_CORES = 0.25  # a run never counts as having had less than a quarter core
# llama.cpp's threads meet at a barrier after every operation, so a thread sharing its
# core holds all of them back, by far more than the cores lost. Gemma 3 270M at two
# threads on this 2-core host beside a process that burned a duty cycle of a core
# (2026-12-05, two rounds, medians of three runs; quiet: 75 t/s decode, 670 prefill):
#   core share   0.86   0.75   0.60   0.50
#   decode       0.85   0.49   0.34   0.20   of the quiet speed
#   prefill      0.81   0.61   0.57   0.41
# Between the measured points the speed is interpolated (straight lines on logs), from
# (1.0, 1.0) to the first; below the last, the power fits of the table (share ** 1.3,
# share ** 2.2, least squares on logs) carry it on. Why not the fits alone: at a small
# loss they are far off (0.86 ** 2.2 = 0.72 where 0.85 was measured), and a core share of
# 0.95 (0.1 of 2 CPUs busy: one clock tick of the sensor's 0.1 s window) cost 11 % in the
# thread choice, enough to pick 1 thread for the tiny llama, which then decoded at
# ~1,000 t/s against ~1,850 at 2. A small model has the most barriers per second, so a
# larger one loses less. Below `TEACHING_SHARE` a run cannot tell the quiet machine's
# speed, and the fit leaves it out (divided by its share, a share-0.5 run predicted the
# quiet machine 40 % slow); above, the loss is near the share, which corrects it.
TEACHING_SHARE = 0.9
# (core share, prefill, decode), of the quiet speed, as measured (above)
CONTENDED = ((1.0, 1.0, 1.0), (0.86, 0.81, 0.85), (0.75, 0.61, 0.49), (0.60, 0.57, 0.34),
             (0.50, 0.41, 0.20))
CONTENDED_EXPONENT = (1.3, 2.2)  # (prefill, decode) below the last measured share


def contended_speed(share: float) -> tuple[float, float]:
    """(prefill, decode) speed beside other processes as fractions of the quiet speed,
    for a run that gets `share` of its threads' cores (`core_share`), as measured
    (`CONTENDED`). 1.0 when nothing is taken; never more for a smaller share."""
    s = min(max(share, MIN_FREE_CORES), 1.0)
    for (hi, p_hi, d_hi), (lo, p_lo, d_lo) in itertools.pairwise(CONTENDED):
        if s >= lo:
            f = math.log(s / hi) / math.log(lo / hi)  # 0 at `hi`, 1 at `lo`
            return p_hi * (p_lo / p_hi) ** f, d_hi * (d_lo / d_hi) ** f
    last, p_last, d_last = CONTENDED[-1]
    return (p_last * (s / last) ** CONTENDED_EXPONENT[0],
            d_last * (s / last) ** CONTENDED_EXPONENT[1])


def core_share(contention: Any, threads: int) -> float:
    """The share of its `threads` threads' CPU time a run could get beside what other
    processes took (`contention`: the recorder's {"busy_others", "steal",
    "usable_cpus"}, or a `hardware.cpu_load.CpuLoad`): free cores / threads, at most 1.
    1.0 when nothing is known. The assumption: llama.cpp's threads slow down in
    proportion to the cores they lose (decode here was compute-bound per thread: 14.4
    of 30 GB/s at 2 threads), so a run's measured speed / share is the quiet speed;
    it holds for a small loss only (`TEACHING_SHARE`; a larger one: `contended_speed`)."""
    if contention is None:
        return 1.0
    if isinstance(contention, dict):
        if contention.get("sampled") is False:
            return 1.0
        busy = float(contention.get("busy_others") or 0.0)
        steal = float(contention.get("steal") or 0.0)
        usable = int(contention.get("usable_cpus") or 0)
    else:
        if not getattr(contention, "sampled", False):
            return 1.0
        busy = float(contention.busy_others)
        steal = float(contention.steal_fraction)
        usable = int(contention.usable_cpus)
    if usable <= 0 or threads <= 0:
        return 1.0
    free = max(usable * (1.0 - min(max(steal, 0.0), 0.9)) - busy, MIN_FREE_CORES)
    return min(1.0, free / threads)

