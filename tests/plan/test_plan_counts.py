"""The count program over classes of alike layers (plan/optimize_counts.py): with
several classes, its branch and bound over block boundaries gives the exhaustive
listing's optimum, and hands over to the per-layer program when it runs long."""

from __future__ import annotations

import pytest

from inferenceos.plan import optimize_counts
from inferenceos.plan.memory import ContextSettings
from inferenceos.plan.optimize import Objective, solve_context
from inferenceos.plan.optimize_counts import _hull_facets
from inferenceos.plan.optimize_exhaustive import best_exhaustive
from inferenceos.plan.perf import Calibration
from plan_factories import GiB, machine, make_facts, q4_k_m_like

CAL = Calibration()
OBJ = Objective(prompt_tokens=512, output_tokens=128)
CTX = ContextSettings(n_ctx=4096, n_ubatch=512, n_batch=512, flash_attn=True)


def test_the_hull_holds_every_point_and_touches_its_ends() -> None:
    """Q4_K_M's every-third-layer class: the facets keep every (b, P(b)) and pass
    through both ends (so a node bounded to [lo, at] forces S = P(at) at b = at)."""
    steps = [0]
    for i in range(12):
        steps.append(steps[-1] + (1 if i % 3 == 2 else 0))
    pts = [(x, steps[x]) for x in range(2, 11)]
    facets = _hull_facets(pts)
    assert facets
    for x, y in pts:
        assert all(sign * (y - a0 - a1 * x) >= -1e-9 for a0, a1, sign in facets)
    for x, y in (pts[0], pts[-1]):
        for sign in (1.0, -1.0):  # the lower and the upper hull both pass through it
            assert min(abs(y - a0 - a1 * x) for a0, a1, s in facets if s == sign) < 1e-9


def test_unlike_layers_over_several_gpus_match_the_listing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 7-layer model whose layers 1 and 2 are heavier (two classes) over two, three
    and four devices: the boundary search's optimum is the listing's, and on some of
    them the relaxation's counts were no placement (which ones depends on the
    solver's choice among equal optima)."""
    facts = q4_k_m_like(make_facts(n_layer=7), {1, 2})
    whole = 470 * (1 << 20)  # about one layer with its KV at 4096
    programs: list[object] = []
    solve = optimize_counts._Counts.solve
    monkeypatch.setattr(optimize_counts._Counts, "solve",
                        lambda self, b, left: programs.append(b) or solve(self, b, left))
    searched = 0
    for gpus in ((0.9, 1.4), (0.7, 0.7, 1.2), (1.1, 1.1), (0.6, 1.7), (0.8, 0.8, 0.8)):
        m = machine(ram=64 * GiB, gpus=tuple(int(g * whole) + 200 * (1 << 20) for g in gpus))
        programs.clear()
        got = solve_context(facts, m, CTX, CAL, 8, OBJ)
        want = best_exhaustive(facts, m, CTX, CAL, 8, OBJ)
        assert want is not None and got is not None
        assert got.objective_s == pytest.approx(want.objective_s, rel=1e-6), (
            gpus, got.label(), want.label())
        assert got.placement.gpu_layers > 0
        searched += len(programs) > 1
    assert searched  # the search branched somewhere, not only at the root


def test_a_long_search_hands_over_to_the_per_layer_program(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With no programs to spend the boundary search gives way at once, and the
    per-layer program answers: the same optimum."""
    from inferenceos.plan.optimize_rows import Problem
    from inferenceos.plan.optimize_terms import Terms, phases
    from inferenceos.plan.placement import layer_parts

    facts = q4_k_m_like(make_facts(n_layer=7), {0, 3, 6})
    m = machine(ram=64 * GiB, gpus=(int(1.4 * 470 * (1 << 20)),) * 2)
    want = best_exhaustive(facts, m, CTX, CAL, 8, OBJ)
    monkeypatch.setattr(optimize_counts, "MAX_NODES", 0)
    parts = layer_parts(facts, CTX)
    dec, pre = phases(OBJ.prompt_tokens, OBJ.output_tokens, CTX.n_ubatch, CAL)
    terms = tuple(Terms(facts, m, CTX, parts, CAL, 8, ph) for ph in (dec, pre))
    with pytest.raises(optimize_counts.SearchTooLong):
        optimize_counts.best_placement_counts(Problem(facts, m, CTX, parts, terms))
    got = solve_context(facts, m, CTX, CAL, 8, OBJ)
    assert want is not None and got is not None
    assert got.objective_s == pytest.approx(want.objective_s, rel=1e-6)
