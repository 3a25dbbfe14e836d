"""The public Python API (`import inferenceos`) on tiny models: contracts and errors."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import inferenceos
from cli_helpers import cli_env
from inferenceos.errors import ModelNotFoundError, UsageError
from tiny_models import write_tiny_model


@pytest.fixture(scope="module")
def model(tiny_llama: Path) -> Iterator[inferenceos.Model]:
    with inferenceos.load(tiny_llama, n_ctx=256, threads=1) as m:
        yield m


def test_import_is_cheap_and_lazy() -> None:
    """`import inferenceos` loads neither llama.cpp nor numpy nor the engine."""
    code = ("import sys, inferenceos; heavy = [m for m in ('llama_cpp', 'numpy', 'gguf', "
            "'inferenceos.api', 'inferenceos.engine.session') if m in sys.modules]; "
            "print(heavy); print(callable(inferenceos.load))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=cli_env(), timeout=60)
    assert r.stdout.split("\n")[:2] == ["[]", "True"], r.stderr
    assert {"load", "pull", "list", "simulate", "Model"} <= set(dir(inferenceos))
    with pytest.raises(AttributeError):
        inferenceos.no_such_thing  # noqa: B018


def test_generate_text_and_metrics(model: inferenceos.Model) -> None:
    done = model.generate("abc", max_tokens=8, temperature=0)
    assert isinstance(done, inferenceos.Completion) and str(done) == done.text
    m = done.metrics
    assert m.completion_tokens == 8 and done.finish_reason == "length"
    assert m.prompt_tokens == len(model.tokenize("abc")) and m.ttft_s > 0
    # greedy is deterministic, and token ids work as a prompt
    assert model.generate(model.tokenize("abc"), max_tokens=8, temperature=0).text == done.text


def test_stream_matches_whole_and_can_stop_early(model: inferenceos.Model) -> None:
    whole = model.generate("abc", max_tokens=10, temperature=0).text
    stream = model.generate("abc", stream=True, max_tokens=10, temperature=0)
    assert "".join(stream) == whole == stream.text
    assert stream.metrics.completion_tokens == 10
    with model.generate("abc", stream=True, max_tokens=200, temperature=0) as early:
        first = next(iter(early))
    assert first and early.metrics.stop_reason == "interrupted"
    # the slot was freed: the next request runs
    assert model.generate("abc", max_tokens=3, temperature=0).metrics.completion_tokens == 3


def test_chat_uses_the_template_and_reuses_the_prefix(model: inferenceos.Model) -> None:
    msgs = [{"role": "user", "content": "hello"}]
    assert "<|im_start|>user\nhello<|im_end|>" in model.chat_prompt(msgs)
    first = model.chat(msgs, max_tokens=5, temperature=0)
    again = model.chat([*msgs, {"role": "assistant", "content": first.text},
                        {"role": "user", "content": "more"}], max_tokens=5, temperature=0)
    assert again.metrics.cached_tokens > 0


def test_base_model_chats_in_a_transcript(tmp_path: Path) -> None:
    path = write_tiny_model(tmp_path / "base.gguf", chat_template=None)
    with inferenceos.load(path, n_ctx=256, threads=1) as base:
        assert not base.has_chat_template
        prompt = base.chat_prompt([{"role": "system", "content": "be nice"},
                                   {"role": "user", "content": "hi"}])
        assert prompt == "System: be nice\nUser: hi\nAssistant:"
        reply = base.chat([{"role": "user", "content": "hi"}], max_tokens=6, temperature=0)
        assert "\nUser:" not in reply.text


def test_embed(model: inferenceos.Model) -> None:
    [one] = model.embed("abc")
    two = model.embed(["abc", "xyz"])
    assert len(two) == 2 and two[0] == pytest.approx(one)
    assert sum(v * v for v in one) == pytest.approx(1.0, abs=1e-4)
    with pytest.raises(UsageError):
        model.embed([])


def test_bad_options_are_refused(model: inferenceos.Model) -> None:
    with pytest.raises(UsageError, match=r"unknown sampling option.*temprature"):
        model.generate("abc", temprature=0.1)
    with pytest.raises(UsageError, match="top-p"):
        model.generate("abc", top_p=3)
    with pytest.raises(UsageError, match="message"):
        model.chat(["not a message"])
    for bad in ({"n_ctx": -1}, {"threads": -2}, {"batch": -1}, {"n_parallel": 0}):
        with pytest.raises(UsageError):
            inferenceos.load("", **bad)


def test_models_by_path_name_and_errors(tiny_llama: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="no such model file"):
        inferenceos.load(tmp_path / "missing.gguf")
    with pytest.raises(ModelNotFoundError, match="not a model file"):
        inferenceos.load(tmp_path)
    with pytest.raises(ModelNotFoundError, match="not found"):
        inferenceos.load("no-such-model")
    with pytest.raises(ModelNotFoundError):
        inferenceos.load("../no/such/model")
    entry = inferenceos.pull(str(tiny_llama))
    assert entry.name in [e.name for e in inferenceos.list()]
    with inferenceos.load(entry.name, n_ctx=256, threads=1) as m:
        assert m.path.read_bytes() == tiny_llama.read_bytes()
        assert m.generate("abc", max_tokens=2).metrics.completion_tokens == 2


def test_simulate_without_loading(tiny_llama: Path) -> None:
    p = inferenceos.simulate(tiny_llama, prompt_tokens=64, output_tokens=16)
    assert p.plan.feasible and p.decode_tps > 0
    assert p.to_json()["workload"]["prompt_tokens"] == 64


def test_isolated_model_runs_in_a_worker(tiny_llama: Path) -> None:
    import os

    with inferenceos.load(tiny_llama, n_ctx=256, threads=1, isolated=True) as m:
        assert m.engine.worker_pid != os.getpid()
        local = inferenceos.load(tiny_llama, n_ctx=256, threads=1)
        try:
            assert (m.generate("abc", max_tokens=6, temperature=0).text
                    == local.generate("abc", max_tokens=6, temperature=0).text)
        finally:
            local.close()


def test_closed_model_refuses_work(tiny_llama: Path) -> None:
    from inferenceos.errors import WorkerDiedError

    m = inferenceos.load(tiny_llama, n_ctx=256, threads=1)
    m.close()
    m.close()  # idempotent
    with pytest.raises(WorkerDiedError):
        m.generate("abc")


def test_state_export_import_round_trip(tiny_llama: Path, tiny_swa: Path) -> None:
    """A conversation's KV cells move to a fresh engine and are reused there."""
    with inferenceos.load(tiny_llama, n_ctx=256, threads=1) as a:
        prompt = a.tokenize("abc abc abc")
        a.generate(prompt, max_tokens=4, temperature=0)
        tokens, data = a.engine.export_state(prompt)
        assert tokens == prompt[: len(tokens)] and len(tokens) >= len(prompt) - 1
    with inferenceos.load(tiny_llama, n_ctx=256, threads=1) as b:
        assert b.engine.import_state(tokens, data) == len(tokens)
        again = b.generate(prompt + b.tokenize("d", add_special=False), max_tokens=2)
        assert again.metrics.cached_tokens == len(tokens)
    # another layout (llama.cpp checks it; a model of the same shape would pass: the
    # server's sessions check the file's digest too)
    with inferenceos.load(tiny_swa, n_ctx=256, threads=1) as other:
        from inferenceos.errors import GenerationError

        with pytest.raises(GenerationError):
            other.engine.import_state(tokens, data)


@pytest.mark.parametrize("isolated", [False, True], ids=["local", "worker"])
def test_a_stream_closed_before_reading_frees_its_slot(tiny_llama: Path,
                                                       isolated: bool) -> None:
    with inferenceos.load(tiny_llama, n_ctx=256, threads=1, isolated=isolated) as m:
        for _ in range(3):  # one slot: a leaked request would block the next ones
            m.generate("abc", stream=True, max_tokens=200).close()
        stats = m.engine.stats()
        assert stats["running"] == 0 and stats["waiting"] == 0
        # ignore_eos: the default (random) sampling can draw the tiny model's end-of-text
        assert m.generate("abc", max_tokens=3, ignore_eos=True).metrics.completion_tokens == 3


def test_chat_and_generate_take_images_as_paths_bytes_or_base64(
    tiny_vlm_pair: tuple[Path, Path], tmp_path: Path,
) -> None:
    import base64

    import numpy as np
    from PIL import Image

    from inferenceos.errors import MediaError

    model, _ = tiny_vlm_pair
    paths = []
    for seed in (1, 2):
        rgb = np.random.default_rng(seed).integers(0, 256, (30, 40, 3), dtype=np.uint8)
        Image.fromarray(rgb).save(tmp_path / f"{seed}.png")
        paths.append(tmp_path / f"{seed}.png")
    raw = paths[0].read_bytes()
    with inferenceos.load(model, threads=1) as m:  # the projector beside it is found
        def ask(img: object) -> str:
            msg = {"role": "user", "content": "what is it", "images": [img]}
            return m.chat([msg], temperature=0, max_tokens=8).text

        by_path = ask(str(paths[0]))
        assert ask(raw) == by_path == ask(base64.b64encode(raw).decode())
        assert ask(paths[1]) != by_path
        with pytest.raises(MediaError):
            ask(b"not an image")
        out = m.generate("describe", images=[paths[0]], temperature=0, max_tokens=4)
        assert out.metrics.prompt_tokens > 16
    with inferenceos.load(model, threads=1, mmproj="none") as blind, \
            pytest.raises(UsageError, match="projector"):
        blind.chat([{"role": "user", "content": "x", "images": [raw]}], max_tokens=2)
