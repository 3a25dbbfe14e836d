"""Lower llama.cpp's thread count when steps suddenly take far longer (another program
took a core), and try it back up once in a while.

Why: ggml's worker threads spin-wait for each other at every operation; when one of
the cores they expect is taken by another process, every step waits for the thread
that lost its core, and decode collapses (3-5 t/s instead of ~40 on Gemma 3 270M during
a build, measured). The planner picks threads from the cores free at load time; this
governor follows the load while a model runs.

`ThreadGovernor.observe(seconds, rows)` takes each pure decode step (the step's wall
time and how many batch rows it evaluated) and returns a new thread count to apply, or
None. Every change is a trial, judged on the median of the next `window` steps:
- a step is compared with the fastest median seen for the same thread count and row
  count; at `slow` times that (default 1.6x) the governor tries one thread fewer;
- every `probe_every_s` seconds below the planned count it tries one thread more;
- every `probe_down_every_s` seconds above one thread it tries one fewer, kept only
  when faster: a load present from the start never shows as slower than the best
  (the best is measured under it), and 2 threads stayed on at 45 ms a step where 1
  ran 3.3 (serve, tiny model, 8 streams, load 9; issue 44);
- a trial whose seconds per row are worse than before it (by 5 %) is undone, and the
  governor then waits `probe_every_s` before trying again.
Pure: no llama.cpp, no clock of its own (the caller passes `now`).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field


@dataclass
class ThreadGovernor:
    """See the module docstring. `threads`: the count in force; `max_threads`: the
    planner's pick, never exceeded."""

    max_threads: int
    threads: int = 0
    window: int = 8
    slow: float = 1.6
    probe_every_s: float = 10.0
    probe_down_every_s: float = 30.0
    best: dict[tuple[int, int], float] = field(default_factory=dict)  # (threads, rows) → s
    changes: int = 0
    _recent: deque[tuple[float, int]] = field(default_factory=deque)
    _last_change: float = 0.0
    # (threads, s/row) before the change on trial, and how much slower it may be kept
    _trial: tuple[int, float, float] | None = None
    _hold_until: float = 0.0  # after an undone trial: no new one before then

    def __post_init__(self) -> None:
        self.max_threads = max(1, self.max_threads)
        self.threads = self.threads or self.max_threads

    def observe(self, seconds: float, rows: int, now: float) -> int | None:
        """Record one decode step; the thread count to switch to, or None."""
        rows = max(1, rows)
        self._recent.append((seconds, rows))
        if len(self._recent) < self.window:
            return None
        while len(self._recent) > self.window:
            self._recent.popleft()
        ratio, per_row = self._summary()
        if self._trial is not None:
            return self._judge(per_row, now)
        if now < self._hold_until:
            return None
        if self.threads > 1 and ratio > self.slow:
            return self._try(self.threads - 1, per_row, now)
        if self.threads < self.max_threads and now - self._last_change >= self.probe_every_s:
            return self._try(self.threads + 1, per_row, now)
        if self.threads > 1 and now - self._last_change >= self.probe_down_every_s:
            return self._try(self.threads - 1, per_row, now, keep_if=1.0)
        return None

    def _summary(self) -> tuple[float, float]:
        """(median ratio of each step to the best for its shape, median s per row);
        updates the bests with this window's medians."""
        by_rows: dict[int, list[float]] = {}
        for s, r in self._recent:
            by_rows.setdefault(r, []).append(s)
        for r, times in by_rows.items():
            key = (self.threads, r)
            med = statistics.median(times)
            self.best[key] = min(self.best.get(key, med), med)
        ratios = [s / self.best[(self.threads, r)] for s, r in self._recent]
        per_row = statistics.median(s / r for s, r in self._recent)
        return statistics.median(ratios), per_row

    def _try(self, threads: int, per_row: float, now: float, keep_if: float = 1.05) -> int:
        self._trial = (self.threads, per_row, keep_if)
        return self._switch(threads, now)

    def _judge(self, per_row: float, now: float) -> int | None:
        assert self._trial is not None
        before, before_per_row, keep_if = self._trial
        self._trial = None
        if per_row > before_per_row * keep_if:  # the change made it worse: undo, wait
            self._hold_until = now + self.probe_every_s
            return self._switch(before, now)
        self._last_change = now  # kept; the next probe up waits its turn
        return None

    def _switch(self, threads: int, now: float) -> int:
        self.threads = threads
        self._recent.clear()
        self._last_change = now
        self.changes += 1
        return threads
