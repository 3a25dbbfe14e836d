"""The decode cost's growth with depth: on the CPU every query head reads the cache."""

from __future__ import annotations

import pytest

from inferenceos.plan.memory import ContextSettings
from inferenceos.plan.perf import Calibration, decode_cost
from inferenceos.plan.placement import place
from plan_factories import GiB, machine, make_facts

CTX = ContextSettings(n_ctx=8192, n_ubatch=512, flash_attn=True)
CAL = Calibration(cpu_bw_efficiency=0.5, gemv_gbps_per_thread=100.0)


def _growth(n_head_kv: int) -> float:
    """Seconds a decode step gains from depth 0 to 4096."""
    facts = make_facts(n_layer=8, n_embd=1024, n_ff=2048, n_head=16, n_head_kv=n_head_kv)
    m = machine(ram=32 * GiB, threads=2)
    pl = place(facts, m, CTX, {})
    return (decode_cost(facts, pl, m, CTX, 4096, CAL, 2).seconds
            - decode_cost(facts, pl, m, CTX, 0, CAL, 2).seconds)


def test_on_the_cpu_grouped_query_attention_costs_what_full_attention_does() -> None:
    """A 4x smaller cache (4 query heads per KV head) is read once per query head by
    llama.cpp's CPU attention: the step grows with depth as full attention's does."""
    assert _growth(4) == pytest.approx(_growth(16), rel=1e-6)
    assert _growth(4) > 0

