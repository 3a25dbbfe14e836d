"""Verification steps shaped to the CPU kernels' column tile (engine/spec/row_shape.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from inferenceos.engine.sampling import SamplingParams
from inferenceos.engine.scheduler import Request, Scheduler
from inferenceos.engine.session import LoadedModel
from inferenceos.engine.spec.ngram import NgramDrafter
from inferenceos.engine.spec.row_shape import head_type, row_multiple, shape_drafts
from inferenceos.engine.spec.speculative import DraftAsk
from inferenceos.plan.llama_params import LlamaParams
from scheduler_helpers import drain

AVX2 = "CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | LLAMAFILE = 1 | "
AVX512 = "CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | AVX512 = 1 | LLAMAFILE = 1 | "
NEON = "CPU : NEON = 1 | ARM_FMA = 1 | FP16_VA = 1 | LLAMAFILE = 1 | "


def test_row_multiple_is_the_kernels_column_tile_for_a_cpu_head_it_multiplies() -> None:
    assert row_multiple(AVX2, "Q8_0", head_on_cpu=True) == 2
    assert row_multiple(AVX512, "Q8_0", head_on_cpu=True) == 4
    assert row_multiple(AVX2, "F16", head_on_cpu=True) == 2
    # ggml's own kernels (K-quants on x86) have no leftover pass; nor does a GPU head
    assert row_multiple(AVX2, "Q6_K", head_on_cpu=True) == 1
    assert row_multiple(AVX2, "Q8_0", head_on_cpu=False) == 1
    assert row_multiple(NEON, "Q8_0", head_on_cpu=True) == 1
    assert row_multiple(AVX2, None, head_on_cpu=True) == 1


def test_head_type_reads_the_output_or_the_tied_embedding(tiny_llama: Path, tmp_path: Path) -> None:
    assert head_type(tiny_llama) in {"F32", "F16", "Q8_0"}
    assert head_type(tmp_path / "missing.gguf") is None
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 10)
    assert head_type(bad) is None


def test_odd_rows_round_up_with_spare_tokens() -> None:
    # one sequence wanting 2 drafts: 3 rows; its spare token makes 4
    assert shape_drafts([[1, 2, 3]], [2], 0, 2) == [[1, 2, 3]]
    # already even: the spare is not used
    assert shape_drafts([[1, 2, 3, 4]], [3], 0, 2) == [[1, 2, 3]]
    # a multiple of 4: 1 + 2 rows short of 4 by 1 → one spare used
    assert shape_drafts([[1, 2, 9]], [2], 0, 4) == [[1, 2, 9]]


def test_odd_rows_round_down_from_the_longest_draft_without_spares() -> None:
    assert shape_drafts([[1, 2]], [2], 0, 2) == [[1]]
    assert shape_drafts([[1, 2]], [1], 0, 2) == [[1]]  # 2 rows: the spare is not needed
    # two drafting sequences and one plain row: 1 + 2 + 4 = 7 rows → the longer loses one
    assert shape_drafts([[1], [5, 6, 7]], [1, 3], 1, 2) == [[1], [5, 6]]
    # a one-token draft beside another plain row: 3 rows → the draft goes (2 plain rows)
    assert shape_drafts([[4]], [1], 1, 2) == [[]]
    # a multiple of 4: 6 rows with nothing spare → trims 2 to reach 4
    assert shape_drafts([[1, 2, 3, 4, 5]], [5], 0, 4) == [[1, 2, 3]]


def test_no_shaping_only_cuts_to_the_wanted_length() -> None:
    assert shape_drafts([[1, 2, 3]], [2], 0, 1) == [[1, 2]]
    assert shape_drafts([], [], 3, 2) == []


def test_ngram_adds_spares_past_its_trust_but_not_without_a_match() -> None:
    passage = list(range(100, 160))
    copying = [*passage, 7, 8, *passage[:3]]  # a 3-token match: trusted for 2 tokens
    assert NgramDrafter().propose([DraftAsk(0, copying, 48)]) == [passage[3:5]]
    assert NgramDrafter().propose([DraftAsk(0, copying, 48, spare=1)]) == [passage[3:6]]
    assert NgramDrafter().propose([DraftAsk(0, [4, 5, 6, 7], 48, spare=3)]) == [[]]


# -- in the scheduler, on a real model ---------------------------------------------------

GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
PROMPTS = ["a b c d e f g h a b c d e f g h a b c", "one two three one two three one",
           "x y x y x y x y", "hello world hello"]


@pytest.fixture(scope="module")
def lm(tiny_llama: Path) -> Iterator[LoadedModel]:
    s = LlamaParams(n_ctx=256 * 4, n_batch=64, n_ubatch=64, n_seq_max=4, n_threads=1)
    with LoadedModel(tiny_llama, s) as model:
        yield model


def _run(lm: LoadedModel, multiple: int, draft: str | None = "ngram",
         prompts: list[str] = PROMPTS, sampling: SamplingParams = GREEDY,
         ) -> tuple[list[list[int]], list[int], int, int]:
    """Every prompt through a 4-slot scheduler (drafter `draft`) whose row multiple is
    `multiple`: (outputs, the logit row count of every decode-only step, drafted
    tokens, decode steps summed over the sequences)."""
    sched = Scheduler(lm, 4, 64, draft=draft)
    sched.spec_decode.row_multiple = multiple
    rows: list[int] = []
    decode = sched.executor.decode

    def counting() -> int:
        b = sched.executor.batch.raw
        outputs = sum(int(b.logits[i]) for i in range(b.n_tokens))
        if outputs == b.n_tokens:  # every row wants logits: no prompt in the step
            rows.append(outputs)
        return decode()

    sched.executor.decode = counting  # type: ignore[method-assign]
    for i, text in enumerate(prompts):
        sched.submit(Request(i, lm.tokenize(text), sampling))
    out, done = drain(sched)
    sched.close()
    drafted = sum(d["draft_tokens"] for d in done.values())
    steps = sum(d["decode_steps"] for d in done.values())
    return [out[i] for i in range(len(prompts))], rows, drafted, steps


def test_drafting_steps_verify_an_even_number_of_rows_and_greedy_text_is_unchanged(
    lm: LoadedModel,
) -> None:
    plain_sched = Scheduler(lm, 4, 64)
    for i, text in enumerate(PROMPTS):
        plain_sched.submit(Request(i, lm.tokenize(text), GREEDY))
    plain, _ = drain(plain_sched)
    plain_sched.close()
    unshaped, rows1, drafted1, _ = _run(lm, 1)
    shaped, rows2, drafted2, _ = _run(lm, 2)
    assert drafted1 > 0 and drafted2 > 0 and rows2
    assert any(r % 2 for r in rows1)  # unshaped, some steps verify odd row counts
    # (the prompts are all prefilled in the first step, before anything drafts: a
    # prompt's last row riding along a drafting step would not be shaped)
    assert all(r % 2 == 0 for r in rows2 if r > 1), rows2
    assert shaped == unshaped == [plain[i] for i in range(len(PROMPTS))]


def test_odd_plain_steps_get_a_free_guessed_row_and_the_text_is_unchanged(
    lm: LoadedModel,
) -> None:
    three = PROMPTS[1:]  # three greedy streams, no drafter: 3 logit rows a step
    odd, rows1, _, steps1 = _run(lm, 1, None, three)
    even, rows2, drafted, steps2 = _run(lm, 2, None, three)
    assert rows1 and all(r % 2 for r in rows1 if r > 1)  # 3 (or 1 once two have ended)
    # (the three prompts end in their first step, last tokens included: beside each
    # other none takes a step of its own, engine/step_plan.py; so every all-logits
    # step is a decode step, and shaped)
    assert rows2 and all(r % 2 == 0 for r in rows2 if r > 1), rows2
    assert even == odd
    assert drafted == 0  # guesses are not a drafter's drafts
    # the texts repeat themselves: some guesses are right, so fewer sequence steps
    assert steps2 < steps1


def test_sampled_and_lone_streams_get_no_guess(lm: LoadedModel) -> None:
    sampled = SamplingParams(temperature=0.8, seed=7, max_tokens=24, ignore_eos=True)
    a, rows1, _, _ = _run(lm, 1, None, PROMPTS[1:], sampled)
    b, rows2, _, _ = _run(lm, 2, None, PROMPTS[1:], sampled)
    assert a == b and rows1 == rows2 and 3 in rows2  # a fixed seed replays: no guesses
    _, lone, _, _ = _run(lm, 2, None, PROMPTS[:1])
    assert set(lone) == {1}  # one row takes the matrix-vector kernel: never padded
