"""Self-calibration: the probe fit, the learned corrections, and a fresh profile's probe."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from inferenceos.hardware.profile import LlamaSpeed
from inferenceos.plan.calibration import (
    PRIOR,
    RAM_EFFICIENCY,
    STAND_IN_DECODE_SLOWER,
    observation,
    probe_calibration,
    quant_family,
    with_learned,
)
from inferenceos.plan.calibration_load import machine_calibration
from inferenceos.plan.memory import ContextSettings
from inferenceos.plan.perf import Calibration, decode_cost
from inferenceos.telemetry.calibration import Observation, fit_learned
from plan_factories import machine, make_facts


def _speed(decode_s: float = 0.32, prefill_s: float = 0.5,
           probe: str = "built-in model probe.gguf") -> LlamaSpeed:
    """A probe record; by default from a real model (the measurement is its own)."""
    return LlamaSpeed("probe.gguf", threads=2, prompt_tokens=256, prefill_s=prefill_s,
                      decode_tokens=32, decode_s=decode_s, probe=probe)


def test_probe_fit_reproduces_the_probe_measurement() -> None:
    facts, m = make_facts(n_layer=4, n_embd=1024, n_ff=4096), machine(threads=2)
    cal = probe_calibration(_speed(), facts, m)
    ctx = ContextSettings(n_ctx=1024, n_ubatch=512, flash_attn=True)
    obs = observation(facts, m, cal, model="x", ctx=ctx, threads=2, prompt_tokens=256,
                      output_tokens=32, cached_tokens=0, prefill_tps=512.0, decode_tps=100.0)
    assert obs is not None  # modelled = measured: ratios of 1 (up to the n_past midpoint)
    assert obs.decode_ratio == pytest.approx(1.0, rel=0.02)
    assert obs.prefill_ratio == pytest.approx(1.0, rel=0.02)
    assert cal.basis == "modelled" and "probe" in cal.source and cal.confidence > 0.1


def test_a_slower_probe_makes_slower_predictions() -> None:
    facts, m = make_facts(n_layer=4, n_embd=1024, n_ff=4096), machine(threads=2)
    fast, slow = (probe_calibration(_speed(d, p), facts, m) for d, p in ((0.2, 0.3), (0.4, 0.6)))
    assert slow.cpu_bw_efficiency < fast.cpu_bw_efficiency
    assert slow.gemm_gflops_per_thread < fast.gemm_gflops_per_thread


def _obs(model: str, family: str, ratio: float, n: int, threads: int = 2) -> list[Observation]:
    return [Observation(model, family, threads, ratio, ratio) for _ in range(n)]


def test_no_history_learns_nothing() -> None:
    assert fit_learned([], "m", "q4_0") is None
    cal = Calibration()
    assert with_learned(cal, None) is cal


def test_runs_of_the_model_pull_its_prediction_to_what_was_measured() -> None:
    obs = _obs("m", "q4_0", 0.8, 10)
    got = fit_learned(obs, "m", "q4_0", threads=2)
    assert got is not None and got.scope == "model" and got.runs == 10
    assert got.decode_scale == pytest.approx(0.8, rel=0.03)
    few = fit_learned(obs[:1], "m", "q4_0", threads=2)
    assert few is not None and abs(math.log(few.decode_scale)) < abs(math.log(got.decode_scale))
    assert few.confidence < got.confidence
    cal = with_learned(Calibration(), got)
    assert cal.basis == "learned" and cal.runs == 10 and "10 recorded runs" in cal.source


def test_a_family_transfers_more_than_the_machine() -> None:
    obs = _obs("a", "q4_k+q8_0", 0.7, 6) + _obs("b", "f16", 1.3, 6)
    same = fit_learned(obs, "new", "q4_k+q8_0")
    other = fit_learned(obs, "new", "q5_0")
    assert same is not None and other is not None
    assert same.scope == "family" and other.scope == "machine"
    assert same.decode_scale < 0.8  # close to its family's 0.7
    assert 0.8 < other.decode_scale < 1.2  # the machine's mix of both


def test_outliers_are_dropped() -> None:
    obs = _obs("m", "f", 1.0, 6) + _obs("m", "f", 0.2, 1)  # one run beside a build
    got = fit_learned(obs, "m", "f")
    assert got is not None and got.decode_scale == pytest.approx(1.0, abs=0.05)


def test_quant_family_ignores_small_tensors() -> None:
    assert quant_family({"Q8_0": 179, "Q5_0": 43, "Q4_K": 13, "Q6_K": 9, "F32": 0}) == (
        "q4_k+q5_0+q8_0"  # q6_k carries 3.7 %: below FAMILY_SHARE
    )
    assert quant_family(make_facts()) == "q4_0"


def test_probe_model_header_copy_is_sparse(tmp_path: Path) -> None:
    from inferenceos.hardware.llama_speed import header_copy, write_probe_model
    from inferenceos.plan.model_facts import load_model_facts

    p = write_probe_model(tmp_path / "probe.gguf")
    copy = header_copy(p, tmp_path / "copy.gguf")
    assert copy.stat().st_size == p.stat().st_size
    assert copy.stat().st_blocks * 512 < p.stat().st_size // 10  # a few KB on disk
    before, after = load_model_facts(p).spec, load_model_facts(copy).spec
    assert after.tensor_bytes == before.tensor_bytes and "q8_0" in quant_family(after.quant_types)


def test_the_probe_models_vocabulary_is_packed_as_gguf_would(tmp_path: Path) -> None:
    """The stand-in's 3 x 131k vocabulary values are packed in one go (gguf packs them one
    by one, 1.2 s of the write): read back by gguf's own reader they are the tokens,
    scores and types the probe means, in order."""
    from gguf import GGUFReader

    from inferenceos.hardware.llama_speed import write_probe_model

    shape = {"n_vocab": 1000, "n_layer": 1, "n_embd": 256, "n_ff": 256, "n_head": 4,
             "n_head_kv": 1}
    r = GGUFReader(write_probe_model(tmp_path / "probe.gguf", shape))
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    scores = r.fields["tokenizer.ggml.scores"].contents()
    types = r.fields["tokenizer.ggml.token_type"].contents()
    assert len(tokens) == len(scores) == len(types) == 1000
    assert tokens[:3] == ["<unk>", "<s>", "</s>"] and tokens[3] == "<0x00>"
    assert tokens[-1] == f"<pad{1000 - 3 - 256 - 28 - 1}>"
    assert scores[:4] == [0.0, 0.0, 0.0, -1000.0] and scores[-1] == pytest.approx(-1e9)
    assert types[:4] == [2, 3, 3, 6] and types[-1] == 5  # unknown, control, byte, unused
    assert r.fields["llama.block_count"].contents() == 1


def test_a_fresh_profile_carries_the_calibration() -> None:
    from inferenceos.hardware.cache import get_profile
    from inferenceos.paths import cache_dir

    # a stand-in cached by an older version (85 MB, no large head) is not reused
    old = cache_dir() / "probe" / "full-llama-speed-probe.gguf"
    old.parent.mkdir(parents=True, exist_ok=True)
    old.write_bytes(b"\1" * (2 << 20))
    prof = get_profile(refresh=True, measure=True).profile  # isolated home: fresh
    sp = prof.llama_speed
    assert sp is not None, prof.warnings
    assert sp.decode_tps > 1 and sp.prefill_tps > 1 and sp.seconds < 30
    assert Path(sp.model_path).is_file() and sp.probe == "synthetic"  # no built-in here
    assert not old.exists()
    [full] = (cache_dir() / "probe").glob("full-*.gguf")
    assert full.stat().st_size > 200e6  # the 128k-vocabulary head: larger than any L3
    written = full.stat().st_mtime_ns
    again = get_profile(refresh=True, measure=True).profile
    assert again.llama_speed is not None and full.stat().st_mtime_ns == written  # reused
    cal = machine_calibration()
    assert cal.basis == "modelled" and "probe" in cal.source
    assert cal.cpu_bw_efficiency != Calibration().cpu_bw_efficiency


def test_newer_runs_weigh_more() -> None:
    obs = _obs("m", "f", 1.0, 40) + _obs("m", "f", 0.7, 40)  # the machine got slower
    got = fit_learned(obs, "m", "f")
    assert got is not None and got.decode_scale < 0.8


def test_recorded_runs_teach_simulate(tiny_llama: Path, tiny_swa: Path) -> None:
    from inferenceos import telemetry
    from inferenceos.plan.calibration import modelled_speeds, run_context
    from inferenceos.plan.calibration_load import load_calibration
    from inferenceos.plan.model_facts import load_model_facts

    m = machine(threads=2)
    facts = load_model_facts(tiny_llama)
    ctx = run_context(512, 512, 512, {"flash_attn": 1})
    pre, dec = modelled_speeds(facts, m, machine_calibration(), ctx, 2, 64, 32)
    rec = telemetry.recorder()
    # this machine runs the model at half the roofline's speed; recorded as `run` and
    # `serve` record (no path in `extra`: the recorder keeps it, or no other model
    # could learn from these runs, which it once could not)
    for _ in range(6):
        rec.generation(tiny_llama, source="run", settings={"flash_attn": 1},
                       prompt_tokens=64, output_tokens=32, prefill_tps=pre * 0.5,
                       decode_tps=dec * 0.5, threads=2, n_ctx=512, n_batch=512,
                       n_ubatch=512)
    assert rec.flush(timeout=30)
    cal = load_calibration(m, facts, threads=2)
    assert cal.basis == "learned" and cal.runs == 6
    assert 0.45 < cal.decode_scale < 0.6 and 0.45 < cal.prefill_scale < 0.6
    # a model never run here, of the same tensor types (all f32), inherits the family's
    other = load_calibration(m, load_model_facts(tiny_swa), threads=2)
    assert other.basis == "learned" and "tensor types" in other.source
    assert other.decode_scale < 0.7


def _typed(facts, types: dict[str, float]):  # type: ignore[no-untyped-def]
    """`facts` with its weight bytes split over ggml types in the given shares."""
    from dataclasses import replace

    total = sum(facts.spec.quant_types.values())
    return replace(facts, spec=replace(facts.spec, quant_types={
        t: int(total * share) for t, share in types.items()}))


def _tensor_typed(facts, ggml_type: str):  # type: ignore[no-untyped-def]
    """`facts` with every tensor of `ggml_type` (decode weighs the tensors it reads)."""
    from dataclasses import replace

    return replace(facts, tensors=tuple(replace(t, ggml_type=ggml_type)
                                        for t in facts.tensors))


def test_kernel_weights_follow_the_tensor_types() -> None:
    from inferenceos.plan.perf import GEMV_ROW_BYTES, decode_reads, gemm_weight, gemv_weight

    facts = make_facts(n_layer=4, n_embd=1024, n_ff=4096)
    q8 = _tensor_typed(facts, "q8_0")
    rows, read, _ = decode_reads(q8)
    rows_term = GEMV_ROW_BYTES * rows / read  # each output row's fixed part (perf)
    assert gemv_weight(q8) == pytest.approx(1.0 + rows_term)
    assert gemv_weight(_tensor_typed(facts, "q5_0")) == pytest.approx(1.72 + rows_term)
    assert gemv_weight(_tensor_typed(facts, "iq9_z")) == gemv_weight(q8)  # unknown: q8_0
    gemma = {"Q8_0": 0.73, "Q5_0": 0.177, "Q4_K": 0.054, "Q6_K": 0.039}
    # prefill weighs parameters: a q4_K model's matrix products cost 0.80x q8_0's, and
    # Gemma's q5_0 body about what q8_0's would (its Q8_0 file prefills as fast)
    assert gemm_weight(_typed(facts, {"Q4_K": 1.0, "F32": 0.01})) == pytest.approx(0.80)
    assert gemm_weight(_typed(facts, gemma)) == pytest.approx(1.0, abs=0.06)


def _shaped(n_embd: int, n_ff: int, n_head: int, n_head_kv: int, arch: str = "llama"):  # type: ignore[no-untyped-def]
    """One layer of a llama (or `arch`) of these widths."""
    from dataclasses import replace

    f = make_facts(n_layer=1, n_embd=n_embd, n_ff=n_ff, n_head=n_head, n_head_kv=n_head_kv)
    return replace(f, spec=replace(f.spec, architecture=arch))


def test_prefill_costs_per_output_row_and_per_gemma3_layer() -> None:
    """Measured (llama-bench pp64, one thread, pure q8_0 stand-ins): a 640-wide llama
    took 10.4 ps per multiply-add FLOP, a 2048-wide one 8.25 (1.26x); a gemma3 of the
    640-wide shapes 1.00-1.17x the llama's time. FLOPs alone would say 1.0 for both."""
    from inferenceos.plan.perf import prefill_arch_work, prefill_row_factor

    narrow, wide = _shaped(640, 2048, 10, 2), _shaped(2048, 8192, 16, 4)
    assert prefill_row_factor(narrow) / prefill_row_factor(wide) == pytest.approx(1.26, rel=0.04)
    gemma = _shaped(640, 2048, 10, 2, arch="gemma3")
    assert prefill_row_factor(gemma) == prefill_row_factor(narrow)
    assert prefill_arch_work(narrow) == 0.0
    params = sum(t.n_elements for t in narrow.tensors if t.layer == 0)
    llama_work = 2.0 * params * prefill_row_factor(narrow)
    assert 1.0 < (llama_work + prefill_arch_work(gemma)) / llama_work < 1.17


def test_the_probe_fit_transfers_by_size_and_by_tensor_types() -> None:
    from inferenceos.plan.perf import GEMV_ROW_BYTES, decode_reads, gemv_weight
    from inferenceos.plan.placement import place

    m = machine(threads=2)  # 50 GB/s of RAM: the per-thread kernels are the limit
    probe = _tensor_typed(make_facts(n_layer=4, n_embd=1024, n_ff=4096, n_vocab=32000), "q8_0")
    cal = probe_calibration(_speed(decode_s=0.32), probe, m)
    ctx = ContextSettings(n_ctx=1024, n_ubatch=512, flash_attn=True)

    def per_token(f) -> float:  # type: ignore[no-untyped-def]
        pl = place(f, m, ctx, {})  # as the probe's bare loop decodes (not the engine)
        return decode_cost(f, pl, m, ctx, 300, cal, 2, engine=False).seconds

    base = per_token(probe)
    assert base == pytest.approx(0.01, rel=0.05)  # the probe itself: 32 tokens in 0.32 s
    # a model twice the probe's layers (a second size) takes about the ratio of the
    # bytes a token reads (its layers and output head: not the embedding table)
    deep = _tensor_typed(make_facts(n_layer=8, n_embd=1024, n_ff=4096, n_vocab=32000), "q8_0")

    def read(f) -> float:  # type: ignore[no-untyped-def]
        return place(f, m, ctx, {}).decode_load("CPU").bytes_read

    ratio = read(deep) / read(probe)
    assert per_token(deep) / base == pytest.approx(ratio, rel=0.05)
    # the same bytes in q5_0, whose kernels are slower per byte (1.72x), take longer;
    # each row's fixed part (perf.GEMV_ROW_BYTES) stays what it was
    q5 = _tensor_typed(probe, "q5_0")
    rows, read, _ = decode_reads(probe)
    rows_term = GEMV_ROW_BYTES * rows / read
    slower = (1.72 + rows_term) / (1.0 + rows_term)
    assert gemv_weight(q5) / gemv_weight(probe) == pytest.approx(slower)
    assert 1.3 < slower < 1.72
    assert per_token(q5) / base == pytest.approx(slower, rel=0.05)


def test_a_probe_at_two_thread_counts_separates_kernels_from_memory() -> None:
    from dataclasses import replace

    from inferenceos.plan.placement import place

    facts = make_facts(n_layer=4, n_embd=1024, n_ff=4096)
    m = machine(threads=4)
    ctx = ContextSettings(n_ctx=1024, n_ubatch=512, flash_attn=True)

    def at(cal: Calibration, threads: int) -> float:
        mt = replace(m, devices=(replace(m.cpu, threads=threads),))
        return decode_cost(facts, place(facts, mt, ctx, {}), mt, ctx, 268, cal, threads,
                           engine=False).seconds  # the probe's bare loop

    def speed(t2: float, t1: float, probe: str = "built-in model p.gguf") -> LlamaSpeed:
        return LlamaSpeed("p.gguf", threads=2, prompt_tokens=256, prefill_s=0.5,
                          decode_tokens=24, decode_s=24 * t2, decode_s_1thread=24 * t1,
                          probe=probe)

    # a second thread gained 1.1x on a probe far from the RAM's bandwidth: the kernels
    # scale by 2 ** 0.14, and four threads are promised 4 ** 0.14 (1.2x), not nothing
    flat = probe_calibration(speed(0.010, 0.011), facts, m)
    assert flat.cpu_bw_efficiency == RAM_EFFICIENCY
    assert flat.decode_thread_scaling == pytest.approx(math.log2(1.1), abs=0.02)
    assert at(flat, 2) == pytest.approx(0.010, rel=0.02)
    assert at(flat, 1) == pytest.approx(0.011, rel=0.02)
    assert at(flat, 4) == pytest.approx(0.011 / 1.1**2, rel=0.03)
    # it halved the time: linear, and four threads halve it again (memory is far)
    scaled = probe_calibration(speed(0.005, 0.010), facts, m)
    assert scaled.decode_thread_scaling == pytest.approx(1.0)
    assert at(scaled, 2) == pytest.approx(0.005, rel=0.02)
    assert at(scaled, 1) == pytest.approx(0.010, rel=0.02)
    assert at(scaled, 4) == pytest.approx(0.0025, rel=0.03)
    # two threads read faster than RAM_EFFICIENCY of the bandwidth allows: memory is
    # faster than assumed, and the fit says how much (never past the measured rate)
    t2 = at(replace(PRIOR, cpu_bw_efficiency=0.97, gemv_gbps_per_thread=1e3), 2)
    fast = probe_calibration(speed(t2, 1.6 * t2), facts, m)
    assert fast.decode_thread_scaling == 1.0
    assert fast.cpu_bw_efficiency == pytest.approx(0.97, rel=0.02)
    assert at(fast, 2) == pytest.approx(t2, rel=0.02)
    faster = probe_calibration(speed(t2 / 2, 1.6 * t2), facts, m)
    assert faster.cpu_bw_efficiency == 1.0
    # the bandwidth test read low (it swung 36-69 GB/s a second apart here): memory is
    # still at least as fast as the stand-in itself streamed its weights, though a
    # real model of its shapes takes longer (STAND_IN_DECODE_SLOWER: the kernels)
    slow_ram = replace(m, devices=(replace(m.cpu, bandwidth_gbps=5.5),))
    pl = place(facts, replace(slow_ram, devices=(replace(slow_ram.cpu, threads=2),)), ctx, {})
    proven = pl.decode_load("CPU").bytes_read / 0.010 / 1e9
    assert 5.5 > proven > RAM_EFFICIENCY * 5.5
    floor = probe_calibration(speed(0.010, 0.011, probe="synthetic"), facts, slow_ram)
    assert floor.cpu_bw_efficiency >= proven / 5.5 * 0.999  # (from the real model's: /1.2)
    # the synthetic stand-in decodes faster than a real model of its shapes: the fit
    # promises the real model's speed, by the measured factors
    stand_in = probe_calibration(speed(0.010, 0.011, probe="synthetic"), facts, m)
    slow_one, slow_many = STAND_IN_DECODE_SLOWER
    assert at(stand_in, 1) == pytest.approx(0.011 * slow_one, rel=0.02)
    assert at(stand_in, 2) == pytest.approx(0.010 * slow_many, rel=0.02)


def test_the_probe_can_time_a_real_model_where_it_lies(tiny_llama: Path, tmp_path: Path) -> None:
    from inferenceos.hardware.llama_speed import measure_llama_speed

    warnings: list[str] = []
    sp = measure_llama_speed(tmp_path / "hw", 2, warnings, model=tiny_llama)
    assert sp is not None, warnings
    assert sp.model_path == str(tiny_llama) and sp.probe == f"built-in model {tiny_llama.name}"
    assert sp.decode_s > 0 and sp.decode_s_1thread is not None and sp.decode_s_1thread > 0
    assert not (tmp_path / "hw").exists()  # nothing written: the model is read in place
    one = measure_llama_speed(tmp_path / "hw", 1, warnings, model=tiny_llama)
    assert one is not None and one.decode_s_1thread is None  # one thread: nothing to add


def test_a_probe_started_ahead_waits_loaded_then_times_or_is_cancelled(
    tiny_llama: Path, tmp_path: Path
) -> None:
    from inferenceos.hardware.llama_speed import start_llama_speed

    warnings: list[str] = []
    probe = start_llama_speed(tmp_path / "hw", warnings, model=tiny_llama)
    assert probe is not None and probe.wait_ready(30)
    assert probe.proc.poll() is None  # loaded, and waiting for its thread count
    sp = probe.finish(1)
    assert sp is not None and sp.threads == 1 and sp.decode_s > 0, warnings
    cancelled = start_llama_speed(tmp_path / "hw", warnings, model=tiny_llama)
    assert cancelled is not None and cancelled.wait_ready(30)
    cancelled.cancel()
    assert cancelled.proc.returncode is not None
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 64)
    failing = start_llama_speed(tmp_path / "hw", warnings, model=broken)
    assert failing is not None and not failing.wait_ready(30)  # it died loading
    assert failing.finish(2) is None and "speed probe failed" in warnings[-1]


def test_runs_held_in_memory_teach_the_compute_not_the_disk(tiny_llama: Path) -> None:
    """A recorded run that held its weights is modelled on a machine that holds them,
    not under today's smaller limit; a run that streamed teaches nothing; and what is
    learned never speeds up the disk. (Qwen 1.5B's unlimited runs, re-modelled under a
    533 MiB cgroup as disk-bound, taught an 11.7x scale that predicted 16 t/s where 0.7
    was measured.)"""
    from inferenceos import telemetry
    from inferenceos.plan.calibration import modelled_speeds, run_context
    from inferenceos.plan.calibration_load import load_calibration
    from inferenceos.plan.model_facts import load_model_facts
    from inferenceos.plan.perf import DISK_PART, StepCost, _scaled

    facts = load_model_facts(tiny_llama)
    roomy, tight = machine(threads=2), machine(ram=facts.spec.tensor_bytes // 3, threads=2)
    ctx = run_context(512, 512, 512, {"flash_attn": 1})
    pre, dec = modelled_speeds(facts, roomy, machine_calibration(), ctx, 2, 64, 32)
    rec = telemetry.recorder()
    for streamed, share in ((0, 0.5),) * 6 + ((1 << 20, 0.01),) * 3:
        rec.generation(tiny_llama, source="run",
                       settings={"flash_attn": 1, "stream_resident_bytes": streamed},
                       prompt_tokens=64, output_tokens=32, prefill_tps=pre * share,
                       decode_tps=dec * share, threads=2, n_ctx=512, n_batch=512,
                       n_ubatch=512, extra={"model_path": str(tiny_llama)})
    assert rec.flush(timeout=30)
    cal = load_calibration(tight, facts, threads=2)
    assert cal.runs == 6 and 0.45 < cal.decode_scale < 0.6
    cost = _scaled(StepCost({DISK_PART: 1.0, "CPU memory bandwidth": 1.0}, 0.5), 4.0)
    assert cost.parts == {DISK_PART: 1.0, "CPU memory bandwidth": 0.25}
    assert cost.overhead_s == 0.125


def test_runs_that_streamed_teach_the_disks_streaming_rate(tiny_llama: Path) -> None:
    """Runs that streamed their weights teach the rate they read them at, against the
    disk's measured one: what simulate then charges a disk-bound plan's reads. (Qwen
    1.5B under memory cgroups read at 0.62-0.73 GB/s where the profile's sequential
    figure was 1.28: every prediction was 1.6x too fast.)"""
    from inferenceos import telemetry
    from inferenceos.plan.calibration import modelled_speeds, run_context
    from inferenceos.plan.calibration_load import load_calibration
    from inferenceos.plan.model_facts import load_model_facts
    from inferenceos.plan.perf import DISK_PART
    from inferenceos.plan.placement import place

    facts = load_model_facts(tiny_llama)
    roomy = machine(threads=2)  # disk_gbps 2.0
    ctx = run_context(512, 512, 512, {"flash_attn": 1})
    _, compute = modelled_speeds(facts, roomy, machine_calibration(), ctx, 2, 1, 32)
    resident = facts.spec.tensor_bytes // 4
    reading = (facts.spec.tensor_bytes - resident) / (0.5 * 2.0e9)  # half the disk's rate
    rec = telemetry.recorder()
    for _ in range(6):
        rec.generation(tiny_llama, source="run",
                       settings={"flash_attn": 1, "stream_resident_bytes": resident,
                                 "n_gpu_layers": 0},
                       prompt_tokens=4, output_tokens=32, decode_tps=1 / (1 / compute + reading),
                       threads=2, n_ctx=512, n_batch=512, n_ubatch=512,
                       extra={"model_path": str(tiny_llama)})
    assert rec.flush(timeout=30)
    tight = machine(ram=facts.spec.tensor_bytes // 3, threads=2)
    cal = load_calibration(tight, facts, threads=2)
    assert 0.4 < cal.disk_scale < 0.6 and "streamed" in cal.source
    assert cal.decode_scale == 1.0  # the streamed runs taught the compute nothing
    ctx2 = ContextSettings(n_ctx=512, n_ubatch=512, flash_attn=True)
    from dataclasses import replace

    pl = replace(place(facts, tight, ctx2, {}), disk_bytes=facts.spec.tensor_bytes // 2)
    learned = decode_cost(facts, pl, tight, ctx2, 16, cal, 2).parts[DISK_PART]
    as_measured = replace(machine_calibration(), disk_scale=1.0)  # the disk's own rate
    measured_disk = decode_cost(facts, pl, tight, ctx2, 16, as_measured, 2)
    assert learned == pytest.approx(measured_disk.parts[DISK_PART] / cal.disk_scale)


def test_a_streamed_moe_token_reads_only_the_experts_it_picks(tmp_path: Path) -> None:
    """The disk tier of a routed model is experts first (the streamer keeps every dense
    part before any expert), and a token reads only the experts its router picks: 2 of
    4 here, so half the streamed experts' bytes per decode step; a prompt's ubatch of
    many tokens picks nearly all of them. (Charged whole, the upcycled Qwen MoE under
    40 % of its size was predicted at 0.39 t/s against 2.14 measured.)"""
    from inferenceos.plan.model_facts import load_model_facts
    from inferenceos.plan.perf import streamed_bytes
    from tiny_models import write_tiny_model

    facts = load_model_facts(write_tiny_model(tmp_path / "moe.gguf", "moe"))
    experts = sum(layer.expert_bytes for layer in facts.spec.layers)
    assert streamed_bytes(experts // 2, facts, 1) == pytest.approx(experts / 4)
    assert streamed_bytes(experts + 1000, facts, 1) == pytest.approx(1000 + experts / 2)
    assert streamed_bytes(experts, facts, 64) == pytest.approx(experts)  # 1 - 0.5^64
    dense = load_model_facts(write_tiny_model(tmp_path / "llama.gguf", "llama"))
    assert streamed_bytes(5000, dense, 1) == 5000.0


def test_recorded_expert_heat_makes_the_streamed_experts_the_cold_ones(tmp_path: Path) -> None:
    """With picks recorded (telemetry/expert_heat.py) the disk tier holds the coldest
    experts, and a decode step reads each of them with its own odds: a router that
    picks experts 0 and 1 nine times in ten streams little."""
    from inferenceos import telemetry
    from inferenceos.plan.calibration_load import load_calibration
    from inferenceos.plan.model_facts import load_model_facts
    from inferenceos.plan.perf import streamed_bytes
    from tiny_models import write_tiny_model

    path = write_tiny_model(tmp_path / "moe.gguf", "moe")
    facts = load_model_facts(path)
    rec = telemetry.recorder()
    rec.expert_heat(path, {i: np.array([90.0, 90.0, 10.0, 10.0]) for i in (0, 1)}, 100.0)
    assert rec.flush(timeout=30)
    odds = load_calibration(machine(threads=2), facts, threads=2).expert_odds
    assert len(odds) == 8 and odds == tuple(sorted(odds))
    assert odds[0] == pytest.approx((10 + 0.5 * 16) / (100 + 16))  # drawn to the prior
    experts = sum(layer.expert_bytes for layer in facts.spec.layers)
    cold = streamed_bytes(experts // 2, facts, 1, odds)
    assert cold == pytest.approx(experts / 2 * odds[0], rel=1e-3)
    assert cold < 0.4 * streamed_bytes(experts // 2, facts, 1)  # uniform: 0.5 of them
