"""Routed experts resident by heat (issue 30): the choice, the store, the streamer.

The resident set of a disk-bound plan takes the units a token reads most per byte:
the head and the blocks' dense parts (every token), then the experts the router picks
most. The picks are counted from the router's own output, stored per model in the
telemetry database (decayed by tokens) and read back at the next load.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from inferenceos.engine.weights.layout import HEAD, Span, span_bytes, weight_units
from inferenceos.engine.weights.resident_choice import (
    choose_resident,
    streamed_per_token,
    worth_swapping,
)
from inferenceos.telemetry.expert_heat import HALF_LIFE_TOKENS, odds, read_heat
from inferenceos.telemetry.identity import model_digest
from inferenceos.telemetry.recorder import Recorder
from tiny_models import write_tiny_model

KIB = 1024


def units_of(experts: int = 4, layers: int = 2) -> dict:
    """Made-up units: a 10 KiB head, 20 KiB dense parts, 30 KiB experts."""
    units: dict = {HEAD: [Span(0, 10 * KIB)]}
    at = 10 * KIB
    for layer in range(layers):
        units[layer] = [Span(at, at + 20 * KIB)]
        at += 20 * KIB
        for e in range(experts):
            units[(layer, e)] = [Span(at, at + 30 * KIB)]
            at += 30 * KIB
    return units


def test_dense_parts_come_first_then_the_hottest_experts() -> None:
    units = units_of()
    heat = {(0, 0): 0.1, (0, 1): 0.9, (0, 2): 0.5, (0, 3): 0.5,
            (1, 0): 0.95, (1, 1): 0.05, (1, 2): 0.5, (1, 3): 0.5}
    room = 10 * KIB + 2 * 20 * KIB + 2 * 30 * KIB
    assert choose_resident(units, [0, 1], room, heat) == {HEAD, 0, 1, (1, 0), (0, 1)}
    # the dense parts before any expert, however hot
    assert choose_resident(units, [0, 1], 10 * KIB + 2 * 20 * KIB + 29 * KIB, heat) == {
        HEAD, 0, 1}
    # without heat: the experts in file order
    uniform = {k: 0.5 for k in heat}
    assert choose_resident(units, [0, 1], room, uniform) == {HEAD, 0, 1, (0, 0), (0, 1)}


def test_a_new_resident_set_must_save_enough_reads_to_be_swapped_in() -> None:
    units = units_of()
    heat = {(0, e): p for e, p in enumerate([0.9, 0.5, 0.4, 0.2])}
    heat.update({(1, e): 0.5 for e in range(4)})
    old = frozenset({HEAD, 0, 1, (0, 2)})
    new = frozenset({HEAD, 0, 1, (0, 0)})
    # (0, 0) resident instead of (0, 2): 0.5 x 30 KiB less read per token
    saved = streamed_per_token(units, old, heat) - streamed_per_token(units, new, heat)
    assert saved == pytest.approx(0.5 * 30 * KIB)
    assert worth_swapping(units, old, new, heat)
    tie = dict(heat) | {(0, 0): 0.4}
    assert not worth_swapping(units, old, new, tie)  # a tie never swaps


def test_heat_is_stored_per_model_decayed_by_tokens(tmp_path: Path) -> None:
    model = write_tiny_model(tmp_path / "moe.gguf", "moe")
    rec = Recorder(tmp_path / "telemetry.db")
    rec.expert_heat(model, {0: np.array([8.0, 0, 0, 0]), 1: np.array([0, 4.0, 4.0, 0])}, 4.0)
    rec.expert_heat(model, {0: np.array([0, 0, 0, 2.0 * HALF_LIFE_TOKENS])},
                    HALF_LIFE_TOKENS)
    assert rec.flush() and rec.written == 2 and rec.lost == 0
    heat = read_heat(model_digest(model), tmp_path / "telemetry.db")
    assert heat is not None
    picks, tokens = heat
    # the first 4 tokens' picks halved by the half-life of tokens that followed
    assert picks[0].tolist() == pytest.approx([4.0, 0, 0, 2.0 * HALF_LIFE_TOKENS], rel=1e-3)
    assert picks[1].tolist() == pytest.approx([0, 4.0, 4.0, 0])
    assert tokens[0] == pytest.approx(HALF_LIFE_TOKENS + 2.0, rel=1e-4)
    assert tokens[1] == 4.0  # the second record routed nothing through layer 1
    p = odds(heat, 0, 4, prior=0.5)
    assert p[3] > 1.9 and p[0] < 0.01  # nearly every token picked expert 3
    assert odds(heat, 7, 4, prior=0.5).tolist() == [0.5] * 4  # a layer never seen
    assert read_heat("0" * 64, tmp_path / "telemetry.db") is None
    rec.close()


def wait_for(cond: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.02)
    return cond()


@pytest.fixture
def moe(tmp_path: Path) -> Path:
    return write_tiny_model(tmp_path / "moe.gguf", "moe")


def budget_for_experts(path: Path, n_experts: int) -> int:
    """A stream budget whose resident room holds the head, every dense part and
    `n_experts` experts (ahead 2: the window is the block computing, whole, and two
    blocks' dense parts with the 2 experts a token picks)."""
    units = weight_units(path)
    block, expert = span_bytes(units[0]), span_bytes(units[(0, 0)])
    dense = sum(span_bytes(s) for u, s in units.items() if isinstance(u, int) and u != -2)
    room = dense + n_experts * expert + 4 * KIB
    return int((room + block + 4 * expert + 2 * (block + 2 * expert)) / 0.95) + 1


def test_stored_heat_chooses_the_resident_experts_and_a_run_adds_its_picks(moe: Path) -> None:
    from inferenceos.engine.sampling import SamplingParams
    from inferenceos.engine.scheduler import generate_one
    from inferenceos.engine.session import LoadedModel
    from inferenceos.plan.llama_params import LlamaParams
    from inferenceos.telemetry.recorder import recorder

    params = LlamaParams(n_ctx=256, n_threads=1,
                         stream_resident_bytes=budget_for_experts(moe, 4))
    with LoadedModel(moe, params) as m:  # nothing stored: the experts in file order
        s = m._streamer
        assert s is not None and s.ahead == 2
        assert {u for u in s.resident if isinstance(u, tuple)} == {(0, 0), (0, 1), (0, 2),
                                                                   (0, 3)}
    hot = {layer: np.array([0.0, 0.0, 10.0, 90.0]) for layer in (0, 1)}
    rec = recorder()
    rec.expert_heat(moe, hot, 50.0)
    assert rec.flush()
    with LoadedModel(moe, params) as m:
        s = m._streamer
        assert s is not None
        hot_set = {(0, 3), (1, 3), (0, 2), (1, 2)}
        # chosen before the resident set was read (or, had the store been slow, swapped)
        assert wait_for(lambda: {u for u in s.resident if isinstance(u, tuple)} == hot_set)
        assert wait_for(lambda: s.locked >= s.resident_bytes)  # locked, root may
        assert s.resident_in_core() == 1.0
        out = list(generate_one(m, m.tokenize("hello"), SamplingParams(temperature=0,
                                                                       max_tokens=6)))
        assert out
    assert rec.flush()
    picks, tokens = read_heat(model_digest(moe)) or ({}, {})
    # the run's prompt and reply added their tokens, each picking 2 experts a layer
    # (the stored 50 decay by a factor of 0.9997 over them)
    added = {layer: tokens[layer] - 50.0 for layer in (0, 1)}
    assert 5.9 <= added[0] <= 14
    assert all(picks[i].sum() == pytest.approx(100.0 + 2 * added[i], abs=0.2) for i in (0, 1))
    # the last layer routes only the prompt's output row (llama.cpp's inp_out_ids):
    # its odds are over its own, fewer, tokens
    assert added[1] < added[0] - 0.5


def test_the_picks_since_the_load_rechoose_the_resident_experts(
        moe: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stored heat that no longer holds (expert 0 hot, which the router does not pick
    most here) is corrected by the picks of the run: the resident experts follow."""
    from inferenceos.engine import session
    from inferenceos.engine.sampling import SamplingParams
    from inferenceos.engine.scheduler import generate_one
    from inferenceos.engine.session import LoadedModel
    from inferenceos.engine.weights import prefetch
    from inferenceos.plan.llama_params import LlamaParams

    params = LlamaParams(n_ctx=512, n_threads=1,
                         stream_resident_bytes=budget_for_experts(moe, 2))
    stale = ({layer: np.array([4.0, 0.0, 0.0, 0.0]) for layer in (0, 1)}, {0: 2.0, 1: 2.0})
    monkeypatch.setattr(session, "_heat_store", lambda _path: (lambda: stale, None))
    with LoadedModel(moe, params) as m:
        s = m._streamer
        assert s is not None
        assert wait_for(lambda: {u for u in s.resident if isinstance(u, tuple)} == {
            (0, 0), (1, 0)})
        before = s.rechosen
        list(generate_one(m, m.tokenize("the quick brown fox"),
                          SamplingParams(temperature=0, max_tokens=3 * prefetch.RECHOOSE_TOKENS,
                                         ignore_eos=True)))
        assert wait_for(lambda: s.rechosen > before)
        heat = s.heat()
        experts = {u for u in s.resident if isinstance(u, tuple)}
        hottest = {max(((layer, e) for e in range(4)), key=lambda u: heat[u])
                   for layer in (0, 1)}
        assert experts == hottest and experts != {(0, 0), (1, 0)}
