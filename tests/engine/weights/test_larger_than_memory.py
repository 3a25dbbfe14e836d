"""The tiers of a plan: anonymous memory, page cache, disk (no cgroup needed).

A plan that leaves weights on disk loads without CPU_REPACK, so every CPU weight is
mapped (reclaimable) and the anonymous part is only the KV cache, buffers and
overhead; a plan that fits repacks and charges the copies as anonymous RAM. The real
process is checked against these figures under a cgroup in test_cgroup_limits.py.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from inferenceos.plan.devices import Overrides, apply_overrides, local_machine
from inferenceos.plan.entry import LoadRequest
from inferenceos.plan.footprint import estimate, stream_room, stream_window
from inferenceos.plan.here import plan_here
from inferenceos.plan.model_facts import ModelFacts, load_model_facts
from inferenceos.plan.plan import Plan
from inferenceos.plan.preflight import PlanRefused
from tiny_q4 import write_q4_model

MIB = 1 << 20
AVX2 = ("avx2", "fma", "f16c")


@pytest.fixture(scope="module")
def q4_facts(tmp_path_factory: pytest.TempPathFactory) -> ModelFacts:
    return load_model_facts(write_q4_model(tmp_path_factory.mktemp("q4") / "tiny-q4.gguf"))


def prefetched_soon(streamer: Any, timeout: float = 5.0) -> int:
    """The streamer's read-ahead count once its thread has acted on the last layer that
    started: it runs beside the decode, and on a busy machine it may not have been
    scheduled yet when a short generation ends (0 seen once in a full suite)."""
    deadline = time.monotonic() + timeout
    while streamer.prefetched == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    return int(streamer.prefetched)


def plan_with(facts: ModelFacts, ram: int) -> Plan:
    """The plan on this machine with `ram` bytes and an AVX2 CPU (repack rules)."""
    m = apply_overrides(local_machine(), Overrides(ram=ram))
    cpu = replace(m.cpu, isa=AVX2)
    m = replace(m, devices=(cpu, *m.accelerators))
    req = LoadRequest(n_ctx=512, type_k="f16", type_v="f16")
    return plan_here(facts, m, req, sense_load=False, tuned=False).plan


def test_a_plan_that_fits_repacks_and_charges_the_copies_as_anonymous(
    q4_facts: ModelFacts,
) -> None:
    plan = plan_with(q4_facts, 4096 * MIB)
    m = plan.memory
    assert not plan.disk_bound and plan.params().use_extra_bufts
    assert m.repack > 40 * MIB  # the Q4_0 matrices (rows divisible by 8)
    fixed = m.kv["CPU"] + m.compute["CPU"] + m.output + m.overhead
    assert m.anonymous == m.repack + fixed
    assert m.mapped == m.weights["CPU"] - m.repack  # token_embd, output (f32): mapped
    assert m.tiers(4096 * MIB) == {"anonymous": m.anonymous, "page cache": m.mapped, "disk": 0}


def test_a_disk_plan_loads_without_repack_and_its_tiers_add_up(q4_facts: ModelFacts) -> None:
    fits = plan_with(q4_facts, 4096 * MIB).memory
    ram = fits.anonymous - fits.repack + fits.weights["CPU"] // 2
    plan = plan_with(q4_facts, ram)
    m = plan.memory
    assert plan.disk_bound and not plan.params().use_extra_bufts
    assert m.repack == 0 and m.mapped == m.weights["CPU"]
    tiers = m.tiers(ram)
    assert tiers["anonymous"] + tiers["page cache"] == ram
    assert tiers["page cache"] + tiers["disk"] == m.weights["CPU"]
    assert tiers["disk"] == plan.placement.disk_bytes > 0


def test_re_estimating_a_disk_placement_keeps_repack_off(q4_facts: ModelFacts) -> None:
    """Every caller that re-estimates a plan (policy, microbatch, the optimizer) gets
    the same figures: the placement's disk bytes decide."""
    fits = plan_with(q4_facts, 4096 * MIB).memory
    plan = plan_with(q4_facts, fits.anonymous - fits.repack + fits.weights["CPU"] // 2)
    machine = local_machine()
    again = estimate(q4_facts, plan.placement, machine, plan.ctx)
    assert again.repack == 0
    assert estimate(q4_facts, replace(plan.placement, disk_bytes=0), machine, plan.ctx,
                    repack=None).repack >= 0


def test_no_room_to_stream_a_layer_is_refused_with_figures(q4_facts: ModelFacts) -> None:
    window = stream_room(q4_facts)
    assert window == 2 * stream_window(q4_facts) > 10 * MIB  # 1024-wide layers of Q4_0
    # walk the budget down to the first refusal: the optimizer shrinks the ubatch as
    # the budget tightens, so the plans fit until the smallest settings' anonymous
    # bytes plus the streaming room no longer do (not before: that is the check)
    ram, anon = 40 * MIB, 0
    with pytest.raises(PlanRefused) as e:
        while ram > 0:
            anon = plan_with(q4_facts, ram).memory.anonymous
            ram -= MIB // 4
    assert ram + MIB // 4 >= anon + window  # refused only once the layer no longer fits
    msg = str(e.value)
    assert "page cache to stream its largest layer" in msg and "RAM budget" in msg


def test_stream_window_counts_a_tied_embedding_as_the_output_head(tmp_path: Path) -> None:
    """A model without output.weight multiplies by token_embd at every token: its
    whole embedding must fit in the window."""
    from tiny_models import write_tiny_model

    facts = load_model_facts(write_tiny_model(tmp_path / "t.gguf", "llama"))
    untied = stream_window(facts)
    tied = replace(facts, tensors=tuple(t for t in facts.tensors if t.name != "output.weight"))
    embd = sum(t.n_bytes for t in facts.tensors if t.name.startswith("token_embd"))
    assert stream_window(tied) >= embd and untied < facts.spec.tensor_bytes


def test_the_memory_budget_is_read_now_not_from_a_cached_profile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A profile cached outside a memory cgroup must not give its RAM to a process
    inside one: the budget comes from the live reading."""
    from inferenceos.hardware import cache
    from inferenceos.hardware.profile import MemoryInfo

    profile = cache.get_profile(measure=False).profile
    stale = replace(profile, memory=replace(profile.memory, usable_bytes=1 << 50))
    monkeypatch.setattr(cache, "load_cached", lambda fingerprint=None: stale)
    live = 3 << 30
    reading = MemoryInfo(total_bytes=live, usable_bytes=live)
    monkeypatch.setattr("inferenceos.hardware.memory.detect_memory", lambda *a, **k: reading)
    assert local_machine().cpu.memory_bytes == live


def test_layer_spans_cover_every_tensor_once(q4_facts: ModelFacts) -> None:
    from inferenceos.engine.weights.prefetch import layer_spans

    spans = layer_spans(q4_facts.spec.path)
    assert sorted(spans) == [-2, -1, *range(8)]  # the untied embedding apart (ROWS)
    flat = sorted((s for v in spans.values() for s in v), key=lambda s: s.start)
    assert all(a.end <= b.start for a, b in itertools.pairwise(flat))
    covered = sum(s.end - s.start for s in flat)
    total = q4_facts.spec.tensor_bytes
    assert total <= covered < total + 64 * 4096  # alignment gaps inside merged spans


def test_a_disk_plan_streams_through_llama_cpps_own_mapping(q4_facts: ModelFacts) -> None:
    """The plan asks for streaming; the engine finds llama.cpp's mapping of the file
    (its address math checked against the file's bytes), keeps the resident layers the
    budget holds and prefetches the others while decoding."""
    import ctypes

    from inferenceos.engine.sampling import SamplingParams
    from inferenceos.engine.scheduler import generate_one
    from inferenceos.engine.session import LoadedModel

    fits = plan_with(q4_facts, 4096 * MIB).memory
    plan = plan_with(q4_facts, fits.anonymous - fits.repack + fits.weights["CPU"] // 2)
    params = plan.params().per_sequence()
    cache = plan.memory.tiers(plan.budgets["CPU"])["page cache"]
    # the page-cache tier is all the resident weights' and the window's (an enforced
    # limit's budget already leaves out the decode's code pages: hardware.memory)
    assert params.stream_resident_bytes == cache
    path = q4_facts.spec.path
    with LoadedModel(path, params) as m:
        s = m._streamer
        assert s is not None and s._base is not None
        span = s.spans[3][0]
        with open(path, "rb") as f:
            f.seek(span.start)
            assert ctypes.string_at(s._base + span.start, 64) == f.read(64)
        resident = sum(sum(x.end - x.start for x in s.spans[i]) for i in s.resident)
        assert resident <= params.stream_resident_bytes and 0 < len(s.resident) < 9
        list(generate_one(m, m.tokenize("abc"), SamplingParams(temperature=0, max_tokens=4)))
        assert prefetched_soon(s) > 0
    assert plan_with(q4_facts, 4096 * MIB).params().stream_resident_bytes == 0


@pytest.mark.parametrize(("layers", "ahead"), [(0.5, 0), (1.5, 0), (2.5, 1), (8.0, 2)])
def test_the_prefetch_reads_ahead_only_what_the_page_cache_holds(
    q4_facts: ModelFacts, layers: float, ahead: int
) -> None:
    """A read-ahead with no room beside the layer computing evicts that layer, which
    then faults back in (at one layer's room, 2 ahead decoded 4x slower): the streamer
    reads ahead at most the layers the budget holds besides the current one."""
    from inferenceos.engine.weights.prefetch import LayerStreamer

    layer = stream_window(q4_facts)
    with LayerStreamer(q4_facts.spec.path, int(layers * layer), ahead=2) as s:
        assert s.ahead == ahead
        assert not s.resident or layers > ahead + 1  # the window comes first


def test_the_resident_set_is_chosen_by_role_and_the_embedding_is_read_by_row(
    q4_facts: ModelFacts,
) -> None:
    """The head (read whole by every token) comes first, then the first blocks; the
    untied token embedding, of which a token reads one row, is neither locked nor
    streamed. (Locking the embedding with the head left Qwen 1.5B under 50 % of its
    size nothing resident: it read its whole file at every token.)"""
    from inferenceos.engine.weights.prefetch import HEAD, ROWS, LayerStreamer, layer_spans
    from inferenceos.engine.weights.prefetch import span_bytes as _bytes

    spans = layer_spans(q4_facts.spec.path)
    head, block = _bytes(spans[HEAD]), _bytes(spans[0])
    budget = int((head + 2 * block + 100 * 1024) / 0.95)  # the head, a block, the window
    with LayerStreamer(q4_facts.spec.path, budget, ahead=0) as s:
        assert s.resident == {HEAD, 0}
        assert s.ring == list(range(8))  # neither the resident head nor the rows
        assert ROWS not in s.resident
        assert s.streamed_bytes == sum(_bytes(spans[i]) for i in range(1, 8))
    small = int((block + 500 * 1024) / 0.95)  # room for the window only
    with LayerStreamer(q4_facts.spec.path, small, ahead=0) as s:
        assert s.resident == frozenset()
        assert s.ring == [*range(8), HEAD]  # the head is prefetched after the last block
        assert s.streamed_bytes == head + 8 * block


def test_a_streamed_moe_layer_is_read_ahead_without_its_experts(tmp_path: Path) -> None:
    """Read ahead, a MoE layer brings its dense part (attention, norms, router); the
    experts the router picks are asked for when it has picked them, not every expert
    ahead of time. (On the upcycled Qwen MoE under 40 % of its size the bytes read per
    token stayed at ~983 MiB of 1087 all the same: the kernel's 8 MiB fault read-around
    is wider than an expert's 3 MiB slices; docs/engine.md.)"""
    from inferenceos.engine.sampling import SamplingParams
    from inferenceos.engine.scheduler import generate_one
    from inferenceos.engine.session import LoadedModel
    from inferenceos.engine.weights.prefetch import layer_spans
    from inferenceos.engine.weights.prefetch import span_bytes as _bytes
    from inferenceos.plan.llama_params import LlamaParams
    from tiny_models import write_tiny_model

    path = write_tiny_model(tmp_path / "moe.gguf", "moe")
    spans = layer_spans(path)
    budget = int(2.5 * max(_bytes(spans[i]) for i in spans if i >= 0))
    with LoadedModel(path, LlamaParams(n_ctx=256, n_threads=1,
                                       stream_resident_bytes=budget)) as m:
        s = m._streamer
        # read ahead, a layer holds its dense part and the 2 experts a token picks
        assert s is not None and s.n_expert == 4 and s.ahead == 2
        experts = sum(_bytes(s.units[(0, e)]) for e in range(4))
        assert _bytes(s.units[0]) + experts == _bytes(spans[0])  # all but the experts
        assert not any(isinstance(u, tuple) for u in s.resident)  # no room for experts
        streamed = [i for i in range(len(s.blocks)) if i not in s.resident]
        list(generate_one(m, m.tokenize("abc"), SamplingParams(temperature=0, max_tokens=8)))
        # 2 picked of 4 per layer and token: at most 2 experts asked for per layer a step
        assert 0 < s.expert_fetches <= 2 * len(s.blocks) * (8 + 1)
        assert not streamed or prefetched_soon(s) > 0
