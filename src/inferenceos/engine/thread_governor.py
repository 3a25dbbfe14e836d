"""Lower llama.cpp's thread count when steps suddenly take far longer (another program
took a core), and try it back up once in a while.

Why: ggml's worker threads spin-wait for each other at every operation; when one of
the cores they expect is taken by another process, every step waits for the thread
that lost its core, and decode collapses (3-5 t/s instead of ~40 on Gemma 3 270M during
a build, measured). The planner picks threads from the cores free at load time; this
governor follows the load while a model runs.

`ThreadGovernor.observe(seconds, rows)` takes each pure decode step (the step's wall
time and how many batch rows it evaluated) and returns a new thread count to apply, or
None. Every change is a trial, judged on the median of the next window: the last
`window` steps, or more to make `window_s` seconds of steps. Eight steps of the tiny
llama at 8 streams are 20 ms, and medians of such windows at 2 threads spread 1.3-3.5
ms a step beside the HTTP process (the scheduler's time slices are milliseconds): a
trial judged on one of them kept 1 thread for whole runs (2,331 t/s against 2,643-
2,733 at 2 threads, quiet, issue 44). The rules:
- a step is compared with the fastest median seen for the same thread count and row
  count; at `slow` times that (default 1.6x) the governor tries one thread fewer;
- every `probe_every_s` seconds below the planned count it tries one thread more;
- every `probe_down_every_s` seconds above one thread it tries one fewer, kept only
  when faster: a load present from the start never shows as slower than the best
  (the best is measured under it), and 2 threads stayed on at 45 ms a step where 1
  ran 3.3 (serve, tiny model, 8 streams, load 9; issue 44);
- a trial whose seconds per row are worse than before it (by 5 %) is undone, and the
  governor then waits `probe_every_s` before trying again.
A trial compares like with like: the seconds per row of steps with the row count most
common before it. Which thread count is faster depends on the rows: on the tiny llama
one row took 0.94 ms at 1 thread and 1.14 at 2, eight rows 3.3 ms against 1.2. Judged
across row counts, a probe made during a server's one-row warm-up kept 1 thread for
the 8-row load that followed (serve at 8 streams: 2,340-2,380 t/s, against 2,490-2,860
where 2 threads ran; issue 44). A trial whose window has too few such steps waits for
more, and is undone after four windows' steps without them. When the steps' shape (their
row count's power-of-two class) is not the one the last trial was judged on, the count
in force is tried against its neighbour at once. The first step starts the probe
clocks: a governor made at load time waits its intervals like any other.
Pure: no llama.cpp, no clock of its own (the caller passes `now`).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field


@dataclass(frozen=True)
class _Trial:
    """A thread change on trial: the count and seconds per row (at `rows` rows a step)
    before it, and how much slower than that it may be and still be kept."""

    threads: int
    per_row: float
    keep_if: float
    rows: int


@dataclass
class ThreadGovernor:
    """See the module docstring. `threads`: the count in force; `max_threads`: the
    planner's pick, never exceeded."""

    max_threads: int
    threads: int = 0
    window: int = 8
    window_s: float = 0.25  # and at least this much step time in a window
    slow: float = 1.6
    probe_every_s: float = 10.0
    probe_down_every_s: float = 30.0
    best: dict[tuple[int, int], float] = field(default_factory=dict)  # (threads, rows) → s
    changes: int = 0
    _recent: deque[tuple[float, int]] = field(default_factory=deque)
    _span: float = 0.0  # the seconds of the steps in _recent
    _last_change: float = 0.0
    # the change on trial: the threads and s/row before it, how much slower it may be
    # kept, and the row count its s/row is for
    _trial: _Trial | None = None
    _trial_steps: int = 0  # steps seen since the trial began
    _next_eval: int = 0  # the next evaluation at this many _trial_steps
    _hold_until: float = 0.0  # after an undone trial: no new one before then
    _started: bool = False  # the first step seen: the probe intervals count from it
    _decided: int | None = None  # the step shape (_shape) the last trial was judged on

    def __post_init__(self) -> None:
        self.max_threads = max(1, self.max_threads)
        self.threads = self.threads or self.max_threads

    def observe(self, seconds: float, rows: int, now: float) -> int | None:
        """Record one decode step; the thread count to switch to, or None."""
        rows = max(1, rows)
        if not self._started:
            self._started, self._last_change = True, now
        self._recent.append((seconds, rows))
        self._span += seconds
        self._trial_steps += 1
        while (len(self._recent) > self.window
               and self._span - self._recent[0][0] >= self.window_s):
            self._span -= self._recent.popleft()[0]
        if len(self._recent) < self.window or self._span < self.window_s:
            return None
        if self._trial_steps < self._next_eval:
            return None
        # judged every `window` steps, or every quarter of a longer window: its medians
        # cost ~30 µs over 100 steps, and one row of the tiny llama makes ~350 steps of
        # 0.25 s, whose grouping every 8 steps was 15 % of the worker's GIL time
        self._next_eval = self._trial_steps + max(self.window, len(self._recent) // 4)
        by_rows = self._by_rows()  # grouped once per evaluation
        ratio = self._summary(by_rows)
        if self._trial is not None:
            return self._judge(by_rows, now)
        if now < self._hold_until:
            return None
        shape = _shape(_commonest(by_rows))
        if self._decided is not None and shape != self._decided and self.max_threads > 1:
            # the count in force was judged on another shape: judge it on this one now
            if self.threads < self.max_threads:
                return self._try(self.threads + 1, by_rows, now)
            return self._try(self.threads - 1, by_rows, now, keep_if=1.0)
        if self.threads > 1 and ratio > self.slow:
            return self._try(self.threads - 1, by_rows, now)
        if self.threads < self.max_threads and now - self._last_change >= self.probe_every_s:
            return self._try(self.threads + 1, by_rows, now)
        if self.threads > 1 and now - self._last_change >= self.probe_down_every_s:
            return self._try(self.threads - 1, by_rows, now, keep_if=1.0)
        return None

    def _summary(self, by_rows: dict[int, list[float]]) -> float:
        """The median ratio of each step to the best for its shape; updates the bests
        with this window's medians (`by_rows`: the window's `_by_rows()`)."""
        for r, times in by_rows.items():
            key = (self.threads, r)
            med = statistics.median(times)
            self.best[key] = min(self.best.get(key, med), med)
        return statistics.median(s / self.best[(self.threads, r)] for s, r in self._recent)

    def _by_rows(self) -> dict[int, list[float]]:
        """The window's step times by row count."""
        by_rows: dict[int, list[float]] = {}
        for s, r in self._recent:
            by_rows.setdefault(r, []).append(s)
        return by_rows

    def _try(self, threads: int, by_rows: dict[int, list[float]], now: float,
             keep_if: float = 1.05) -> int:
        rows = _commonest(by_rows)
        per_row = statistics.median(by_rows[rows]) / rows
        self._trial = _Trial(self.threads, per_row, keep_if, rows)
        self._trial_steps = self._next_eval = 0
        return self._switch(threads, now)

    def _judge(self, by_rows: dict[int, list[float]], now: float) -> int | None:
        """Keep or undo the trial on this window's steps of the trial's row count; None
        while they are fewer than half the window (undone after four windows' steps
        without enough)."""
        trial = self._trial
        assert trial is not None
        times = by_rows.get(trial.rows, [])
        if len(times) * 2 < len(self._recent):
            if self._trial_steps < len(self._recent) * 4:
                return None
            per_row = float("inf")  # no like-for-like figure: the change is not kept
        else:
            per_row = statistics.median(times) / trial.rows
        self._trial = None
        self._decided = _shape(trial.rows)
        if per_row > trial.per_row * trial.keep_if:  # the change made it worse: undo, wait
            self._hold_until = now + self.probe_every_s
            return self._switch(trial.threads, now)
        self._last_change = now  # kept; the next probe up waits its turn
        return None

    def _switch(self, threads: int, now: float) -> int:
        self.threads = threads
        self._recent.clear()
        self._span = 0.0
        self._last_change = now
        self.changes += 1
        return threads


def _commonest(by_rows: dict[int, list[float]]) -> int:
    """The row count with the most steps in a window (the larger on a tie)."""
    return max(by_rows, key=lambda r: (len(by_rows[r]), r))


def _shape(rows: int) -> int:
    """A step's shape for the choice of threads: its row count's power-of-two class (1,
    2, 3-4, 5-8, 9-16, ...): a server's 8 streams give 5 to 8 rows as replies end."""
    return (max(1, rows) - 1).bit_length()
