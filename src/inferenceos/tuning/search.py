"""The budgeted search behind `inferenceos optimize`.

1. *Baseline*: llama.cpp's defaults (`space.llama_defaults`), measured first.
2. *Coordinate search*: for each dimension of `space.search_space` (placement, threads,
   flash attention, batch shape, KV types) every value is tried with the others held at
   the current best, the current value first (so the sweep's reference is measured
   moments before its rivals; when the trial just before was of the current best, it is
   the reference). Hopeless trials stop early (`stopping`). Threads are separable:
   decode and prompt batches each get the count that was fastest for them.
3. *Duel*: a sweep's winner replaces the current best only after paired rounds against
   it (`stopping.adopt`), unless its win was decisive (`stopping.decisive`).
4. *Confirmation*: the best and the baseline alternate for up to `rounds` paired rounds
   (at least one; more while the budget lasts); the reported figures are their medians
   and the ratios the medians of per-round ratios.
   A best that does not beat the baseline there (`stopping.confirmed`: no phase below
   1.0x, a score gain of at least 1 %) is dropped: the defaults are kept and stored.
   When the budget pays for the baseline alone, nothing was compared (`compared` is 0)
   and `optimize` stores nothing.

The budget covers all of it. What a trial of given settings costs is known from its
last trial (`TrialResult.steady_s`: the measurement without load and warm-up); a sweep
stops when the time left would not pay for the next trial (priced as the current best),
a duel and one confirmation round (the baseline's cost plus the best's), so the search
ends within about one paired round of the budget. Every trial is handed to `on_trial`,
which records it and drives the progress bar.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from inferenceos.errors import ModelLoadError
from inferenceos.tuning import stopping
from inferenceos.tuning.space import (
    Dimension,
    Knobs,
    llama_defaults,
    search_space,
    usable_threads,
)
from inferenceos.tuning.trials import TrialResult, TrialRunner

DUEL_ROUNDS = 2


@dataclass
class SearchResult:
    """What `optimize` found; `to_json` is the `--json` output."""

    model: str
    baseline: Knobs
    baseline_measured: dict[str, float]
    best: Knobs
    best_measured: dict[str, float]
    ratios: dict[str, float]
    trials: list[TrialResult]
    budget_s: float
    elapsed_s: float
    ended: str  # "searched" (every dimension visited) or "budget"
    confirm_rounds: int = 0
    notes: list[str] = field(default_factory=list)
    # the machine when the search started: thread counts only transfer to a plan made
    # under the same conditions (see plan.tuned.apply_best)
    conditions: dict[str, float] = field(default_factory=dict)
    # settings other than the baseline measured (in full, or stopped early as hopeless):
    # 0 when the budget paid for the baseline alone (nothing compared, nothing to store)
    compared: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "compared": self.compared,
            "baseline": {"settings": self.baseline.to_json(), **self.baseline_measured},
            "best": self.best.to_json(),
            "best_measured": self.best_measured,
            "ratios": self.ratios,
            "confirm_rounds": self.confirm_rounds,
            "budget_s": self.budget_s,
            "elapsed_s": round(self.elapsed_s, 2),
            "ended": self.ended,
            "notes": self.notes,
            "conditions": self.conditions,
            "trials": [t.to_json() for t in self.trials],
        }


class _Search:
    def __init__(
        self,
        runner: TrialRunner,
        budget_s: float,
        on_trial: Callable[[TrialResult], None],
        rounds: int,
    ) -> None:
        self.runner = runner
        self.budget_s = budget_s
        self.started = time.monotonic()
        self.deadline = self.started + budget_s
        self.on_trial = on_trial
        self.rounds = rounds
        self.trials: list[TrialResult] = []
        self.base: Knobs | None = None

    def trial(self, knobs: Knobs, phase: str, **kw: Any) -> TrialResult:
        res = self.runner.run(knobs, phase, **kw)
        self.trials.append(res)
        self.on_trial(res)
        return res

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def cost(self, knobs: Knobs) -> float:
        """Seconds a trial of `knobs` takes on a warm context: its last complete trial's,
        else the last complete trial's of any settings."""
        done = [t for t in self.trials if t.ok and not t.stopped_early]
        same = [t for t in done if t.knobs == knobs]
        last = same or done
        return last[-1].steady_s if last else 1.0

    def reserve(self, best: Knobs) -> float:
        """Seconds kept back for the final confirmation (one paired round at least)."""
        return self.cost(best) + (self.cost(self.base) if self.base else 0.0)

    def pair(
        self, a: Knobs, b: Knobs, phase: str, n: int, timed: bool = False
    ) -> tuple[list[TrialResult], ...]:
        """`n` alternating rounds of a then b (a's position alternates too, so neither
        always runs right after a context switch). `timed`: after the first round, only
        as many rounds as the budget still pays for."""
        ra: list[TrialResult] = []
        rb: list[TrialResult] = []
        for i in range(n):
            if timed and i and self.left() < self.cost(a) + self.cost(b):
                break
            order = ((a, ra), (b, rb)) if i % 2 == 0 else ((b, rb), (a, ra))
            for knobs, out in order:
                out.append(self.trial(knobs, phase))
        return ra, rb

    def sweep(self, dim: Dimension, best: Knobs) -> tuple[Knobs | None, bool, bool]:
        """Try every value of `dim` around `best`: (the winner or None, whether its win
        was decisive, whether the budget ran out)."""
        # the current best first, as the sweep's reference (also when the dimension
        # does not list its value: llama.cpp's flash attention "auto" is not offered)
        cands = list(dict.fromkeys([best, *(dim.apply(best, v) for v in dim.values)]))
        separable = dim.name == "threads"
        results: list[TrialResult] = []
        last = self.trials[-1] if self.trials else None
        for cand in cands:
            if not cand.valid():
                continue
            if cand == best and last is not None and last.knobs == best and last.ok and (
                    not last.stopped_early):
                results.append(last)  # measured just now: the sweep's reference
                continue
            if self.left() < self.reserve(best) + self.cost(best):
                return (*self._winner(dim, best, results), True)
            top_pre = max((r.prefill_tps for r in results), default=0.0)
            top_dec = max((r.decode_tps for r in results if not r.stopped_early), default=0.0)
            res = self.trial(
                cand,
                "search",
                dimension=dim.name,
                skip_decode=lambda p, top=top_pre: stopping.skip_decode(p, top, separable),
                stop=lambda d, top=top_dec: stopping.stop_decode(d, top),
            )
            if res.ok:
                results.append(res)
        return (*self._winner(dim, best, results), False)

    @staticmethod
    def _winner(
        dim: Dimension, best: Knobs, results: list[TrialResult]
    ) -> tuple[Knobs | None, bool]:
        """The sweep's winner (None: the current best) and whether the win is decisive
        against the sweep's reference (the current best's trial)."""
        full = [r for r in results if not r.stopped_early]
        ref = next((r for r in full if r.knobs == best), None)
        if not full or ref is None:
            return None, False
        if dim.name == "threads":
            dec = max(full, key=lambda r: r.decode_tps)
            pre = max(results, key=lambda r: r.prefill_tps)
            cand = replace(best, n_threads=dec.knobs.n_threads,
                           n_threads_batch=pre.knobs.n_threads_batch)
            ratios = (pre.prefill_tps / ref.prefill_tps, dec.decode_tps / ref.decode_tps)
        else:
            win = max(full, key=lambda r: stopping.score(r.prefill_tps, r.decode_tps,
                                                         ref.prefill_tps, ref.decode_tps)
                      )
            cand = win.knobs
            ratios = (win.prefill_tps / ref.prefill_tps, win.decode_tps / ref.decode_tps)
        if cand == best:
            return None, False
        return cand, stopping.decisive(*ratios)

    def duel(self, cand: Knobs, best: Knobs) -> bool:
        rc, rb = self.pair(cand, best, "duel", DUEL_ROUNDS)
        if not all(r.ok for r in rc + rb):
            return False
        pre = stopping.paired_ratios([r.prefill_tps for r in rc], [r.prefill_tps for r in rb])
        dec = stopping.paired_ratios([r.decode_tps for r in rc], [r.decode_tps for r in rb])
        return stopping.adopt(pre, dec)


def _measured(results: list[TrialResult]) -> dict[str, float]:
    return {
        "prefill_tps": round(statistics.median(r.prefill_tps for r in results), 2),
        "decode_tps": round(statistics.median(r.decode_tps for r in results), 2),
    }


def optimize(
    path: Path,
    budget_s: float = 120,
    has_gpu: bool = False,
    n_layers: int = 0,
    on_trial: Callable[[TrialResult], None] = lambda r: None,
    rounds: int = 3,
    prompt_len: int = 512,
    decode_len: int = 64,
    max_threads: int | None = None,
    runner: TrialRunner | None = None,
) -> SearchResult:
    """Search for the fastest settings of `path` here within `budget_s` seconds.

    Raises ModelLoadError when llama.cpp cannot run even its own defaults (there is then
    nothing to compare against). The best always beats the baseline in the confirmation
    (`stopping.confirmed`); when it does not, the baseline is returned as the best.
    `runner` replaces the TrialRunner (the caller closes it), e.g. to test the search's
    rules on rates that do not depend on a shared machine's noise.
    """
    base = llama_defaults(has_gpu)
    conditions = _conditions()
    # no trial may take more than a tenth of the budget (a machine busy enough to make
    # one trial crawl would otherwise spend the whole budget on the baseline)
    owned = runner is None
    run = runner or TrialRunner(path, prompt_len, decode_len, max(2.0, budget_s / 10))
    try:
        result = _optimize(_Search(run, budget_s, on_trial, rounds), path, base,
                           search_space(has_gpu, n_layers, max_threads))
        result.conditions = conditions
        return result
    finally:
        if owned:
            run.close()


def _conditions() -> dict[str, float]:
    """The CPUs free (as the planner counts them) and the load average, now."""
    from inferenceos.hardware.cpu_load import free_threads, sample_cpu_load

    load = sample_cpu_load(0.2)
    return {"free_threads": free_threads(usable_threads(), load),
            "loadavg_1m": round(load.loadavg_1m, 2)}


def _optimize(s: _Search, path: Path, base: Knobs, dims: list[Dimension]) -> SearchResult:
    """The search's steps (see the module docstring) on `s`'s runner."""
    s.base = base
    first = s.trial(base, "baseline")
    if not first.ok:
        raise ModelLoadError(f"llama.cpp's default settings failed: {first.error}")
    best, ended = base, "searched"
    for dim in dims:
        cand, decisive, out_of_time = s.sweep(dim, best)
        if cand is not None:
            duel_s = DUEL_ROUNDS * (s.cost(cand) + s.cost(best))
            if decisive:
                best = cand
            elif s.left() < s.reserve(cand) + duel_s:
                out_of_time = True
            elif s.duel(cand, best):
                best = cand
        if out_of_time:
            ended = "budget"
            break
    notes: list[str] = []
    compared = len({t.knobs for t in s.trials if t.ok and t.knobs != base})
    if best == base:
        base_runs = [t for t in s.trials if t.knobs == base and t.ok and
                     not t.stopped_early]
        measured = _measured(base_runs or [first])
        note = ("llama.cpp's defaults were the fastest settings tried" if compared else
                f"the budget ({s.budget_s:.0f} s) paid for the baseline trial only (it "
                f"took {first.elapsed_s:.1f} s): nothing was compared")
        return SearchResult(str(path), base, measured, base, measured,
                            {"prefill": 1.0, "decode": 1.0}, s.trials, s.budget_s,
                            time.monotonic() - s.started, ended, 0, [note],
                            compared=compared)
    rb, rc = s.pair(base, best, "confirm", s.rounds, timed=True)
    ratios = {
        "prefill": round(stopping.paired_ratios([r.prefill_tps for r in rc],
                                                [r.prefill_tps for r in rb]), 4),
        "decode": round(stopping.paired_ratios([r.decode_tps for r in rc],
                                               [r.decode_tps for r in rb]), 4),
    }
    base_m, best_m = _measured(rb), _measured(rc)
    if not stopping.confirmed(ratios["prefill"], ratios["decode"]):
        notes.append(f"the best of the search ({best.label()}) did not beat the defaults "
                     f"in the confirmation (prefill {ratios['prefill']:.3f}x, decode "
                     f"{ratios['decode']:.3f}x over {len(rb)} paired rounds): keeping "
                     "llama.cpp's defaults")
        best, best_m, ratios = base, base_m, {"prefill": 1.0, "decode": 1.0}
    return SearchResult(str(path), base, base_m, best, best_m, ratios, s.trials,
                        s.budget_s, time.monotonic() - s.started, ended, len(rb),
                        notes, compared=compared)
