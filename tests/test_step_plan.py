"""schedule(): the pure step planner (no llama.cpp)."""

from __future__ import annotations

from inferenceos.engine.step_plan import SeqNeeds, schedule


def create_needs(n_generating: int, prompts: list[int], draft: int = 0) -> list[SeqNeeds]:
    """`n_generating` decoding sequences (each with `draft` draft tokens), then one
    prefilling sequence per prompt length in `prompts`."""
    seqs = [SeqNeeds(i, 10, [1] * 5, 5, pending=7, draft=tuple(range(draft)))
            for i in range(n_generating)]  # fmt: skip
    seqs += [SeqNeeds(n_generating + j, 0, list(range(n)), 0) for j, n in enumerate(prompts)]
    return seqs


def test_decodes_come_first_then_prefill_chunks_within_budget() -> None:
    plan = schedule(create_needs(2, [30, 30]), budget=40, max_tokens=64)
    assert [(d.key, d.pos, d.tokens) for d in plan.decodes] == [(0, 10, (7,)), (1, 10, (7,))]
    assert [(p.key, p.start, len(p.tokens), p.last) for p in plan.prefills] == [
        (2, 0, 30, True), (3, 0, 8, False)]  # fmt: skip
    assert plan.n_tokens == 40


def test_prefill_resumes_where_it_stopped() -> None:
    seq = SeqNeeds(0, 8, list(range(20)), 8)
    [chunk] = schedule([seq], budget=5, max_tokens=64).prefills
    assert (chunk.start, chunk.tokens, chunk.last) == (8, (8, 9, 10, 11, 12), False)


def test_drafts_ride_with_the_pending_token_and_count_against_the_budget() -> None:
    plan = schedule(create_needs(2, [30], draft=4), budget=16, max_tokens=64)
    assert [d.tokens for d in plan.decodes] == [(7, 0, 1, 2, 3)] * 2
    assert plan.n_decode_tokens == 10 and len(plan.prefills[0].tokens) == 6


def test_drafts_are_trimmed_to_the_batch_limit_never_the_pending_tokens() -> None:
    plan = schedule(create_needs(3, [], draft=4), budget=100, max_tokens=8)
    assert [d.tokens for d in plan.decodes] == [(7, 0, 1, 2, 3), (7, 0), (7,)]
    assert plan.n_tokens == 8


def test_nothing_to_do_is_an_empty_plan() -> None:
    assert not schedule([], budget=8, max_tokens=8)
