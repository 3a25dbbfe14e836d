"""The per-token costs outside the bytes (issue 44): each matrix-vector row's fixed part,
the weights a decode reads (not an untied embedding), a model held in the CPU's cache,
and our own per-token work beside llama.cpp's graph, which the llama.cpp probe does not
pay and a `run` does."""

from __future__ import annotations

from dataclasses import replace

import pytest

from inferenceos.hardware.profile import LlamaSpeed
from inferenceos.plan.calibration import PRIOR, probe_calibration
from inferenceos.plan.memory import ContextSettings
from inferenceos.plan.model_facts import ModelFacts
from inferenceos.plan.perf import (
    ARGMAX_S_PER_VOCAB,
    CACHE_SHARE,
    GEMV_ROW_BYTES,
    Calibration,
    decode_cost,
    decode_reads,
    engine_token_work,
    gemv_weight,
)
from inferenceos.plan.placement import place
from plan_factories import machine, make_facts

CTX = ContextSettings(n_ctx=1024, n_ubatch=512, flash_attn=True)


def _q8(facts: ModelFacts) -> ModelFacts:
    return replace(facts, tensors=tuple(replace(t, ggml_type="q8_0") for t in facts.tensors))


def _cost(facts: ModelFacts, cal: Calibration, threads: int = 2, engine: bool = True,
          bandwidth: float = 50.0) -> float:
    m = machine(threads=threads)
    m = replace(m, devices=(replace(m.cpu, bandwidth_gbps=bandwidth),))
    return decode_cost(facts, place(facts, m, CTX, {}), m, CTX, 200, cal, threads,
                       engine=engine).seconds


def test_a_decode_reads_every_layer_matrix_and_the_head_not_an_untied_embedding() -> None:
    facts = _q8(make_facts(n_layer=2, n_embd=512, n_ff=1024, n_head=8, n_head_kv=4,
                           n_vocab=50_000))
    rows, read, typed = decode_reads(facts)
    layer = [t for t in facts.tensors if t.layer >= 0]
    head = next(t for t in facts.tensors if t.name == "output.weight")
    assert rows == sum(t.rows for t in layer) + 50_000  # one row per vocabulary entry
    assert read == sum(t.n_bytes for t in layer) + head.n_bytes  # token_embd: one row
    assert typed == read  # all q8_0
    # a tied head (no output.weight) is the embedding, and it is read whole
    tied = replace(facts, tensors=tuple(t for t in facts.tensors if t.name != "output.weight"))
    embd = next(t for t in facts.tensors if t.name == "token_embd.weight")
    assert decode_reads(tied)[1] == sum(t.n_bytes for t in layer) + embd.n_bytes
    # an embedding of a slow type does not make the layers' kernels slower
    slow_embd = replace(facts, tensors=tuple(
        replace(t, ggml_type="q5_0") if t.name == "token_embd.weight" else t
        for t in facts.tensors))
    assert gemv_weight(slow_embd) == gemv_weight(facts)


def test_thin_rows_cost_more_than_their_bytes() -> None:
    """Same bytes, more rows: a 262k-vocabulary head of narrow rows (Gemma's) against a
    model of wide rows. The kernels' time grows by GEMV_ROW_BYTES per row at their
    rate; with no row term the two would take the same time."""
    wide = _q8(make_facts(n_layer=4, n_embd=2048, n_ff=4096, n_vocab=32_000))
    rows, read, _ = decode_reads(wide)
    assert gemv_weight(wide) == pytest.approx(1.0 + GEMV_ROW_BYTES * rows / read)
    narrow = _q8(make_facts(n_layer=4, n_embd=512, n_ff=1024, n_head=8, n_head_kv=4,
                            n_vocab=262_144))
    n_rows, n_read, _ = decode_reads(narrow)
    assert n_rows / n_read > 3 * rows / read
    cal = replace(PRIOR, cpu_bw_efficiency=100.0)  # the kernels bind, not the RAM
    per_byte = _cost(narrow, cal, engine=False) / n_read
    assert per_byte > 1.2 * _cost(wide, cal, engine=False) / read
    # the row term is kernel work: it divides by the threads' rate like the bytes do
    one = _cost(narrow, cal, threads=1, engine=False)
    two = _cost(narrow, replace(cal, decode_thread_scaling=1.0), threads=2, engine=False)
    fixed = cal.token_overhead_s + 4 * cal.layer_overhead_s + ARGMAX_S_PER_VOCAB * 262_144
    assert (two - fixed) == pytest.approx((one - fixed) / 2, rel=1e-6)


def test_our_own_per_token_work_is_in_the_prediction_and_not_in_the_probe() -> None:
    facts = _q8(make_facts(n_layer=4, n_embd=1024, n_ff=4096, n_vocab=150_000))
    cal = Calibration()
    ours = engine_token_work(facts, cal)
    assert ours == pytest.approx(cal.engine_token_s + cal.logits_s_per_vocab * 150_000)
    assert engine_token_work(facts, cal, engine=False) == pytest.approx(
        ARGMAX_S_PER_VOCAB * 150_000)
    run, bare = _cost(facts, cal), _cost(facts, cal, engine=False)
    assert run - bare == pytest.approx(ours - ARGMAX_S_PER_VOCAB * 150_000)
    # a faster control plane shows up in the prediction, microsecond for microsecond
    faster = replace(cal, engine_token_s=cal.engine_token_s - 50e-6)
    assert run - _cost(facts, faster) == pytest.approx(50e-6)
    # a larger vocabulary costs the argmax over more logits
    big = replace(facts, spec=replace(facts.spec, vocab_size=300_000))
    assert engine_token_work(big, cal) - ours == pytest.approx(
        cal.logits_s_per_vocab * 150_000)
    # the learned scale divides it as it divides the rest of the step
    assert _cost(facts, replace(cal, decode_scale=2.0)) == pytest.approx(run / 2)


def test_the_probe_fit_leaves_our_work_out_and_the_prediction_adds_it() -> None:
    """The probe's bare loop timed 10 ms a token: the fitted roofline reproduces that
    for the loop it timed, and our engine's decode of the same model is that plus our
    per-token work."""
    facts = _q8(make_facts(n_layer=4, n_embd=1024, n_ff=4096, n_vocab=150_000))
    speed = LlamaSpeed("p.gguf", threads=2, prompt_tokens=256, prefill_s=0.5,
                       decode_tokens=24, decode_s=0.24, decode_s_1thread=0.36,
                       probe="built-in model p.gguf")
    m = machine(threads=4)
    cal = probe_calibration(speed, facts, m)

    def at(engine: bool) -> float:
        mt = replace(m, devices=(replace(m.cpu, threads=2),))
        return decode_cost(facts, place(facts, mt, ContextSettings(n_ctx=1024, n_ubatch=512,
                                                                   flash_attn=True), {}),
                           mt, ContextSettings(n_ctx=1024, n_ubatch=512, flash_attn=True),
                           268, cal, 2, engine=engine).seconds

    assert at(False) == pytest.approx(0.010, rel=0.02)
    assert at(True) - at(False) == pytest.approx(
        engine_token_work(facts, cal) - engine_token_work(facts, cal, engine=False))


def test_weights_that_fit_the_cache_are_not_bound_by_the_rams_bandwidth() -> None:
    """The tiny llama (20 MB of f32 in a 32 MB L3) decoded faster through `run` than
    the RAM's bandwidth allows for its bytes: held in the cache, only the kernels bind."""
    tiny = _q8(make_facts(n_layer=2, n_embd=512, n_ff=1024, n_head=8, n_head_kv=4,
                          n_vocab=287))
    read = decode_reads(tiny)[1]
    cal = replace(PRIOR, gemv_gbps_per_thread=1e3)  # the kernels: nearly free
    slow_ram = 0.5  # GB/s: the RAM alone would take read / 0.5e9 s
    uncached = _cost(tiny, cal, bandwidth=slow_ram)
    assert uncached > read / (slow_ram * 1e9 * cal.cpu_bw_efficiency)
    # a step reads the weights and the KV cache so far (200 cells here: +30 %)
    held = replace(cal, cpu_cache_bytes=int(2 * read / CACHE_SHARE))
    assert _cost(tiny, held, bandwidth=slow_ram) < uncached / 10
    too_small = replace(cal, cpu_cache_bytes=int(0.9 * read / CACHE_SHARE))
    assert _cost(tiny, too_small, bandwidth=slow_ram) == pytest.approx(uncached)
    # held in the cache, two threads do twice the work of one, whatever the scaling the
    # probe fitted for weights streamed from RAM (two threads 1.93x on the tiny model,
    # 1.5x on Gemma and the Qwen models)
    kernels = replace(PRIOR, decode_thread_scaling=0.6, cpu_cache_bytes=10**9)
    fixed = _cost(tiny, kernels, threads=1) - _cost(tiny, kernels, threads=1, engine=False)
    bare1 = _cost(tiny, kernels, threads=1, engine=False)
    bare2 = _cost(tiny, kernels, threads=2, engine=False)
    overhead = (kernels.token_overhead_s + 2 * kernels.layer_overhead_s
                + ARGMAX_S_PER_VOCAB * 287)
    assert bare2 - overhead == pytest.approx((bare1 - overhead) / 2, rel=1e-6)
    assert fixed > 0
    streamed = replace(kernels, cpu_cache_bytes=0, cpu_bw_efficiency=100.0)
    s1 = _cost(tiny, streamed, threads=1, engine=False) - overhead
    s2 = _cost(tiny, streamed, threads=2, engine=False) - overhead
    assert s1 / s2 == pytest.approx(2**0.6, rel=1e-6)


def test_the_probe_record_carries_the_cpus_cache() -> None:
    facts = _q8(make_facts(n_layer=4, n_embd=1024, n_ff=4096))
    speed = LlamaSpeed("p.gguf", threads=1, prompt_tokens=64, prefill_s=0.2,
                       decode_tokens=24, decode_s=0.24, probe="built-in model p.gguf")
    assert probe_calibration(speed, facts, machine(threads=2)).cpu_cache_bytes == 0
    cal = probe_calibration(speed, facts, machine(threads=2), cache_bytes=32 << 20)
    assert cal.cpu_cache_bytes == 32 << 20
