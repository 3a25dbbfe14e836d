"""What the placement programs share: the program under construction (`Program`: bounds,
costs, sparse rows, and HiGHS through scipy), each device's budget, and the rows and
terms both formulations write the same way (the disk's cost, the streaming room, the
CPU's memory, the output head's work, a device's time as the max of two sums).

`optimize_milp` writes the program per layer, `optimize_counts` over counts of alike
layers (`alike_key`); their answers are judged by perf.py and footprint.py
(optimize.py), never by these rows alone.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from inferenceos.plan.devices import Machine
from inferenceos.plan.devices import device_budgets as device_budgets  # re-exported
from inferenceos.plan.footprint import device_compute, stream_room
from inferenceos.plan.memory import (
    ContextSettings,
    compute_terms,
    output_buffer_bytes,
    process_overhead,
)
from inferenceos.plan.model_facts import ModelFacts
from inferenceos.plan.optimize_terms import Terms, Work
from inferenceos.plan.placement import LayerParts, output_head

# The solver's tolerances (1e-7 on rows scaled to a largest coefficient of 1, 1e-6 on
# integrality) let an optimum sit a few bytes over a budget it fills to the byte, which
# footprint.estimate then refuses: a GPU sized for exactly four layers of a 7B-shaped
# model got them one byte over, and the context had no plan. Such an answer is solved
# again with its memory rows this share of their coefficients (and 4 KiB) lower.
BYTES_MARGIN = 2e-6
# HiGHS's primal heuristics find nothing branch-and-bound does not find at once on
# these small programs, and cost most of its time: off, 122 -> 47 ms median for the
# 100-layer MoE over 4 GPUs (same optimum; a loaded 2-core machine, load average ~8)
HIGHS_OPTIONS = {
    "mip_heuristic_effort": 0.0, "mip_heuristic_run_feasibility_jump": False,
    "mip_heuristic_run_root_reduced_cost": False, "mip_heuristic_run_zi_round": False,
    "mip_heuristic_run_shifting": False,
}


@dataclass(frozen=True)
class Problem:
    """One placement program's inputs, which both formulations (`optimize_milp.
    best_placement`, `optimize_counts.best_placement_counts`) take whole: the model,
    the machine, the context, its layers' parts, the decode and prefill terms to
    minimise, whether weights may stay on disk, and the bytes each memory row keeps
    free (`margin`: see BYTES_MARGIN)."""

    facts: ModelFacts
    machine: Machine
    ctx: ContextSettings
    parts: list[LayerParts]
    terms: tuple[Terms, ...]
    allow_disk: bool = False
    margin: float = 0.0


@dataclass
class Program:
    """A MILP under construction: variable bounds, costs, sparse rows."""

    lb: list[float] = field(default_factory=list)
    ub: list[float] = field(default_factory=list)
    c: list[float] = field(default_factory=list)
    integ: list[int] = field(default_factory=list)
    rows: list[dict[int, float]] = field(default_factory=list)
    lo: list[float] = field(default_factory=list)
    hi: list[float] = field(default_factory=list)
    margin: float = 0.0  # kept free in every memory row (bytes_row)
    presolve: bool = True  # HiGHS's presolve (see optimize_counts.QUICK_S)
    proven: bool = False  # the last solve's answer is optimal (not cut by its time limit)

    def var(self, lb: float = 0.0, ub: float = 1.0, cost: float = 0.0, integer: bool = True) -> int:
        self.lb.append(lb)
        self.ub.append(ub)
        self.c.append(cost)
        self.integ.append(1 if integer else 0)
        return len(self.c) - 1

    def row(self, coefs: dict[int, float], lo: float = -np.inf, hi: float = np.inf) -> None:
        self.rows.append(coefs)
        self.lo.append(lo)
        self.hi.append(hi)

    def bytes_row(self, coefs: dict[int, float], hi: float) -> None:
        """A memory row, coefs · vars ≤ hi bytes, kept `margin` (a share of its
        coefficients' sum, and 4 KiB) below `hi` when the program is built with one
        (see `BYTES_MARGIN`)."""
        if self.margin:
            hi -= self.margin * sum(abs(a) for a in coefs.values()) + 4096
        self.row(coefs, hi=hi)

    def solve(self, time_limit: float) -> np.ndarray | None:
        # rows mix bytes (1e9) and seconds (1e-3): each row and the objective are scaled
        # to a largest coefficient of 1, which HiGHS solves 10x faster (same optimum)
        r, cidx, v = [], [], []
        lo, hi = np.array(self.lo), np.array(self.hi)
        for i, coefs in enumerate(self.rows):
            big = max((abs(a) for a in coefs.values()), default=1.0) or 1.0
            lo[i] /= big
            hi[i] /= big
            for j, a in coefs.items():
                r.append(i)
                cidx.append(j)
                v.append(a / big)
        # imported here, not at the top: scipy.optimize costs ~0.3-0.5 s to import, and
        # every CLI command (`--version`, `models list`) imports the planner's modules
        from scipy.optimize import Bounds, LinearConstraint, milp
        from scipy.sparse import coo_matrix

        a = coo_matrix((v, (r, cidx)), shape=(len(self.rows), len(self.c))).tocsr()
        c = np.array(self.c)
        with warnings.catch_warnings():  # scipy warns, then passes HiGHS's own options on
            warnings.filterwarnings("ignore", "Unrecognized options", RuntimeWarning)
            res = milp(
                c, integrality=np.array(self.integ),
                bounds=Bounds(np.array(self.lb), np.array(self.ub)),
                constraints=[LinearConstraint(a, lo, hi)],
                options={"time_limit": time_limit, "mip_rel_gap": 1e-7, **HIGHS_OPTIONS,
                         "presolve": self.presolve},
            )
        self.proven = res.status == 0  # 1: the time limit, with the best found
        return res.x if res.x is not None and res.status in (0, 1) else None


def disk_cost(m: Program, s: int, terms: tuple[Terms, ...] | list[Terms]) -> None:
    """The objective's disk term: `s` (bytes left on disk) split into the phases' common
    segments (Terms.disk_segments: the same bytes in every phase, each phase its own
    cost per byte), each a bounded continuous variable costing the phases' sum."""
    if not terms or m.ub[s] <= 0:
        return
    per_phase = [t.disk_segments() for t in terms]
    parts = {s: 1.0}
    for k, (size, _) in enumerate(per_phase[0]):
        cost = sum(segs[k][1] for segs in per_phase)
        v = m.var(0.0, min(size, m.ub[s]), cost=cost, integer=False)
        parts[v] = -1.0
    m.row(parts, lo=0.0, hi=0.0)


def add(row: dict[int, float], j: int, a: float) -> None:
    row[j] = row.get(j, 0.0) + a


def alike_key(p: LayerParts) -> tuple[int, ...]:
    """What makes two layers interchangeable for the cost model and the budgets."""
    return (p.dense_bytes, p.expert_bytes, p.dense_params, p.expert_params, p.kv_bytes,
            p.ffn_bytes, p.ffn_params)


@dataclass(frozen=True)
class LayerClasses:
    """A model's layers grouped into classes of alike layers (`alike_key`), numbered in
    the order their first layer comes: `of[i]` is layer i's class, `members[c]` its
    layers in order, `rep[c]` one of them (all cost and weigh the same)."""

    of: tuple[int, ...]
    members: tuple[tuple[int, ...], ...]
    rep: tuple[LayerParts, ...]

    @classmethod
    def of_parts(cls, parts: list[LayerParts]) -> LayerClasses:
        keys: dict[tuple[int, ...], int] = {}
        of = tuple(keys.setdefault(alike_key(p), len(keys)) for p in parts)
        members = tuple(tuple(i for i, c in enumerate(of) if c == k) for k in range(len(keys)))
        return cls(of, members, tuple(parts[m[0]] for m in members))

    @property
    def size(self) -> list[int]:
        """Layers per class."""
        return [len(m) for m in self.members]


def unkept_layers(
    dense: list[str], names: list[str], members: tuple[tuple[int, ...], ...],
    keep: dict[tuple[int, int], int], sol: np.ndarray,
) -> list[int]:
    """The layers that lose what `keep` counts (their FFN group, their experts) to the
    CPU in a solved program: of class c's layers (`members[c]`, in layer order) on
    accelerator d ≥ 1, all but the last round(sol[keep[(d, c)]]); none where `keep`
    has no (d, c). Both formulations decode their answer through here."""
    out: list[int] = []
    for d in range(1, len(names)):
        for c, mem in enumerate(members):
            if (d, c) in keep:
                on = [i for i in mem if dense[i] == names[d]]
                out += on[: len(on) - round(sol[keep[(d, c)]])]
    return out


def head_and_disk(
    names: list[str], head: dict[int, int], disk: int, sol: np.ndarray, allow_disk: bool,
) -> tuple[str, int]:
    """A solved program's output-head device (the one whose `head` binary is set, else
    the CPU) and the bytes its `disk` column leaves on disk (0 unless `allow_disk`)."""
    on = next((names[d] for d, j in head.items() if sol[j] > 0.5), "CPU")
    return on, max(0, int(np.ceil(sol[disk] - 1e-6))) if allow_disk else 0


def in_ram(
    on: Callable[[int, int], dict[int, float]], k: int, c: int, size: int
) -> tuple[dict[int, float], float]:
    """(coefficients, constant) of 'layers of class c (of `size`) with a group in RAM':
    size − Σ_{d>0} on(d, c), where on(d, c) is the linear form of those on device d."""
    row: dict[int, float] = {}
    for d in range(1, k):
        for j, a in on(d, c).items():
            add(row, j, -a)
    return row, float(size)


def stream_room_rows(
    m: Program, facts: ModelFacts, machine: Machine, total: dict[int, float],
    weights: dict[int, float], const: float, const_w: float, s: int,
    head_off: Iterable[int] = (),
) -> None:
    """A plan with weights on disk (`s` > 0) keeps, besides its weights, its anonymous
    bytes and the room to stream (footprint.stream_room) in RAM: optimize.fits's rule,
    stated here so that the solver's optimum is one fits accepts. `total` is the CPU's
    bytes (weights, with `s` taken off, and the rest), `weights` the CPU weights' part
    of it and `const`/`const_w` their constants; `head_off` the binaries that put the
    output head on an accelerator (the room is then the blocks' alone). A binary z says
    whether disk is used; a continuous v <= z, Σ head_off is their AND, which the
    solver raises to 1 when both are (it only loosens the row)."""
    z = m.var(0.0, 1.0)
    m.row({s: 1.0, z: -float(facts.spec.tensor_bytes)}, hi=0.0)
    anon = {j: a for j, a in total.items() if j != s}
    for j, a in weights.items():
        add(anon, j, -a)
    room = stream_room(facts)
    add(anon, z, float(room))
    off = list(head_off)
    saved = room - stream_room(facts, head_on_cpu=False)
    if off and saved > 0:
        v = m.var(integer=False)
        m.row({v: 1.0, z: -1.0}, hi=0.0)
        m.row({v: 1.0, **{j: -1.0 for j in off}}, hi=0.0)
        add(anon, v, -float(saved))
    m.bytes_row(anon, machine.cpu.memory_bytes - (const - const_w))


def head_work(
    wh: Work, heads: dict[int, int], d: int, mem: dict[int, float], comp: dict[int, float]
) -> tuple[float, float]:
    """The output head's work `wh` on device d into its (memory, compute) rows: h[d] on
    an accelerator; on the CPU 1 − Σ h, whose constant part is returned."""
    if d:
        add(mem, heads[d], wh.mem)
        add(comp, heads[d], wh.comp)
        return 0.0, 0.0
    for j in heads.values():
        add(mem, j, -wh.mem)
        add(comp, j, -wh.comp)
    return wh.mem, wh.comp


def epigraph(
    m: Program, mem: dict[int, float], comp: dict[int, float], cm: float, cc: float
) -> None:
    """One device's time in the objective: t ≥ memory seconds, t ≥ compute seconds
    (perf.py's roofline is the max of the two), each a linear form plus a constant."""
    tv = m.var(0.0, np.inf, cost=1.0, integer=False)
    for row, c in ((mem, cm), (comp, cc)):
        r = {j: -a for j, a in row.items()}
        add(r, tv, 1.0)
        m.row(r, lo=c)


def cpu_memory_rows(
    m: Program, facts: ModelFacts, machine: Machine, ctx: ContextSettings,
    w: dict[int, float], const_w: float, kv: dict[int, float], u0: int, heads: list[int],
    s: int, allow_disk: bool,
) -> None:
    """The CPU's memory rows of a placement program: `w` + `const_w` its layers' weights
    (linear, and their constant part), `kv` its KV's coefficients, `u0` whether it holds
    a layer, `heads` the binaries putting the output head on an accelerator, `s` the
    bytes left on disk. Adds what `footprint.estimate` charges besides: the tensors
    outside the blocks, the head when on the CPU (1 − Σ heads), the compute buffer with
    or without layers and head, the logits, the overhead; within RAM less `s`, with the
    streaming room when disk is allowed, and `s` only out of the CPU's weights."""
    terms = compute_terms(facts, ctx)
    lp, out = device_compute(terms, True, False), device_compute(terms, False, True)
    both = device_compute(terms, True, True)
    head, _ = output_head(facts)
    embd = facts.tensor_bytes("token_embd.")
    tied = not facts.has_output_tensor
    nonlayer = sum(t.n_bytes for t in facts.tensors if t.layer < 0)
    other = max(nonlayer - embd - head + (embd if tied else 0), 0)
    own_head = head - (embd if tied else 0)  # a tied head's matrix is token_embd's
    w = dict(w)
    const_w += float(other + embd + own_head)
    for j in heads:
        add(w, j, -own_head)
    total = dict(w)
    for j, a in kv.items():
        add(total, j, a)
    const = const_w + output_buffer_bytes(facts, ctx) + process_overhead(facts)
    if not machine.accelerators:
        const += both
    else:  # u0·LP + h0·OUT − both_used·(LP + OUT − BOTH), both_used ≤ u0, h0
        both_used = m.var(integer=False)
        m.row({both_used: 1.0, u0: -1.0}, hi=0.0)
        m.row({both_used: 1.0, **dict.fromkeys(heads, 1.0)}, hi=1.0)
        add(total, u0, lp)
        const += out
        for j in heads:
            add(total, j, -out)
        add(total, both_used, -(lp + out - both))
    add(total, s, -1.0)
    m.bytes_row(total, machine.cpu.memory_bytes - const)
    if allow_disk:
        stream_room_rows(m, facts, machine, total, w, const, const_w, s, heads)
    cap = {j: -a for j, a in w.items()}  # disk bytes only come out of the CPU's weights
    add(cap, s, 1.0)
    m.bytes_row(cap, const_w)
