"""H2O: attention read through cb_eval, cells tracked, heavy hitters kept (tiny models)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from inferenceos.engine.kv.attention_probe import AttentionProbe
from inferenceos.engine.kv.policies import HeavyHitterOracle
from inferenceos.engine.messages import TokenOut
from inferenceos.engine.sampling import SamplingParams
from inferenceos.engine.scheduler import Request, Scheduler
from inferenceos.engine.session import LoadedModel
from inferenceos.errors import UsageError
from inferenceos.model.spec import load_spec
from inferenceos.plan.llama_params import LlamaParams

ENDLESS = SamplingParams(temperature=0, max_tokens=1000, ignore_eos=True)


def probed(path: Path, n_ctx: int = 128) -> tuple[LoadedModel, AttentionProbe]:
    spec = load_spec(path)
    probe = AttentionProbe(layer.index for layer in spec.layers if not layer.is_swa)
    settings = LlamaParams(n_ctx=n_ctx, n_batch=32, n_threads=1, flash_attn=0)
    return LoadedModel(path, settings, eval_callback=probe.callback), probe


@pytest.mark.parametrize("kind", ["tiny_llama", "tiny_swa"])
def test_h2o_generates_past_the_slot_and_tracks_every_cell(
    kind: str, request: pytest.FixtureRequest
) -> None:
    lm, probe = probed(request.getfixturevalue(kind))
    with lm:
        sched = Scheduler(lm, 1, 32, kv_policy="h2o", probe=probe)
        sched.submit(Request(1, lm.tokenize("abc abc abc"), ENDLESS))
        count, peak, holes = 0, 0, 0.0
        while sched.has_work():
            count += sum(isinstance(ev, TokenOut) for ev in sched.step())
            slot = sched.slots[0]
            assert sched.tracker is not None
            cells = sched.tracker.cells.get(0, [])
            assert len(cells) == len(slot.cached)  # every position has exactly one cell
            assert len(set(cells)) == len(cells)
            peak = max(peak, len(slot.cached))
            st = sched.stats()
            row = st["slots"][0]
            assert row["cell_span"] >= row["cached_tokens"]
            assert st["kv_window_cells"] >= row["cell_span"]  # attention covers every cell
            holes = max(holes, row["cell_holes"])
        assert probe.errors == 0
        assert 0 < holes < 1  # evicting from the middle leaves holes llama.cpp refills
        limit = sched.n_ctx_slot  # llama.cpp rounds n_ctx up to 256
    assert count == 1000 > 3 * limit
    assert peak <= limit


def test_probe_sees_attention_that_sums_to_one_per_row(tiny_llama: Path) -> None:
    lm, probe = probed(tiny_llama)
    with lm:
        tokens = lm.tokenize("abc abc")
        probe.reset()
        lm.prefill(tokens)
        # each of 2 layers x 4 heads x n rows distributes probability 1
        assert probe.mass.sum() == pytest.approx(2 * 4 * len(tokens), rel=1e-4)
        assert probe.attended.shape[0] == len(tokens)
        assert [int(r.sum()) for r in probe.attended] == list(range(1, len(tokens) + 1))


def test_heavy_hitters_survive_eviction() -> None:
    class View:
        def __init__(self, scores: np.ndarray) -> None:
            self.positions = list(range(len(scores)))
            self._scores = list(scores)

        @property
        def n_past(self) -> int:
            return len(self.positions)

        def remove(self, p0: int, p1: int) -> None:
            del self.positions[p0:p1]
            del self._scores[p0:p1]

        def attention_scores(self) -> np.ndarray:
            return np.array(self._scores)

    scores = np.ones(100)
    scores[[0, 7, 42]] = 50.0  # three heavy hitters among old tokens
    view = View(scores)
    assert HeavyHitterOracle().make_room(view)
    assert view.n_past == 75  # a quarter evicted
    assert {0, 7, 42} <= set(view.positions)
    assert view.positions[-37:] == list(range(63, 100))  # the recent half of what stays


def test_h2o_without_a_probe_is_refused(tiny_llama: Path) -> None:
    with (
        LoadedModel(tiny_llama, LlamaParams(n_ctx=128, n_threads=1)) as lm,
        pytest.raises(UsageError, match="needs attention probabilities"),
    ):
        Scheduler(lm, 1, 32, kv_policy="h2o")


def test_engine_refuses_h2o_with_flash_attention(tiny_llama: Path) -> None:
    from inferenceos.engine.engine import Engine

    with pytest.raises(UsageError, match="need flash attention off"):
        Engine(tiny_llama, LlamaParams(n_ctx=128, flash_attn=1), n_parallel=1, kv_policy="h2o")


def test_budgeted_perplexity_full_budget_equals_full_cache(tiny_llama: Path) -> None:
    from inferenceos.engine.kv.policies import NoEviction, StreamingLLM
    from inferenceos.engine.scoring import budgeted_perplexity, perplexity

    lm, probe = probed(tiny_llama, n_ctx=256)
    with lm:
        tokens = lm.tokenize("abc abd abe abf " * 8)
        full = perplexity(lm, tokens)
        assert budgeted_perplexity(lm, tokens, NoEviction(), len(tokens)) == pytest.approx(
            full, rel=1e-3
        )
        small = len(tokens) // 5
        for policy, p in ((StreamingLLM(), None), (HeavyHitterOracle(), probe)):
            ppl = budgeted_perplexity(lm, tokens, policy, small, p)
            assert np.isfinite(ppl) and ppl > 1


def test_policy_options_follow_the_models_attention_layout(tiny_llama: Path) -> None:
    from inferenceos.engine.kv.policies import policy_options

    assert policy_options(load_spec(tiny_llama)) == {}  # no sliding window: the paper's split
    lm, probe = probed(tiny_llama)
    with lm:
        sched = Scheduler(lm, 1, 32, kv_policy="h2o", probe=probe,
                          policy_options={"h2o": {"recent_fraction": 0.9}})
        assert isinstance(sched.policy, HeavyHitterOracle)
        assert sched.policy.recent_fraction == 0.9


@pytest.mark.slow
def test_gemma_gets_a_recent_heavy_h2o(gemma_path: Path) -> None:
    from inferenceos.engine.kv.policies import policy_options

    # 15 of Gemma 3's 18 layers are sliding-window
    assert policy_options(load_spec(gemma_path)) == {"h2o": {"recent_fraction": 0.9}}
