"""The thread governor: lower llama.cpp's threads when decode steps collapse, probe back.

Pure decisions on step times (as a shared machine gives them), then the scheduler
applying a decision to a real llama.cpp context.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inferenceos.engine.thread_governor import ThreadGovernor


def gov(max_threads: int, **kw: Any) -> ThreadGovernor:
    """A governor whose window is its steps alone (`window_s` 0): the rules on step
    counts; the time window has a test of its own."""
    return ThreadGovernor(max_threads, window_s=0.0, **kw)


def feed(g: ThreadGovernor, seconds: float, n: int, t0: float, rows: int = 1,
         dt: float = 0.01) -> tuple[list[int], float]:
    """Up to `n` steps of `seconds`, stopping at the first switch (the steps after it
    run at another thread count: the caller feeds what they take); the switches the
    governor asked for, and the clock."""
    switches: list[int] = []
    for i in range(n):
        got = g.observe(seconds, rows, t0 + i * dt)
        if got is not None:
            return [got], t0 + (i + 1) * dt
    return switches, t0 + n * dt


def test_steady_steps_change_nothing() -> None:
    g = gov(4)
    switches, _ = feed(g, 0.010, 200, 0.0)
    assert switches == [] and g.threads == 4


def test_noise_below_the_threshold_changes_nothing() -> None:
    g = gov(2)
    times = [0.010, 0.012, 0.011, 0.019, 0.010, 0.021, 0.010, 0.011] * 20
    assert [g.observe(s, 1, i * 0.01) for i, s in enumerate(times)].count(None) == len(times)


def test_a_sustained_collapse_lowers_one_thread_at_a_time() -> None:
    g = gov(4)
    feed(g, 0.010, 16, 0.0)
    switches, _ = feed(g, 0.050, 8, 1.0)  # 5x slower: another program took a core
    assert switches == [3] and g.threads == 3


def test_a_step_down_that_is_slower_is_undone_and_not_retried_at_once() -> None:
    g = gov(2, probe_every_s=5.0)
    feed(g, 0.010, 16, 0.0)
    switches, t = feed(g, 0.020, 8, 1.0)  # 2x slower: try one thread
    assert switches == [1]
    switches, t = feed(g, 0.030, 8, t)  # one thread is slower still: back to two
    assert switches == [2]
    switches, t = feed(g, 0.020, 32, t)  # still 2x slower, but held for a while
    assert switches == []
    switches, _ = feed(g, 0.020, 8, t + 5.0)  # then tried again
    assert switches == [1]


def test_the_best_is_kept_per_row_count() -> None:
    g = gov(2)
    feed(g, 0.010, 16, 0.0, rows=1)
    switches, _ = feed(g, 0.020, 16, 1.0, rows=8)  # 8 rows cost 2x one row: normal
    assert switches == [] and g.threads == 2


def test_a_probe_up_is_kept_when_faster_and_undone_when_slower() -> None:
    g = gov(2, probe_every_s=5.0)
    feed(g, 0.010, 16, 0.0)
    feed(g, 0.060, 8, 1.0)  # collapse at 2 threads: down to 1
    assert g.threads == 1
    switches, t = feed(g, 0.018, 8, 2.0)  # 1 thread is steady; not yet time to probe
    assert switches == []
    switches, t = feed(g, 0.018, 8, 7.0)  # time to probe
    assert switches == [2]
    switches, t = feed(g, 0.060, 8, t)  # still contended at 2: back down
    assert switches == [1] and g.threads == 1
    switches, t = feed(g, 0.018, 8, t + 6.0)
    assert switches == [2]  # the next probe, after the interval
    switches, _ = feed(g, 0.010, 8, t)  # the other program left: 2 threads are faster
    assert switches == [] and g.threads == 2


def test_never_below_one_or_above_the_planned_count() -> None:
    g = gov(1, probe_every_s=0.0)
    feed(g, 0.010, 16, 0.0)
    switches, _ = feed(g, 0.100, 64, 1.0)
    assert switches == [] and g.threads == 1


def test_the_scheduler_applies_the_governors_count_to_the_context(tiny_llama: Path) -> None:
    from inferenceos.engine.local import LocalEngine
    from inferenceos.engine.sampling import SamplingParams
    from inferenceos.plan.llama_params import LlamaParams

    with LocalEngine(tiny_llama, LlamaParams(n_ctx=256, n_threads=2,
                                             n_threads_batch=2)) as eng:
        sched = eng._sched
        assert sched.governor is not None and sched.governor.max_threads == 2
        before = eng.generate("abc", SamplingParams(temperature=0, max_tokens=12)).text()
        sched.set_threads(1)
        ll, ctx = sched._ll, sched.model.ctx
        assert (ll.llama_n_threads(ctx), ll.llama_n_threads_batch(ctx)) == (1, 1)
        assert eng.stats()["threads"] == 1
        after = eng.generate("abc", SamplingParams(temperature=0, max_tokens=12)).text()
        assert after == before  # thread counts do not change llama.cpp's CPU results


def test_a_load_present_from_the_start_is_found_by_a_probe_down() -> None:
    """Steps slow from the first one never look slower than their best: every
    probe_down_every_s the governor tries one thread fewer and keeps it when faster."""
    g = gov(2, probe_down_every_s=30.0)
    switches, t = feed(g, 0.045, 200, 0.0)  # 2 s of steady (slow) steps: no reason yet
    assert switches == [] and g.threads == 2
    switches, t = feed(g, 0.045, 8, t + 30.0)
    assert switches == [1]
    switches, t = feed(g, 0.0033, 8, t)  # one thread runs 13x faster: kept
    assert switches == [] and g.threads == 1


def test_a_probe_down_that_is_not_faster_is_undone() -> None:
    g = gov(2, probe_down_every_s=30.0)
    _, t = feed(g, 0.010, 16, 0.0)
    switches, t = feed(g, 0.010, 8, t + 30.0)
    assert switches == [1]
    switches, t = feed(g, 0.0102, 8, t)  # 2 % slower: a tie is no reason for fewer
    assert switches == [2] and g.threads == 2


def test_a_governor_made_long_after_the_clocks_zero_waits_its_intervals() -> None:
    """The probe intervals count from the first step, not from the clock's zero (a
    scheduler passes perf_counter(): hours since boot)."""
    g = gov(2, probe_down_every_s=30.0)
    switches, t = feed(g, 0.010, 64, 5000.0)
    assert switches == [] and g.threads == 2
    switches, _ = feed(g, 0.010, 8, t + 30.0)
    assert switches == [1]  # the probe down, once its interval has passed


def test_a_trial_is_judged_on_steps_of_the_row_count_it_began_at() -> None:
    """A probe down during one-row steps (one thread faster there) is not judged on the
    eight-row steps that follow (two threads faster there): it waits for one-row steps,
    and without them it is undone."""
    g = gov(2, probe_down_every_s=30.0)
    _, t = feed(g, 0.00114, 16, 0.0, rows=1)
    switches, t = feed(g, 0.00114, 8, t + 30.0, rows=1)
    assert switches == [1]
    # 8 rows at 1 thread: 0.41 ms a row, faster per row than 1 row at 2 threads, but
    # not the same shape: no verdict until one-row steps come, undone without them
    switches, t = feed(g, 0.0033, 31, t, rows=8)
    assert switches == [] and g.threads == 1
    switches, t = feed(g, 0.0033, 1, t, rows=8)
    assert switches == [2] and g.threads == 2


def test_a_trial_waits_for_steps_of_its_row_count_and_keeps_a_faster_change() -> None:
    g = gov(2, probe_down_every_s=30.0)
    _, t = feed(g, 0.00114, 16, 0.0, rows=1)
    switches, t = feed(g, 0.00114, 8, t + 30.0, rows=1)
    assert switches == [1]
    switches, t = feed(g, 0.0033, 12, t, rows=8)  # other shapes first
    switches, t = feed(g, 0.00094, 8, t, rows=1)  # then one row, faster at 1 thread
    assert switches == [] and g.threads == 1 and g._trial is None


def test_a_count_kept_on_one_shape_is_tried_again_when_the_shape_changes() -> None:
    """1 thread won on one-row steps; when eight-row steps come, 2 threads are tried at
    once (not after probe_every_s) and kept when faster there."""
    g = gov(2, probe_every_s=10.0, probe_down_every_s=30.0)
    _, t = feed(g, 0.00114, 16, 0.0, rows=1)
    switches, t = feed(g, 0.00114, 8, t + 30.0, rows=1)
    assert switches == [1]
    switches, t = feed(g, 0.00094, 8, t, rows=1)  # kept: faster at one row
    assert switches == [] and g.threads == 1
    switches, t = feed(g, 0.0033, 8, t, rows=8)  # a new shape, well within 10 s
    assert switches == [2]
    switches, t = feed(g, 0.0012, 8, t, rows=8)  # faster there: kept
    assert switches == [] and g.threads == 2
    switches, _ = feed(g, 0.0012, 64, t, rows=7)  # 5 to 8 rows are one shape
    assert switches == [] and g.threads == 2


def test_a_window_spans_a_quarter_second_of_steps() -> None:
    """Short steps are judged in windows of window_s (0.25 s) of them: a burst of slow
    steps shorter than that (a neighbour's time slice) changes nothing; a sustained one
    does."""
    g = ThreadGovernor(2)
    switches, t = feed(g, 0.001, 300, 0.0, rows=8, dt=0.001)
    switches, t = feed(g, 0.004, 16, t, rows=8, dt=0.004)  # 64 ms of 4x slower steps
    assert switches == []
    switches, t = feed(g, 0.001, 300, t, rows=8, dt=0.001)
    switches, t = feed(g, 0.004, 300, t, rows=8, dt=0.004)  # 1.2 s of them
    assert switches == [1]


def test_a_long_window_is_judged_four_times_per_window_not_every_eight_steps() -> None:
    """One row of the tiny llama is ~0.7 ms a step: a 0.25 s window holds ~350 steps,
    and grouping them every 8 steps was 15 % of the worker's GIL time at one stream."""
    g = ThreadGovernor(2)
    groupings = 0
    group = g._by_rows

    def counted() -> dict[int, list[float]]:
        nonlocal groupings
        groupings += 1
        return group()

    g._by_rows = counted  # type: ignore[method-assign]
    switches, _ = feed(g, 0.0007, 3600, 0.0, rows=1, dt=0.0007)
    assert switches == [] and g.threads == 2
    # 2.5 s of steps: ten windows, each judged about four times (every 8 steps: 450)
    assert 20 <= groupings <= 60, groupings
