"""LoadedModel on real llama.cpp with tiny models: generation, sampling, limits, errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferenceos.engine.sampling import SamplingParams
from inferenceos.engine.scheduler import generate_one
from inferenceos.engine.session import LoadedModel
from inferenceos.errors import ModelLoadError, UsageError
from inferenceos.plan.llama_params import LlamaParams
from tiny_models import write_tiny_model

SMALL = LlamaParams(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1)


def generate_text(lm: LoadedModel, prompt: str, **sampling: object) -> tuple[list[int], str]:
    tokens: list[int] = []
    text = ""
    for ev in generate_one(lm, lm.tokenize(prompt), SamplingParams(**sampling)):  # type: ignore[arg-type]
        if ev.token >= 0:
            tokens.append(ev.token)
        text += ev.text
    return tokens, text


@pytest.fixture(scope="module")
def lm(tiny_llama: Path):
    with LoadedModel(tiny_llama, SMALL) as model:
        yield model


def test_greedy_is_deterministic(lm: LoadedModel) -> None:
    a, _ = generate_text(lm, "abc", temperature=0, max_tokens=16)
    b, _ = generate_text(lm, "abc", temperature=0, max_tokens=16)
    assert a == b
    assert len(a) == 16


def test_seed_reproduces_sampling_and_differs_across_seeds(lm: LoadedModel) -> None:
    runs = {
        seed: generate_text(
            lm, "abc", temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=seed, max_tokens=24
        )[0]
        for seed in (1, 1, 2)
    }
    again = generate_text(
        lm, "abc", temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=1, max_tokens=24
    )[0]
    assert runs[1] == again
    assert runs[1] != runs[2]


def test_max_tokens_and_metrics(lm: LoadedModel) -> None:
    tokens, _ = generate_text(lm, "hello", temperature=0, max_tokens=5)
    m = lm.metrics
    assert len(tokens) == 5 == m.completion_tokens
    assert m.stop_reason == "length"
    assert m.prompt_tokens == len(lm.tokenize("hello"))
    assert m.ttft_s > 0 and m.prompt_tps > 0 and m.decode_tps > 0


def test_zero_max_tokens_generates_nothing(lm: LoadedModel) -> None:
    tokens, text = generate_text(lm, "hello", temperature=0, max_tokens=0)
    assert tokens == [] and text == ""
    assert lm.metrics.stop_reason == "length"


def test_generation_capped_by_context(lm: LoadedModel) -> None:
    prompt = "ab " * 40
    n_prompt = len(lm.tokenize(prompt))
    tokens, _ = generate_text(lm, prompt, temperature=0, max_tokens=10_000)
    assert len(tokens) == lm.n_ctx - n_prompt


def test_prompt_longer_than_context_is_refused(lm: LoadedModel) -> None:
    with pytest.raises(UsageError, match="context holds 256"):
        generate_text(lm, "abc " * 400)


def test_stop_string_ends_generation(lm: LoadedModel) -> None:
    _, free_text = generate_text(lm, "abc", temperature=0, max_tokens=40)
    starts = [i for i in range(1, len(free_text) - 1) if "\ufffd" not in free_text[i : i + 2]]
    assert starts, "the fixture model should produce some printable text"
    stop = free_text[starts[0] : starts[0] + 2]
    _, text = generate_text(lm, "abc", temperature=0, max_tokens=40, stop=(stop,))
    assert stop not in text
    assert lm.metrics.stop_reason == "stop"
    assert free_text.startswith(text)


def test_tokenize_adds_one_bos(lm: LoadedModel) -> None:
    toks = lm.tokenize("<s>abc")  # text already starting with BOS
    assert toks[0] == lm.bos_token and toks[1] != lm.bos_token


def test_each_tiny_shape_loads_and_generates(tiny_moe: Path, tiny_swa: Path) -> None:
    for path in (tiny_moe, tiny_swa):
        with LoadedModel(path, SMALL) as model:
            tokens, _ = generate_text(model, "abc", temperature=0, max_tokens=4)
            assert len(tokens) == 4


def test_llama_cpp_refusal_is_a_clear_error(tmp_path: Path) -> None:
    # structurally valid GGUF, but llama.cpp finds a tensor missing
    from gguf import GGUFWriter

    src = write_tiny_model(tmp_path / "full.gguf", "llama")
    broken = tmp_path / "broken.gguf"
    from gguf import GGUFReader

    r = GGUFReader(src)
    w = GGUFWriter(str(broken), "llama")
    for field in r.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        w.add_key_value(
            field.name,
            field.contents(),
            field.types[0],
            field.types[-1] if len(field.types) > 1 else None,
        )
    for t in r.tensors:
        if t.name != "blk.1.ffn_down.weight":
            w.add_tensor(t.name, t.data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelLoadError, match="could not load"):
        LoadedModel(broken, SMALL)
