"""Flash attention as a plan decision (plan/flash_attn.py): off for served conversations
on the CPU alone, on everywhere else, and never bought with quality."""

from __future__ import annotations

from inferenceos.plan.entry import LoadRequest, plan_load
from plan_factories import GiB, machine, make_facts

FACTS = make_facts(n_layer=4, n_embd=512, n_ff=1024, n_head=8, n_head_kv=8, n_vocab=1000)


def _fa(req: LoadRequest, ram: float = 32 * GiB, gpus: tuple[float, ...] = ()) -> bool:
    return plan_load(FACTS, machine(ram=ram, gpus=gpus), req).ctx.flash_attn


def test_served_conversations_on_the_cpu_plan_without_it() -> None:
    assert _fa(LoadRequest(n_ctx=4096)) is True  # run's one prompt: llama.cpp's auto
    plan = plan_load(FACTS, machine(), LoadRequest(n_ctx=4096, cached_turns=True))
    assert plan.ctx.flash_attn is False
    assert plan.params().flash_attn == 0  # what the engine loads


def test_without_it_the_cpu_ubatch_is_at_most_256() -> None:
    """K·Q of a whole ubatch goes through memory without flash attention: the plan
    halves the ubatch it would take with it (microbatch.MAX_UBATCH_WITHOUT_FA)."""
    on = plan_load(FACTS, machine(), LoadRequest(n_ctx=4096))
    off = plan_load(FACTS, machine(), LoadRequest(n_ctx=4096, cached_turns=True))
    assert on.ctx.n_ubatch == 512 and off.ctx.n_ubatch == 256
    assert off.ctx.n_batch == 512  # one llama_decode still takes 512 tokens


def test_it_stays_on_with_an_accelerator_or_a_quantized_v_cache() -> None:
    assert _fa(LoadRequest(n_ctx=4096, cached_turns=True), gpus=(8 * GiB,)) is True
    assert _fa(LoadRequest(n_ctx=4096, cached_turns=True, type_k="q8_0",
                           type_v="q8_0")) is True


def test_it_stays_on_for_several_sequences_in_one_pool() -> None:
    """Without it each row computes K·Q over every sequence's cells in the shared pool;
    llama.cpp's CPU flash attention skips the masked-out ones (serve's slots)."""
    assert _fa(LoadRequest(n_ctx=4096, cached_turns=True, n_seq=1)) is False
    assert _fa(LoadRequest(n_ctx=1024, cached_turns=True, n_seq=4)) is True


def test_what_the_caller_asks_wins() -> None:
    assert _fa(LoadRequest(n_ctx=4096, cached_turns=True, flash_attn=True)) is True
    assert _fa(LoadRequest(n_ctx=4096, flash_attn=False)) is False


def _keeps(n_ctx: int, ram: float, fa: bool) -> bool:
    p = plan_load(FACTS, machine(ram=ram), LoadRequest(n_ctx=n_ctx, flash_attn=fa))
    return p.ctx.type_k == p.ctx.type_v == "f16" and not p.disk_bound


def _least_ram(n_ctx: int, fa: bool) -> float:
    """The least RAM (to 1 MiB) at which the plan keeps f16 at `n_ctx` in memory."""
    lo, hi = 0.0, 64.0 * GiB
    while hi - lo > 2**20:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if _keeps(n_ctx, mid, fa) else (mid, hi)
    return hi


def test_no_quality_is_given_up_for_it() -> None:
    """RAM that holds the asked context at f16 with flash attention but not the K·Q
    scratch without it, even at the smallest ubatch: the plan keeps the context and f16
    and turns it on, where without the fallback it would have quantized the KV cache."""
    n_ctx = 32768
    with_fa, without = _least_ram(n_ctx, True), _least_ram(n_ctx, False)
    assert without > with_fa + 8 * 2**20, (with_fa, without)  # K·Q at ubatch 32: 32 MiB
    ram = (with_fa + without) / 2
    assert not _keeps(n_ctx, ram, False)  # without it, something would be given up
    plan = plan_load(FACTS, machine(ram=ram), LoadRequest(n_ctx=n_ctx, cached_turns=True))
    assert plan.ctx.flash_attn is True
    assert plan.ctx.n_ctx == n_ctx and plan.ctx.type_k == plan.ctx.type_v == "f16"
    assert not plan.disk_bound
