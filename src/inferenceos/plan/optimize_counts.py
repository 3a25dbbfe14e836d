"""The placement MILP when every layer is alike: counts per device instead of x[d,i].

When all layers have the same bytes, parameters and KV (most dense and MoE models
without sliding windows), a contiguous placement is fully described by how many layers
each device takes (blocks follow in device order), how many of those keep their FFN
group and how many their routed experts on the device (experts only with their FFN
group), and where the head is. The per-layer program of
`optimize_milp` is then full of symmetric solutions (any layer could be the one whose
experts move) that HiGHS explores one by one: 100 layers over 4 GPUs ran into its time
limit. This formulation has ~5 integer variables per device and the same optimum: the
costs and memory of `optimize_milp` are linear in the per-layer decisions, and identical
layers make them linear in the counts with the same coefficients.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from inferenceos.plan.devices import Device, Machine
from inferenceos.plan.footprint import device_compute
from inferenceos.plan.memory import (
    ContextSettings,
    compute_terms,
    output_buffer_bytes,
    process_overhead,
)
from inferenceos.plan.model_facts import ModelFacts
from inferenceos.plan.optimize_milp import (
    _add,
    _Model,
    device_budgets,
    disk_cost,
    stream_room_rows,
)
from inferenceos.plan.optimize_terms import Terms, Work
from inferenceos.plan.placement import LayerParts, Placement, build_placement, output_head


def uniform(parts: list[LayerParts]) -> bool:
    """Whether every layer has the same bytes, parameters and KV."""
    key = [(p.dense_bytes, p.expert_bytes, p.dense_params, p.expert_params, p.kv_bytes,
            p.ffn_bytes, p.ffn_params) for p in parts]
    return len(set(key)) <= 1


def best_placement_counts(
    facts: ModelFacts,
    machine: Machine,
    ctx: ContextSettings,
    parts: list[LayerParts],
    terms: tuple[Terms, ...],
    allow_disk: bool = False,
    time_limit: float = 10.0,
    margin: float = 0.0,
) -> Placement | None:
    """`optimize_milp.best_placement` for `uniform(parts)` models (None: nothing fits)."""
    devs, n, p = list(machine.devices), len(parts), parts[0]
    k, m = len(devs), _Model(margin=margin)
    budgets = device_budgets(machine)
    local = [not d.is_remote for d in devs]
    cnt = [m.var(0, n if d == 0 or budgets[devs[d].name] > 0 else 0) for d in range(k)]
    u = [m.var() for _ in range(k)]
    moe = p.expert_bytes > 0
    ex = {d: m.var(0, n) for d in range(1, k) if local[d] and moe}
    fc = {d: m.var(0, n) for d in range(1, k) if local[d] and p.ffn_bytes}
    h = {d: m.var() for d in range(1, k)}
    s = m.var(0.0, float(facts.spec.tensor_bytes) if allow_disk else 0.0, integer=False)
    m.row(dict.fromkeys(cnt, 1.0), n, n)
    for d in range(k):
        m.row({cnt[d]: 1.0, u[d]: -float(n)}, hi=0.0)
        m.row({cnt[d]: 1.0, u[d]: -1.0}, lo=0.0)
    for d, j in fc.items():
        m.row({j: 1.0, cnt[d]: -1.0}, hi=0.0)
    for d, j in ex.items():  # experts only on a device with their layer's FFN group
        m.row({j: 1.0, fc.get(d, cnt[d]): -1.0}, hi=0.0)
    for d, j in h.items():
        m.row({j: 1.0, u[d]: -1.0}, hi=0.0)
        for d2 in range(d + 1, k):
            m.row({j: 1.0, u[d2]: 1.0}, hi=1.0)
    if h:
        m.row(dict.fromkeys(h.values(), 1.0), hi=1.0)

    def on_dev(d: int) -> dict[int, float]:  # layers whose experts are on device d > 0
        return ({ex[d]: 1.0} if d in ex else {}) if local[d] else {cnt[d]: 1.0}

    def ffn_dev(d: int) -> dict[int, float]:  # layers whose FFN group is on device d > 0
        return {fc[d]: 1.0} if d in fc else {cnt[d]: 1.0}

    groups = [(t_ffn, ffn_dev, _in_ram(ffn_dev, k, n), p.ffn_bytes)]
    if moe:
        groups.append((t_experts, on_dev, _in_ram(on_dev, k, n), p.expert_bytes))
    _memory(m, facts, machine, ctx, p, cnt, u, h, s, groups, budgets, devs)
    for t in terms:
        _time(m, t, p, cnt, h, devs, groups)
    disk_cost(m, s, terms)
    _links(m, terms, cnt, u, h, {**fc, **ex}, local, devs)
    sol = m.solve(time_limit)
    if sol is None:
        return None
    return _decode(facts, parts, devs, sol, cnt, ex, fc, h, s, local, allow_disk)


def t_ffn(t: Terms, dev: Device, p: LayerParts) -> Work:
    return t.ffn(dev, p)


def t_experts(t: Terms, dev: Device, p: LayerParts) -> Work:
    return t.experts(dev, p)


def _in_ram(
    on_dev: Callable[[int], dict[int, float]], k: int, n: int
) -> Callable[[], tuple[dict[int, float], float]]:
    """(coefficients, constant) of 'layers whose group is in RAM': n − Σ_{d>0} on_dev(d)."""
    def on_cpu() -> tuple[dict[int, float], float]:
        row: dict[int, float] = {}
        for d in range(1, k):
            for j, a in on_dev(d).items():
                _add(row, j, -a)
        return row, float(n)
    return on_cpu


def _memory(m, facts, machine, ctx, p, cnt, u, h, s, groups, budgets, devs):  # type: ignore[no-untyped-def]
    terms = compute_terms(facts, ctx)
    lp, out = device_compute(terms, True, False), device_compute(terms, False, True)
    both = device_compute(terms, True, True)
    head, _ = output_head(facts)
    for d in range(1, len(devs)):
        row = {cnt[d]: float(p.attention_bytes + p.kv_bytes)}
        for _, on_dev, _, size in groups:
            for j, a in on_dev(d).items():
                _add(row, j, a * size)
        _add(row, h[d], head + (both - lp))
        _add(row, u[d], lp)
        m.bytes_row(row, budgets[devs[d].name])
    embd = facts.tensor_bytes("token_embd.")
    tied = not facts.has_output_tensor
    nonlayer = sum(t.n_bytes for t in facts.tensors if t.layer < 0)
    other = max(nonlayer - embd - head + (embd if tied else 0), 0)
    own_head = head - (embd if tied else 0)
    w: dict[int, float] = {cnt[0]: float(p.attention_bytes)}
    const_w = float(other + embd + own_head)
    for j in h.values():
        _add(w, j, -own_head)
    for _, _, on_cpu, size in groups:
        row, c = on_cpu()
        for j, a in row.items():
            _add(w, j, a * size)
        const_w += c * size
    total = dict(w)
    _add(total, cnt[0], p.kv_bytes)
    const = const_w + output_buffer_bytes(facts, ctx) + process_overhead(facts)
    if len(devs) == 1:
        const += both
    else:
        bu = m.var(integer=False)
        m.row({bu: 1.0, u[0]: -1.0}, hi=0.0)
        m.row({bu: 1.0, **dict.fromkeys(h.values(), 1.0)}, hi=1.0)
        _add(total, u[0], lp)
        const += out
        for j in h.values():
            _add(total, j, -out)
        _add(total, bu, -(lp + out - both))
    _add(total, s, -1.0)
    m.bytes_row(total, machine.cpu.memory_bytes - const)
    if m.ub[s] > 0:  # disk allowed
        stream_room_rows(m, facts, machine, total, w, const, const_w, s, h.values())
    cap = {j: -a for j, a in w.items()}
    _add(cap, s, 1.0)
    m.bytes_row(cap, const_w)


def _time(m, t, p, cnt, h, devs, groups):  # type: ignore[no-untyped-def]
    for d, dev in enumerate(devs):
        wk, wh = t.attention(dev, p), t.head(dev)
        mem, comp = {cnt[d]: wk.mem}, {cnt[d]: wk.comp}
        cm = cc = 0.0
        for work, on_dev, on_cpu, size in groups:
            if not size:
                continue
            we = work(t, dev, p)
            row, c = on_cpu() if d == 0 else (on_dev(d), 0.0)
            for j, a in row.items():
                _add(mem, j, a * we.mem)
                _add(comp, j, a * we.comp)
            cm, cc = cm + c * we.mem, cc + c * we.comp
        if d == 0:
            cm, cc = cm + wh.mem, cc + wh.comp
            for j in h.values():
                _add(mem, j, -wh.mem)
                _add(comp, j, -wh.comp)
        else:
            _add(mem, h[d], wh.mem)
            _add(comp, h[d], wh.comp)
        tv = m.var(0.0, np.inf, cost=1.0, integer=False)
        for row, c in ((mem, cm), (comp, cc)):
            r = {j: -a for j, a in row.items()}
            _add(r, tv, 1.0)
            m.row(r, lo=c)


def _links(m, terms, cnt, u, h, kept, local, devs):  # type: ignore[no-untyped-def]
    """`kept`: per local accelerator, the count of its layers whose FFN side is all on
    it (experts' count on a MoE, else the FFN group's): the others cross twice."""
    k = len(devs)
    cross = sum(t.crossing() for t in terms)
    for d in range(k):
        for d2 in range(d + 1, k):
            if local[d] and local[d2]:
                a = m.var(0.0, np.inf, cost=cross, integer=False)
                row = {a: 1.0, u[d]: -1.0, u[d2]: -1.0}
                for j in range(d + 1, d2):
                    _add(row, u[j], 1.0)
                m.row(row, lo=-1.0)
    for d in range(1, k):
        if not local[d]:
            for t in terms:
                used, per_layer, head = t.rpc(devs[d])
                m.c[u[d]] += used
                m.c[h[d]] += head
                m.c[cnt[d]] += per_layer
            continue
        oh = m.var(0.0, np.inf, cost=cross, integer=False)
        row = {oh: 1.0, u[d]: -1.0, **dict.fromkeys(h.values(), 1.0)}
        for d2 in range(d + 1, k):
            _add(row, u[d2], 1.0)
        m.row(row, lo=0.0)
        if d in kept:  # an offloaded layer whose FFN side is in RAM crosses twice
            m.c[cnt[d]] += 2 * cross
            m.c[kept[d]] -= 2 * cross


def _decode(facts, parts, devs, sol, cnt, ex, fc, h, s, local, allow_disk):  # type: ignore[no-untyped-def]
    dense: list[str] = []
    experts: list[str | None] = []
    ffn: list[str] = []
    moe = parts[0].expert_bytes > 0
    for d, dev in enumerate(devs):
        c = round(sol[cnt[d]])
        keep = round(sol[ex[d]]) if d in ex else (c if d > 0 and not local[d] else 0)
        keep_f = round(sol[fc[d]]) if d in fc else c
        for j in range(c):
            # the block's last `keep_f` layers keep their FFN group on the device, the
            # last `keep` (<= keep_f) their experts too
            dense.append(dev.name)
            ffn.append(dev.name if j >= c - keep_f else "CPU")
            if moe:
                experts.append(dev.name if d > 0 and j >= c - keep else "CPU")
            else:
                experts.append(None)
    head = next((devs[d].name for d, j in h.items() if sol[j] > 0.5), "CPU")
    disk = max(0, int(np.ceil(sol[s] - 1e-6))) if allow_disk else 0
    return build_placement(facts, parts, dense, experts, head, disk, ffn)
