"""The placement program over counts of alike layers, contiguity by branch and bound.

Alike layers (`optimize_rows.LayerClasses`: the same bytes, parameters and KV) are
interchangeable for every cost and budget of `optimize_milp`'s program, which is linear
in the per-layer decisions with the same coefficients for each. A placement is then
described by counts: N[d,c] layers of class c on device d, of those F[d,c] keeping
their FFN group and E[d,c] ≤ F[d,c] their routed experts on a local accelerator, the
head's device and the bytes left on disk.

With one class (most dense and MoE models) any counts are a contiguous placement:
blocks follow in device order. With several (Q4_K_M's heavier layers, sliding-window
layers) not every count vector is one: device d's block starts at layer
b_d = Σ_{d'<d} Σ_c N[d',c], and exactly P_c(b_d) layers of class c lie before it
(P_c: the class's prefix count). The program without that condition is a relaxation;
`best_placement_counts` searches over the boundaries by branch and bound. A node bounds
some b_d to [lo, hi] (with P_c(lo) ≤ S_{d,c} ≤ P_c(hi), S_{d,c} = Σ_{d'<d} N[d',c]); a
relaxed optimum whose every boundary is realizable is a placement of the node; else the
first unrealizable boundary, at b, splits the node three ways: below b, exactly b
(S_{d,·} = P(b)), above b. Nodes are searched best bound first and pruned by the best
placement found, so the answer is the optimum.

Why counts: the per-layer program has the same LP bound but branches on single layers'
binaries. On a 100-layer MoE over 4 GPUs it took 1.0 s where the counts took 11 ms
(alike layers), and 3-10 s where Q4_K_M's mix made two classes (the search: 0.09-2 s).
"""

from __future__ import annotations

import heapq
import itertools
import time
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from inferenceos.plan import optimize_rows as rows
from inferenceos.plan.footprint import head_fits, layer_and_head_compute
from inferenceos.plan.memory import compute_terms
from inferenceos.plan.optimize_rows import LayerClasses, Problem, Program, add
from inferenceos.plan.optimize_terms import Terms, Work
from inferenceos.plan.placement import Placement, build_placement, output_head

GAP = 1e-7  # a node within this share of the best placement found cannot beat it
MAX_NODES = 200  # past this many programs the search gives way (optimize.solve_context)
# HiGHS's presolve on these small programs (~60 columns) mostly costs more than it
# saves: without it a Q4_K_M-like 100-layer MoE over 4 GPUs planned in 91 ms where it
# took 323 (a 32-layer one over two GPUs 99 against 161). But presolve is where HiGHS
# finds symmetry, and a 70B-shaped one over four like GPUs at 32k tokens then took
# 6,491 nodes (1.9 s) where presolve solved it in 0.44 s. So a program gets QUICK_S
# seconds without presolve and, if that does not prove its optimum, the rest with it.
QUICK_S = 0.05

Bounds = dict[int, tuple[int, int]]  # device -> [lo, hi] of its block's first layer


@dataclass
class _Vars:
    """The variables of one node's program."""

    m: Program
    cnt: list[list[int]]  # [device][class]
    u: list[int]
    fc: dict[tuple[int, int], int]  # (device, class): layers keeping their FFN group
    ex: dict[tuple[int, int], int]  # (device, class): layers keeping their experts
    h: dict[int, int]
    s: int
    # per class, its movable groups: (name, device -> linear form of its layers keeping
    # the group there, bytes); the CPU's form (d = 0) is the class's size less the rest
    groups: list[list[tuple[str, dict[int, dict[int, float]], int]]] = field(
        default_factory=list)


class _Counts:
    """The count program of one (facts, machine, ctx, terms), built per node."""

    def __init__(self, p: Problem) -> None:
        self.facts, self.machine, self.ctx, self.parts = p.facts, p.machine, p.ctx, p.parts
        self.terms, self.allow_disk, self.margin = p.terms, p.allow_disk, p.margin
        self.devs = list(p.machine.devices)
        self.local = [not d.is_remote for d in self.devs]
        self.budgets = rows.device_budgets(p.machine)
        classes = LayerClasses.of_parts(p.parts)
        self.cls, self.rep, self.size = classes.of, classes.rep, classes.size
        self.members = classes.members
        self.n_cls = len(self.rep)
        # prefix[c][b]: layers of class c among the first b
        self.prefix = [list(itertools.accumulate((int(x == c) for x in self.cls), initial=0))
                       for c in range(self.n_cls)]

    # -- the program ---------------------------------------------------------------------

    def build(self, bounds: Bounds, presolve: bool = True) -> _Vars:
        """The program of the node `bounds` (see the module docstring)."""
        m = Program(margin=self.margin, presolve=presolve)
        k = len(self.devs)
        cnt = [[m.var(0, self.size[c] if d == 0 or self.budgets[self.devs[d].name] > 0
                      else 0) for c in range(self.n_cls)] for d in range(k)]
        acc = [(d, c) for d in range(1, k) if self.local[d] for c in range(self.n_cls)]
        v = _Vars(
            m, cnt, [m.var() for _ in range(k)],
            {(d, c): m.var(0, self.size[c]) for d, c in acc if self.rep[c].ffn_bytes},
            {(d, c): m.var(0, self.size[c]) for d, c in acc if self.rep[c].expert_bytes},
            {d: m.var(0, float(head_fits(self.facts, self.devs[d]))) for d in range(1, k)},
            m.var(0.0, float(self.facts.spec.tensor_bytes) if self.allow_disk else 0.0,
                  integer=False))
        v.groups = [self._groups(v, c) for c in range(self.n_cls)]
        self._assignment(v)
        self._bounds(v, bounds)
        self._memory(v)
        for t in self.terms:
            self._time(v, t)
        rows.disk_cost(m, v.s, self.terms)
        self._links(v)
        return v

    def solve(self, bounds: Bounds, left: float) -> tuple[_Vars, np.ndarray | None]:
        """The node's program solved within `left` seconds: with several classes first
        without HiGHS's presolve for up to QUICK_S, then, if that did not prove its
        optimum, with it (see QUICK_S)."""
        quick = QUICK_S if self.n_cls > 1 else 0.0  # one class: no search, presolve pays
        if quick:
            v = self.build(bounds, presolve=False)
            sol = v.m.solve(min(left, quick))
            if v.m.proven or left <= quick:
                return v, sol
        v = self.build(bounds, presolve=True)
        return v, v.m.solve(left - quick)

    def _assignment(self, v: _Vars) -> None:
        """Every layer of a class somewhere; u[d] whether d holds one; what a device
        keeps of a class within what it holds; the head on the last used device."""
        m, cnt, k, n = v.m, v.cnt, len(self.devs), len(self.parts)
        for c in range(self.n_cls):
            m.row({cnt[d][c]: 1.0 for d in range(k)}, self.size[c], self.size[c])
        for d in range(k):
            m.row({**dict.fromkeys(cnt[d], 1.0), v.u[d]: -float(n)}, hi=0.0)
            m.row({**dict.fromkeys(cnt[d], 1.0), v.u[d]: -1.0}, lo=0.0)
            for c in range(self.n_cls):  # per class: a tighter LP than the sum's n
                m.row({cnt[d][c]: 1.0, v.u[d]: -float(self.most(d, c))}, hi=0.0)
        for (d, c), j in v.fc.items():
            m.row({j: 1.0, cnt[d][c]: -1.0}, hi=0.0)
        for (d, c), j in v.ex.items():  # experts only beside their FFN group's router
            m.row({j: 1.0, v.fc.get((d, c), cnt[d][c]): -1.0}, hi=0.0)
        for d, j in v.h.items():  # the last used device holds the last layer
            m.row({j: 1.0, v.u[d]: -1.0}, hi=0.0)
            for d2 in range(d + 1, k):
                m.row({j: 1.0, v.u[d2]: 1.0}, hi=1.0)
        if v.h:
            m.row(dict.fromkeys(v.h.values(), 1.0), hi=1.0)

    def most(self, d: int, c: int) -> int:
        """The most layers of class c device d can hold: on an accelerator no more
        than its budget over their attention and KV (what they keep there at least)."""
        if d == 0:
            return self.size[c]
        p = self.rep[c]
        least = max(p.attention_bytes + p.kv_bytes, 1)
        return min(self.size[c], self.budgets[self.devs[d].name] // least)

    def _bounds(self, v: _Vars, bounds: Bounds) -> None:
        """Device d's block starts at b_d within [lo, hi] (all layers where the node
        does not say), and its prefix counts S_{d,c} lie in the convex hull of the
        points (b, P_c(b)) for b in [lo, hi]: every realizable placement of the node
        satisfies the hull's facets, and they keep the relaxation close to one (a
        Q4_K_M mix has every third layer heavier: S ≈ b / 3)."""
        if self.n_cls == 1:
            return  # any counts are a placement
        for d in range(1, len(self.devs)):
            lo, hi = bounds.get(d, (0, len(self.parts)))
            b = {v.cnt[d2][c]: 1.0 for d2 in range(d) for c in range(self.n_cls)}
            v.m.row(b, float(lo), float(hi))
            for c in range(self.n_cls):
                pts = [(x, self.prefix[c][x]) for x in range(lo, hi + 1)]
                for a0, a1, sign in _hull_facets(pts):
                    # sign · (S − a0 − a1·b) ≥ 0
                    row = {v.cnt[d2][c]: sign for d2 in range(d)}
                    for j in b:
                        add(row, j, -sign * a1)
                    v.m.row(row, lo=sign * a0)

    def ffn_on(self, v: _Vars, d: int, c: int) -> dict[int, float]:
        """Layers of class c with their FFN group on device d > 0."""
        j = v.fc.get((d, c))
        return {j: 1.0} if j is not None else {v.cnt[d][c]: 1.0}

    def expert_on(self, v: _Vars, d: int, c: int) -> dict[int, float]:
        """Layers of class c with their experts on device d > 0."""
        if self.local[d]:
            j = v.ex.get((d, c))
            return {j: 1.0} if j is not None else {}
        return {v.cnt[d][c]: 1.0}

    def _groups(self, v: _Vars, c: int) -> list[tuple[str, dict[int, dict[int, float]], int]]:
        """(group, device -> its linear form, bytes) of class c's movable groups (see
        `_Vars.groups`; the CPU's constant, the class's size, is the callers')."""
        p, k = self.rep[c], len(self.devs)
        out = []
        for name, on, size in (("ffn", self.ffn_on, p.ffn_bytes),
                               ("experts", self.expert_on, p.expert_bytes)):
            if not size:
                continue
            forms = {d: on(v, d, c) for d in range(1, k)}
            forms[0], _ = rows.in_ram(partial(_form, forms), k, c, self.size[c])
            out.append((name, forms, size))
        return out

    def _memory(self, v: _Vars) -> None:
        facts, ctx, m = self.facts, self.ctx, v.m
        terms = compute_terms(facts, ctx)
        head, _ = output_head(facts)
        for d in range(1, len(self.devs)):
            lp, both = layer_and_head_compute(terms, self.devs[d])
            row: dict[int, float] = {}
            for c, p in enumerate(self.rep):
                add(row, v.cnt[d][c], float(p.attention_bytes + p.kv_bytes))
                for _, forms, size in v.groups[c]:
                    for j, a in forms[d].items():
                        add(row, j, a * size)
            add(row, v.h[d], head + (both - lp))
            add(row, v.u[d], lp)
            m.bytes_row(row, self.budgets[self.devs[d].name])
        self._cpu_memory(v)

    def _cpu_memory(self, v: _Vars) -> None:
        """The CPU's rows (`optimize_rows.cpu_memory_rows`) over the counts."""
        w: dict[int, float] = {}
        const_w = 0.0
        for c, p in enumerate(self.rep):
            add(w, v.cnt[0][c], float(p.attention_bytes))
            for _, forms, size in v.groups[c]:
                for j, a in forms[0].items():
                    add(w, j, a * size)
                const_w += self.size[c] * size
        kv = {v.cnt[0][c]: float(p.kv_bytes) for c, p in enumerate(self.rep)}
        rows.cpu_memory_rows(v.m, self.facts, self.machine, self.ctx, w, const_w, kv, v.u[0],
                        list(v.h.values()), v.s, self.allow_disk)

    def _time(self, v: _Vars, t: Terms) -> None:
        works = {"ffn": t.ffn, "experts": t.experts}
        for d, dev in enumerate(self.devs):
            mem: dict[int, float] = {}
            comp: dict[int, float] = {}
            cm = cc = 0.0  # constants: the groups in RAM are the class size less the rest
            for c, p in enumerate(self.rep):
                wk = t.attention(dev, p)
                add(mem, v.cnt[d][c], wk.mem)
                add(comp, v.cnt[d][c], wk.comp)
                for name, forms, _ in v.groups[c]:
                    we: Work = works[name](dev, p)
                    for j, a in forms[d].items():
                        add(mem, j, a * we.mem)
                        add(comp, j, a * we.comp)
                    if d == 0:
                        cm, cc = cm + self.size[c] * we.mem, cc + self.size[c] * we.comp
            hm, hc = rows.head_work(t.head(dev), v.h, d, mem, comp)
            rows.epigraph(v.m, mem, comp, cm + hm, cc + hc)

    def _links(self, v: _Vars) -> None:
        m, k, u = v.m, len(self.devs), v.u
        cross = sum(t.crossing() for t in self.terms)
        for d in range(k):
            for d2 in range(d + 1, k):
                if self.local[d] and self.local[d2]:
                    a = m.var(0.0, np.inf, cost=cross, integer=False)
                    row = {a: 1.0, u[d]: -1.0, u[d2]: -1.0}
                    for j in range(d + 1, d2):
                        add(row, u[j], 1.0)
                    m.row(row, lo=-1.0)
        for d in range(1, k):
            if not self.local[d]:
                for t in self.terms:
                    used, per_layer, head = t.rpc(self.devs[d])
                    m.c[u[d]] += used
                    m.c[v.h[d]] += head
                    for j in v.cnt[d]:
                        m.c[j] += per_layer
                continue
            oh = m.var(0.0, np.inf, cost=cross, integer=False)
            row = {oh: 1.0, u[d]: -1.0, **dict.fromkeys(v.h.values(), 1.0)}
            for d2 in range(d + 1, k):
                add(row, u[d2], 1.0)
            m.row(row, lo=0.0)
        # an offloaded layer whose FFN side is in RAM crosses there and back: 2(N − E)
        # where the class has experts (E ≤ F), else 2(N − F); the merge keeps E
        for (d, c), j in {**v.fc, **v.ex}.items():
            m.c[v.cnt[d][c]] += 2 * cross
            m.c[j] -= 2 * cross

    # -- a node's answer -----------------------------------------------------------------

    def counts(self, v: _Vars, sol: np.ndarray) -> list[list[int]]:
        return [[round(sol[j]) for j in row] for row in v.cnt]

    def unrealizable(self, cnt: list[list[int]]) -> tuple[int, int] | None:
        """(device, its block's first layer) of the first boundary no contiguous
        placement has with these counts; None when every one is realizable."""
        before = [0] * self.n_cls
        for d in range(1, len(self.devs)):
            before = [b + x for b, x in zip(before, cnt[d - 1], strict=True)]
            start = sum(before)
            if any(before[c] != self.prefix[c][start] for c in range(self.n_cls)):
                return d, start
        return None

    def decode(self, v: _Vars, sol: np.ndarray) -> Placement:
        """The placement of a realizable answer: blocks in device order; of a block's
        layers of class c the last F keep their FFN group, the last E their experts."""
        cnt, names = self.counts(v, sol), [d.name for d in self.devs]
        dense = [names[d] for d in range(len(self.devs)) for _ in range(sum(cnt[d]))]
        ffn = list(dense)
        experts: list[str | None] = [
            dense[i] if p.expert_bytes else None for i, p in enumerate(self.parts)]
        for i in rows.unkept_layers(dense, names, self.members, v.fc, sol):
            ffn[i] = "CPU"
        for i in rows.unkept_layers(dense, names, self.members, v.ex, sol):
            experts[i] = "CPU"
        head, disk = rows.head_and_disk(names, v.h, v.s, sol, self.allow_disk)
        return build_placement(self.facts, self.parts, dense, experts, head, disk, ffn)


def best_placement_counts(p: Problem, time_limit: float = 10.0) -> Placement | None:
    """`optimize_milp.best_placement`'s optimum, over counts (see the module docstring).
    None: nothing fits. Raises `SearchTooLong` past MAX_NODES programs or `time_limit`
    seconds in all."""
    prog = _Counts(p)
    best: tuple[float, Placement] | None = None
    queue: list[tuple[float, int, Bounds]] = [(-np.inf, 0, {})]
    order = itertools.count(1)
    deadline = time.monotonic() + time_limit
    for _ in range(MAX_NODES):
        if not queue:
            return best[1] if best else None
        bound, _, bounds = heapq.heappop(queue)
        if best is not None and bound >= best[0] * (1 - GAP):
            return best[1]  # best first: no node left can beat it
        left = deadline - time.monotonic()
        if left <= 0:
            break
        v, sol = prog.solve(bounds, left)
        if sol is None:
            continue
        obj = float(np.dot(v.m.c, sol))
        if best is not None and obj >= best[0] * (1 - GAP):
            continue
        split = prog.unrealizable(prog.counts(v, sol))
        if split is None:
            best = (obj, prog.decode(v, sol))
            continue
        d, at = split
        lo, hi = bounds.get(d, (0, len(p.parts)))
        # the hull of [lo, at] passes through (at, P(at)): this answer is in neither
        for part in ((lo, at), (at + 1, hi)):
            if part[0] <= part[1]:
                heapq.heappush(queue, (obj, next(order), {**bounds, d: part}))
    raise SearchTooLong(f"more than {MAX_NODES} programs or {time_limit:g} s")


def _form(forms: dict[int, dict[int, float]], d: int, _c: int) -> dict[int, float]:
    return forms[d]


def _hull_facets(pts: list[tuple[int, int]]) -> list[tuple[float, float, float]]:
    """The facets of the convex hull of `pts` (x rising, y a step function of it), as
    (a0, a1, sign): sign · (y − a0 − a1·x) ≥ 0 (sign 1: a lower facet, -1: an upper)."""
    out: list[tuple[float, float, float]] = []
    for sign in (1.0, -1.0):
        chain: list[tuple[int, int]] = []
        for p in pts:  # Andrew's monotone chain: the lower hull (sign 1) or the upper
            while len(chain) >= 2 and sign * _cross(chain[-2], chain[-1], p) <= 0:
                chain.pop()
            chain.append(p)
        for (x0, y0), (x1, y1) in itertools.pairwise(chain):
            slope = (y1 - y0) / (x1 - x0)
            out.append((y0 - slope * x0, slope, sign))
    return out


def _cross(o: tuple[int, int], a: tuple[int, int], b: tuple[int, int]) -> int:
    return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])


class SearchTooLong(RuntimeError):
    """The boundary search ran past its node budget (the caller takes the per-layer
    program instead)."""
