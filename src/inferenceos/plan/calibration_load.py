"""Where a Calibration comes from on this machine (the I/O beside the pure planner).

- `machine_calibration()`: this machine's calibration without history: a stored fit
  (perf.json, from benchmarks/simulate_accuracy.py --calibrate, `save_calibration`),
  else the probe below, else `Calibration.default()`. (It was `Calibration.load()`,
  which made the pure cost model import this module back.)
- `probe_calibration_cached()`: the hardware profile's llama.cpp probe, fitted
  (`plan/calibration.py`); None when the profile has no probe (collected without
  measuring, or llama.cpp missing).
- `load_calibration(machine, facts, threads)`: that, corrected by the runs the telemetry
  store recorded on this kind of machine (`telemetry/calibration.py`). This is what
  `simulate` passes to the planner, and what `run` / `serve` should pass too.

Both never raise for missing or unreadable files: they fall back to less knowledge.
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import inferenceos.telemetry as telemetry
from inferenceos.atomic import read_json, write_json_atomic
from inferenceos.hardware import cpu_load
from inferenceos.hardware.cache import get_profile, load_cached, profile_path
from inferenceos.paths import data_dir
from inferenceos.plan.calibration import (
    TEACHING_SHARE,
    core_share,
    disk_ratio,
    modelled_compute_tps,
    observation,
    probe_calibration,
    quant_family,
    run_context,
    with_disk,
    with_learned,
)
from inferenceos.plan.devices import Machine, machine_from_profile_json
from inferenceos.plan.model_facts import ModelFacts, load_model_facts
from inferenceos.plan.perf import Calibration
from inferenceos.plan.policy import RecordedWorkload
from inferenceos.telemetry.calibration import fit_disk_scale, fit_learned
from inferenceos.telemetry.expert_heat import coldest_first, read_heat

log = logging.getLogger("inferenceos.plan")
MAX_RUNS = 500  # the newest recorded runs the fit reads


def stored_path() -> Path:
    """Where a fitted calibration is stored (`save_calibration`)."""
    return data_dir() / "calibration" / "perf.json"


def machine_calibration() -> Calibration:
    """This machine's calibration without history (see the module docstring)."""
    data = read_json(stored_path(), None)
    if isinstance(data, dict):
        try:
            return Calibration(**{k: data[k] for k in asdict(Calibration()) if k in data})
        except (TypeError, ValueError):
            pass
    return probe_calibration_cached() or Calibration.default()


SELF_CALIBRATED = "self-calibrated"  # marker: the first-use probe ran (or could not)
SELF_CALIBRATE_ENV = "INFERENCEOS_SELF_CALIBRATE"  # "0": never (the test suite's setting)
BUSY_PROBE_CPUS = 0.5  # a probe timed beside this many busy CPUs is redone when quiet


def self_calibrate(notice: Callable[[str], None]) -> Calibration | None:
    """On a data dir that never measured this machine (no stored fit, no profile with
    the llama.cpp probe, no earlier attempt), run the `hardware` probe once now (it is
    cached like `inferenceos hardware`'s) and say so in one line through `notice`.
    Returns the probe's calibration, or None when nothing was (or could be) done. A
    failed probe is not retried on every prediction: the marker records the attempt.
    A cached probe that ran beside busy CPUs is redone once the machine is quiet
    (`_reprobe_if_busy`)."""
    if isinstance(read_json(stored_path(), None), dict):
        return None
    if probe_calibration_cached():
        return _reprobe_if_busy(notice)
    marker = stored_path().parent / SELF_CALIBRATED
    if marker.exists() or not _self_calibration_on():
        return None
    took, _ = _probe_now("first-use calibration")
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(f"{time.time():.0f}\n")
    cal = probe_calibration_cached()
    if cal is not None:
        notice(f"calibrated this machine in {took:.1f} s for predictions (first use: the "
               "`inferenceos hardware` probe, now cached)")
    else:
        notice(f"could not calibrate this machine ({took:.1f} s): predictions use "
               "uncalibrated defaults")
    return cal


def _reprobe_if_busy(notice: Callable[[str], None]) -> Calibration | None:
    """The cached probe was timed while other processes kept BUSY_PROBE_CPUS or more
    busy (a first use during a build): it measured the contention, and every prediction
    from it is low for the quiet machine (Qwen 0.5B: -20 % decode, -28 % prefill, seen).
    Redo it once the machine is quiet (its new record says how busy it was then);
    while it is still busy, keep the one there is. Returns the new calibration, or None."""
    profile = load_cached()
    speed = profile.llama_speed if profile is not None else None
    if speed is None or speed.busy_others < BUSY_PROBE_CPUS or not _self_calibration_on():
        return None
    if cpu_load.sample_cpu_load().busy_others >= BUSY_PROBE_CPUS / 2:
        return None
    took, ok = _probe_now("re-calibration")
    if not ok:
        return None
    notice(f"re-calibrated this machine in {took:.1f} s: its probe had "
           f"run beside {speed.busy_others:.1f} busy CPUs")
    return probe_calibration_cached()


def _self_calibration_on() -> bool:
    """Whether predictions may run the probe themselves (SELF_CALIBRATE_ENV)."""
    value = os.environ.get(SELF_CALIBRATE_ENV, "1").strip().lower()
    return value not in ("0", "false", "off", "no")


def _probe_now(what: str) -> tuple[float, bool]:
    """Run the `hardware` probe now (cached like `inferenceos hardware`'s): (seconds it
    took, whether it succeeded). A failure is one warning naming `what`: a prediction
    never fails for want of a calibration."""
    t = time.monotonic()
    try:
        get_profile(refresh=True)
    except Exception as exc:
        log.warning("%s failed: %s", what, exc)
        return time.monotonic() - t, False
    return time.monotonic() - t, True


def save_calibration(cal: Calibration) -> None:
    """Store `cal` as this machine's fitted calibration."""
    write_json_atomic(stored_path(), asdict(cal))


def probe_calibration_cached() -> Calibration | None:
    """The probe's calibration from the cached hardware profile, or None."""
    p = profile_path()
    try:
        st = p.stat()
    except OSError:
        return None
    return _probe_cached(str(p), st.st_mtime_ns)


@lru_cache(maxsize=4)
def _probe_cached(path: str, mtime_ns: int) -> Calibration | None:
    profile = load_cached()
    if profile is None or profile.llama_speed is None:
        return None
    speed = profile.llama_speed
    try:
        facts = load_model_facts(speed.model_path)
        machine = machine_from_profile_json(profile.to_json())
        return probe_calibration(speed, facts, machine,
                                 cache_bytes=profile.cpu.cache_bytes.get("l3", 0))
    except Exception as exc:  # a stale probe costs the calibration only
        log.debug("probe calibration unavailable: %s", exc)
        return None


@lru_cache(maxsize=16)
def _facts(path: str, mtime_ns: int) -> ModelFacts:
    return load_model_facts(path)


def _facts_of(path: str | None) -> ModelFacts | None:
    if not path:
        return None
    try:
        return _facts(path, Path(path).stat().st_mtime_ns)
    except Exception:  # a moved or broken file: its runs are skipped
        return None


def load_calibration(
    machine: Machine, facts: ModelFacts, threads: int = 0, base: Calibration | None = None
) -> Calibration:
    """`base` (default `machine_calibration()`) corrected by recorded runs for `facts`:
    the speed scales from runs that held their weights in memory, the disk's streaming
    rate from runs that streamed them."""
    base = base or machine_calibration()
    rows = [r for r in telemetry.generations(machine="kind", limit=MAX_RUNS) if r.concurrency == 1]
    if not rows and not facts.spec.is_moe:
        return base
    try:
        target = telemetry.model_info(facts.spec.path).digest
    except Exception:  # an unreadable target: nothing model-specific
        target = ""
    if not rows:  # a routed model's heat is recorded by any streamed load
        return replace(base, expert_odds=_expert_odds(facts, target))
    find = _model_finder(rows, facts, target)
    held = _weights_held(machine)
    memo: dict[tuple[Any, ...], tuple[float, float]] = {}  # recorded runs repeat settings
    obs = [o for r in rows if not _streamed(r.settings)
           for o in [_held_observation(r, find(r), held, base, machine, memo)]
           if o is not None]
    cal = with_learned(base, fit_learned(obs, target, quant_family(facts), threads))
    seen: dict[Any, Any] = {}  # per model: its learned calibration; per setting: compute
    odds = _expert_odds(facts, target)
    ratios = [x for r in rows if _streamed(r.settings)
              for x in [_disk_ratio(r, find(r), held, base, obs, machine, seen,
                                    odds if r.model_digest == target else ())]
              if x is not None]
    return replace(with_disk(cal, *fit_disk_scale(ratios)), expert_odds=odds)


def _expert_odds(facts: ModelFacts, digest: str) -> tuple[float, ...]:
    """A routed model's recorded expert heat, coldest first (perf.streamed_bytes), or ()
    when it is dense or none was recorded."""
    s = facts.spec
    if not s.is_moe or not digest:
        return ()
    heat = read_heat(digest)
    if heat is None:
        return ()
    layers = [layer.index for layer in s.layers if layer.expert_bytes]
    return coldest_first(heat, layers, s.expert_count, s.expert_used_count / s.expert_count)


def _model_finder(rows: list[Any], facts: ModelFacts,
                  target: str) -> Callable[[Any], ModelFacts | None]:
    """A recorded run -> its model's facts (the target's own, else re-read from the path
    the run or its load recorded; None when the file is gone)."""
    paths: dict[str, str] = {}
    if any(r.model_digest != target for r in rows):
        for ld in telemetry.loads(machine="kind", limit=MAX_RUNS):
            model_path = ld.plan.get("model") if isinstance(ld.plan, dict) else None
            if isinstance(model_path, str):
                paths.setdefault(ld.model_digest, model_path)

    def find(r: Any) -> ModelFacts | None:
        if r.model_digest == target:
            return facts
        hint = r.extra.get("model_path") if isinstance(r.extra, dict) else None
        return _facts_of(hint if isinstance(hint, str) else paths.get(r.model_digest))

    return find


def _held_observation(r: Any, f: ModelFacts | None, held: Machine, base: Calibration,
                      machine: Machine, memo: dict[tuple[Any, ...], tuple[float, float]]
                      ) -> Any:
    """A run that held its weights as measured / modelled ratios, as if the machine had
    been quiet (plan.calibration.core_share); None when it cannot teach (its model is
    gone, or it had less than `TEACHING_SHARE` of its threads' cores)."""
    if f is None:
        return None
    drafted = isinstance(r.extra, dict) and bool(r.extra.get("draft"))
    o = observation(
        f, _run_machine(held, r), base,
        model=r.model_digest,
        ctx=run_context(r.n_ctx, r.n_ubatch, r.n_batch, r.settings),
        threads=r.threads or machine.cpu.threads,
        prompt_tokens=r.prompt_tokens, output_tokens=r.output_tokens,
        cached_tokens=r.cached_tokens,
        prefill_tps=r.prefill_tps, memo=memo,
        # a drafted run's decode is not the model's plain speed (plan/speculative.py)
        decode_tps=None if drafted else r.decode_tps,
    )
    if o is None:
        return None
    contention = _contention(r)
    share = core_share(contention, r.threads or machine.cpu.threads)
    if share >= 1.0:
        return o
    if share < TEACHING_SHARE:
        return None
    return replace(
        o, decode_ratio=None if o.decode_ratio is None else o.decode_ratio / share,
        prefill_ratio=None if o.prefill_ratio is None else o.prefill_ratio / share,
    )


def _disk_ratio(r: Any, f: ModelFacts | None, held: Machine, base: Calibration,
                obs: list[Any], machine: Machine, seen: dict[Any, Any],
                odds: tuple[float, ...] = ()) -> float | None:
    """A run that streamed: its streaming rate against the measured disk's
    (plan.calibration.disk_ratio), its compute priced by what its model's runs taught
    (`seen` keeps each model's fit and each setting's modelled compute: recorded runs
    repeat them). CPU-only runs only."""
    if f is None or int(r.settings.get("n_gpu_layers") or 0) != 0:
        return None
    threads = r.threads or machine.cpu.threads
    if r.model_digest not in seen:
        seen[r.model_digest] = with_learned(
            base, fit_learned(obs, r.model_digest, quant_family(f), r.threads or 0))
    ctx = run_context(r.n_ctx, r.n_ubatch, r.n_batch, r.settings)
    key = (r.model_digest, ctx, threads, r.output_tokens)
    if key not in seen:
        seen[key] = modelled_compute_tps(f, _run_machine(held, r), seen[r.model_digest], ctx,
                                         threads, r.output_tokens)
    return disk_ratio(
        f, held, compute_tps=seen[key],
        resident_bytes=int(r.settings.get("stream_resident_bytes") or 0),
        output_tokens=r.output_tokens, decode_tps=r.decode_tps, expert_odds=odds,
    )


def _run_machine(held: Machine, r: Any) -> Machine:
    """`held` with as many CPU threads as the recorded run `r` computed with: its
    `threads`, at most the CPUs it could use (its contention sample's `usable_cpus`,
    else this machine's CPU count; threads past the cores add no compute).
    Why: `simulate --threads 1` restricts the machine to one thread, and a run recorded
    at two, modelled on it, was priced as a one-thread run; the tiny llama's 2-thread
    runs (1,800-2,000 t/s) then taught a 1.51x scale and one thread was predicted at
    1,760 t/s, where it decodes at ~1,000."""
    contention = _contention(r)
    usable = contention.get("usable_cpus") if isinstance(contention, dict) else None
    cpus = usable if isinstance(usable, int) and usable > 0 else (os.cpu_count() or 1)
    threads = min(r.threads or 0, cpus)
    if threads <= held.cpu.threads:
        return held
    cpu = replace(held.cpu, threads=threads)
    return replace(held, devices=(cpu, *held.accelerators))


def _contention(r: Any) -> Any:
    """What a recorded run's sample said the other processes took (None: not sampled)."""
    return r.extra.get("contention") if isinstance(r.extra, dict) else None


def _streamed(settings: Any) -> bool:
    """Whether a recorded run's plan was disk-bound (it streamed weights from the file)."""
    return isinstance(settings, dict) and bool(settings.get("stream_resident_bytes"))


def _weights_held(machine: Machine) -> Machine:
    """`machine` with room for any model's weights in RAM: the machine a recorded run
    that did not stream had. Modelled under today's memory limit instead, an unlimited
    run of Qwen 1.5B (16 t/s) looked 11.7x faster than the disk-bound roofline, and
    that scale then predicted 16 t/s under a 533 MiB cgroup where 0.7 was measured."""
    cpu = replace(machine.cpu, memory_bytes=max(machine.cpu.memory_bytes, 1 << 50))
    return replace(machine, devices=(cpu, *machine.accelerators))


def recorded_workload(facts: ModelFacts) -> RecordedWorkload:
    """This model's recorded requests on this kind of machine (for `adaptive`)."""
    try:
        rows = telemetry.generations(model=facts.spec.path, machine="kind", limit=MAX_RUNS)
    except Exception:  # no history is a valid answer
        rows = []
    if not rows:
        return RecordedWorkload()
    conc = sorted(r.concurrency for r in rows)
    return RecordedWorkload(
        runs=len(rows),
        concurrency_p90=float(conc[min(len(conc) - 1, int(0.9 * len(conc)))]),
        prompt_p50=float(statistics.median(r.prompt_tokens for r in rows)),
    )
