"""Attention and dense FFN as separate placement groups (plan/optimize*.py): at long
contexts a small accelerator is worth more to layers' attention and KV cache than to
their FFN, so the optimizer may keep an offloaded layer's FFN group in RAM (llama.cpp's
`-ot "blk\\.N\\.ffn_.*=CPU"`). On every case here the MILPs (per layer and per count)
give the best of the exhaustive listing, which now lists the split too."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from inferenceos.plan.memory import ContextSettings, compute_terms
from inferenceos.plan.model_facts import ModelFacts, load_model_facts
from inferenceos.plan.optimize import (
    Candidate,
    Objective,
    evaluate,
    fits,
    solve_context,
    solve_with,
)
from inferenceos.plan.optimize_exhaustive import best_exhaustive, placements
from inferenceos.plan.optimize_milp import best_placement
from inferenceos.plan.optimize_terms import Terms, phases
from inferenceos.plan.perf import Calibration
from inferenceos.plan.placement import FFN_ROLE, build_placement, layer_parts
from inferenceos.plan.plan import FFN_TENSORS
from inferenceos.plan.preflight import make_plan
from plan_factories import GiB, machine, make_facts, q4_k_m_like
from tiny_models import SHAPES, write_tiny_model

CAL = Calibration()
OBJ = Objective(prompt_tokens=512, output_tokens=128)
CTX = ContextSettings(n_ctx=4096, n_ubatch=512, n_batch=512, flash_attn=True)


def _gpu_for(facts: ModelFacts, ctx: ContextSettings, layers: float) -> int:
    """A GPU budget holding a compute buffer and `layers` whole layers' worth of bytes."""
    p = layer_parts(facts, ctx)[0]
    whole = p.dense_bytes + p.kv_bytes + p.expert_bytes
    return int((compute_terms(facts, ctx).total + layers * whole) / 0.95)


def _best_unsplit(facts: ModelFacts, m, ctx: ContextSettings) -> Candidate:  # type: ignore[no-untyped-def]
    """The exhaustive optimum of the space before the split (every FFN with its layer)."""
    parts, best = layer_parts(facts, ctx), None
    for dense, ffn, experts, head in placements(facts, m, parts):
        if ffn != dense:
            continue
        c = evaluate(facts, m, ctx, build_placement(facts, parts, dense, experts, head),
                     CAL, 8, OBJ)
        if fits(c, m, facts) and (best is None or c.objective_s < best.objective_s):
            best = c
    assert best is not None
    return best


@pytest.mark.parametrize("solver", ["counts", "per-layer"])
def test_both_milps_keep_ffn_in_ram_exactly_when_the_listing_does(solver: str) -> None:
    """A 7B-shaped dense model (6 layers) at 4096 tokens on GPUs of one to four layers
    (at four, exactly full: the MILP's memory rows keep a margin for its tolerances):
    each solver's placement costs what the listing's best costs, and where that best
    keeps FFN groups in RAM it beats every plan without the split."""
    facts = make_facts(n_layer=6)
    split = 0
    for k in (0.8, 1.6, 2.4, 3.2, 4.0):
        m = machine(ram=64 * GiB, gpus=(_gpu_for(facts, CTX, k),))
        want = best_exhaustive(facts, m, CTX, CAL, 8, OBJ)
        assert want is not None
        if solver == "counts":
            got = solve_context(facts, m, CTX, CAL, 8, OBJ)
        else:  # the per-layer program on the same model (models with unlike layers)
            got = solve_with(best_placement, facts, m, CTX, CAL, 8, OBJ, allow_disk=False)
        assert got is not None
        assert got.objective_s == pytest.approx(want.objective_s, rel=1e-6), (
            k, got.label(), want.label())
        if want.placement.cpu_ffn_layers:
            split += 1
            assert got.placement.cpu_ffn_layers, got.label()
            assert want.objective_s < _best_unsplit(facts, m, CTX).objective_s
    assert split >= 2  # the split is the optimum on most of these GPUs, not a corner


def test_the_per_layer_milp_matches_the_listing_on_unlike_layers() -> None:
    """Two classes of layers, one GPU and two: the per-layer MILP (a count per class
    and device of the layers keeping their FFN group) costs what the listing's best
    costs, and keeps some FFN in RAM where that is best."""
    from inferenceos.plan.optimize_rows import LayerClasses

    facts = q4_k_m_like(make_facts(n_layer=6), {0, 5})
    assert len(LayerClasses.of_parts(layer_parts(facts, CTX)).members) == 2
    split = 0
    for gpus in ((0.8,), (1.6,), (2.4,), (4.0,), (0.9, 1.4)):
        m = machine(ram=64 * GiB, gpus=tuple(_gpu_for(facts, CTX, k) for k in gpus))
        want = best_exhaustive(facts, m, CTX, CAL, 8, OBJ)
        got = solve_context(facts, m, CTX, CAL, 8, OBJ)
        assert want is not None and got is not None
        assert got.objective_s == pytest.approx(want.objective_s, rel=1e-6), (
            gpus, got.label(), want.label())
        split += bool(got.placement.cpu_ffn_layers)
    assert split >= 2


def test_a_split_layers_memory_and_speed_follow_its_groups() -> None:
    """FFN in RAM: the GPU holds the layer's attention and KV only, the CPU its FFN, and
    the decode pays two crossings for it (perf counts them as detours)."""
    facts = make_facts(n_layer=4)
    parts = layer_parts(facts, CTX)
    m = machine(ram=64 * GiB, gpus=(8 * GiB,))
    whole = build_placement(facts, parts, ["CPU", "CPU", "GPU0", "GPU0"], [None] * 4, "CPU")
    split = build_placement(facts, parts, ["CPU", "CPU", "GPU0", "GPU0"], [None] * 4, "CPU",
                            ffn=["CPU", "CPU", "CPU", "GPU0"])
    p = parts[2]
    assert whole.loads["GPU0"].weights - split.loads["GPU0"].weights == p.ffn_bytes
    assert split.loads["CPU"].weights - whole.loads["CPU"].weights == p.ffn_bytes
    assert split.detours == (2,) and split.crossings == whole.crossings + 2
    assert split.cpu_ffn_layers == (2,)
    a, b = evaluate(facts, m, CTX, whole, CAL, 8, OBJ), evaluate(facts, m, CTX, split, CAL, 8, OBJ)
    assert b.memory.by_device["GPU0"] == a.memory.by_device["GPU0"] - p.ffn_bytes
    assert b.decode_s > a.decode_s  # the FFN now runs at the CPU's bandwidth


def test_the_linear_terms_of_a_split_layer_add_up_to_perf() -> None:
    """optimize_terms' contract for the new group: attention + FFN terms per device
    are perf.py's time for it, decode and prefill, with FFN groups in RAM."""
    from inferenceos.plan.perf import decode_cost, prefill_cost

    facts = make_facts(n_layer=4)
    parts = layer_parts(facts, CTX)
    m = machine(ram=64 * GiB, gpus=(8 * GiB,))
    dense, ffn = ["CPU", "GPU0", "GPU0", "GPU0"], ["CPU", "CPU", "GPU0", "CPU"]
    pl = build_placement(facts, parts, dense, [None] * 4, "GPU0", ffn=ffn)
    for ph in phases(OBJ.prompt_tokens, OBJ.output_tokens, CTX.n_ubatch, CAL):
        t = Terms(facts, m, CTX, parts, CAL, 8, ph)
        cost = (decode_cost(facts, pl, m, CTX, ph.n_past, CAL, 8) if ph.decode else
                prefill_cost(facts, pl, m, CTX, ph.tokens, CTX.n_ubatch, CAL, 8))
        for dev in m.devices:
            works = [t.attention(dev, q) for q in parts if dense[q.index] == dev.name]
            works += [t.ffn(dev, q) for q in parts if ffn[q.index] == dev.name]
            if dev.name == "GPU0":
                works.append(t.head(dev))
            mem, comp = sum(w.mem for w in works), sum(w.comp for w in works)
            want = sum(v for n, v in cost.parts.items() if n.startswith(dev.name + " "))
            assert max(mem, comp) / ph.weight == pytest.approx(want, rel=1e-9)


def test_a_plan_with_ffn_in_ram_tells_llama_cpp_which_tensors() -> None:
    facts = make_facts(n_layer=6)
    m = machine(ram=64 * GiB, gpus=(_gpu_for(facts, CTX, 1.6),))
    plan = make_plan(facts, m, CTX)
    layers = plan.placement.cpu_ffn_layers
    assert layers, plan.summary()
    alt = "|".join(str(i) for i in layers)
    assert (rf"blk\.({alt})\.{FFN_TENSORS}", "CPU") in plan.tensor_overrides
    assert plan.params().tensor_buft_overrides == tuple(plan.tensor_overrides)
    assert f"FFN of {len(layers)} in RAM" in plan.summary()
    moved = [t.name for t in facts.tensors if plan.placement.device_of(t) == "CPU"
             and t.layer in layers]
    assert moved and all(re.search(plan.tensor_overrides[-1][0], n) for n in moved
                         if not n.split(".")[2].startswith("attn"))


@pytest.mark.parametrize("kind", sorted(SHAPES))
def test_the_ffn_pattern_names_exactly_the_ffn_group(tmp_path: Path, kind: str) -> None:
    """The regex matches a tensor exactly when the planner counts it in the FFN group
    (not a norm, not a routed expert), on every tiny architecture."""
    facts = load_model_facts(write_tiny_model(tmp_path / "m.gguf", kind))
    for t in facts.tensors:
        assert bool(re.search(FFN_TENSORS, t.name)) == (t.role == FFN_ROLE), t.name
    assert any(t.role == FFN_ROLE for t in facts.tensors)


def test_placement_and_simulate_show_the_ffn_in_ram(tmp_path: Path) -> None:
    """The command line a user reads: `placement` draws an FFN column and says what
    was kept in RAM and why; `simulate --json` carries each layer's FFN device and the
    tensor override llama.cpp will get."""
    import json

    from typer.testing import CliRunner

    from inferenceos.cli.main import app
    from plan_factories import write_sparse_gguf

    model = str(write_sparse_gguf(tmp_path / "m.gguf", make_facts(n_layer=6)))
    args = [model, "--gpu-memory", "650MiB", "--ctx", "4096"]
    run = CliRunner().invoke
    shown = run(app, ["placement", *args])
    assert shown.exit_code == 0, shown.output
    assert "attention + KV" in shown.stdout and "FFN" in shown.stdout
    assert "offloaded layer(s) in RAM" in shown.stdout
    q = run(app, ["simulate", *args, "--json"])
    assert q.exit_code == 0, q.output
    plan = json.loads(q.stdout)["plan"]
    split = [la["layer"] for la in plan["placement"]["layers"]
             if la["dense"] == "GPU0" and la["ffn"] == "CPU"]
    assert split, plan["placement"]["layers"]
    alt = "|".join(str(i) for i in split)
    assert rf"blk\.({alt})\.{FFN_TENSORS}=CPU" in plan["llama_params"]["tensor_buft_overrides"]
