"""The upcycled mixture of experts (tests/upcycle_moe.py): issue 30's MoE test model.

Built from a tiny dense qwen2 model here (rotate-half rope, q/k/v biases: the
architecture of the Qwen2.5 model the benchmark upcycles), then loaded by llama.cpp as
a Mixtral-style llama model. With identical experts it must write the dense model's
greedy text (the picked experts' weights sum to 1), which also checks the q/k row
permutation between the two rope orders; with perturbed experts the router's picks
vary with the tokens.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from inferenceos.engine.sampling import SamplingParams
from inferenceos.engine.scheduler import generate_one
from inferenceos.engine.session import LoadedModel
from inferenceos.plan.llama_params import LlamaParams
from tiny_models import write_tiny_model
from upcycle_moe import upcycle

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def _text(path: Path, prompt: str) -> str:
    with LoadedModel(path, LlamaParams(n_ctx=256, n_threads=1)) as m:
        return "".join(e.text for e in generate_one(m, m.tokenize(prompt), GREEDY))


@pytest.fixture(scope="module")
def dense(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("upcycle") / "dense.gguf", "qwen2")


def test_identical_experts_write_the_dense_models_text(dense: Path, tmp_path: Path) -> None:
    from gguf import GGUFReader

    moe = upcycle(dense, tmp_path / "moe.gguf", experts=4, used=2, noise=0.0)
    r = GGUFReader(moe)
    assert r.fields["general.architecture"].contents() == "llama"
    assert r.fields["llama.expert_count"].contents() == 4
    names = {t.name for t in r.tensors}
    assert "blk.0.ffn_up_exps.weight" in names and "blk.0.ffn_up.weight" not in names
    assert "blk.1.attn_q.bias" in names  # the biases llama loads when present
    for prompt in ("abc", "the cat"):
        assert _text(moe, prompt) == _text(dense, prompt)


def test_without_the_rope_permutation_the_text_differs(dense: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: the q/k rows left in rotate-half order change the output, so the
    equality above depends on the permutation."""
    import upcycle_moe

    monkeypatch.setitem(upcycle_moe.ROPE_ORDER, "qwen2", False)
    moe = upcycle(dense, tmp_path / "unpermuted.gguf", experts=2, used=1, noise=0.0)
    assert _text(moe, "the cat") != _text(dense, "the cat")


def test_perturbed_experts_are_routed_by_token(dense: Path, tmp_path: Path) -> None:
    from gguf import GGUFReader

    moe = upcycle(dense, tmp_path / "noisy.gguf", experts=4, used=2, noise=0.05, seed=1)
    r = GGUFReader(moe)
    up = next(t for t in r.tensors if t.name == "blk.0.ffn_up_exps.weight")
    experts = np.asarray(up.data)
    assert experts.shape[0] == 4 and not np.array_equal(experts[0], experts[1])
    ratio = experts[1] / experts[0]
    assert 0.7 < float(np.median(ratio)) < 1.3  # small perturbations of one FFN
    with LoadedModel(moe, LlamaParams(n_ctx=256, n_threads=1,
                                      stream_resident_bytes=1 << 30)) as m:
        s = m._streamer
        assert s is not None and s.n_expert == 4
        seen = []
        for prompt in ("abc abc abc", "zzz yyy xxx"):
            s.take_picks()
            list(generate_one(m, m.tokenize(prompt), GREEDY))
            seen.append(s.take_picks()[0])
    assert all(p.sum() > 0 for p in seen) and not np.array_equal(seen[0], seen[1])


def test_a_skewed_router_makes_hot_and_cold_experts_that_still_follow_the_tokens(
        dense: Path, tmp_path: Path) -> None:
    """`skew` leans each router towards the low experts along the mean of its input:
    llama.cpp's own picks (counted by the streamer) then favour expert 0 over expert 3
    by far, and still differ between prompts."""
    moe = upcycle(dense, tmp_path / "skewed.gguf", experts=4, used=2, noise=0.05, seed=1,
                  skew=1.5)
    with LoadedModel(moe, LlamaParams(n_ctx=256, n_threads=1,
                                      stream_resident_bytes=1 << 30)) as m:
        s = m._streamer
        assert s is not None
        seen = []
        for prompt in ("abc abc abc", "zzz yyy xxx"):
            s.take_picks()
            list(generate_one(m, m.tokenize(prompt), GREEDY))
            seen.append(sum(s.take_picks().values()))
    total = seen[0] + seen[1]
    assert total[0] == total.max() and total[0] > 2 * total[3] and total[3] == total.min()
    shares = [p / p.sum() for p in seen]
    assert np.abs(shares[0] - shares[1]).max() > 0.02  # the prompts route differently


def test_an_architecture_it_cannot_upcycle_is_refused(tmp_path: Path) -> None:
    swa = write_tiny_model(tmp_path / "gemma.gguf", "swa")
    with pytest.raises(ValueError, match="gemma3"):
        upcycle(swa, tmp_path / "x.gguf")
