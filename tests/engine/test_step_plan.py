"""schedule(): the pure step planner (no llama.cpp)."""

from __future__ import annotations

from dataclasses import replace

from inferenceos.engine.step_plan import SeqNeeds, schedule


def create_needs(n_generating: int, prompts: list[int], draft: int = 0) -> list[SeqNeeds]:
    """`n_generating` decoding sequences (each with `draft` draft tokens), then one
    prefilling sequence per prompt length in `prompts`."""
    seqs = [SeqNeeds(i, 10, [1] * 5, 5, pending=7, draft=tuple(range(draft)))
            for i in range(n_generating)]
    seqs += [SeqNeeds(n_generating + j, 0, list(range(n)), 0) for j, n in enumerate(prompts)]
    return seqs


def test_decodes_come_first_then_prefill_chunks_within_budget() -> None:
    plan = schedule(create_needs(2, [30, 30]), budget=40, max_tokens=64)
    assert [(d.key, d.pos, d.tokens) for d in plan.decodes] == [(0, 10, (7,)), (1, 10, (7,))]
    # beside other sequences the first prompt ends in this step, its last token too
    assert [(p.key, p.start, len(p.tokens), p.last) for p in plan.prefills] == [
        (2, 0, 30, True), (3, 0, 8, False)]
    assert plan.n_tokens == 40


def test_a_lone_prompts_last_token_waits_for_a_step_of_its_own() -> None:
    [chunk] = schedule(create_needs(0, [30]), budget=64, max_tokens=64).prefills
    assert (chunk.start, len(chunk.tokens), chunk.last) == (0, 29, False)
    [last] = schedule([SeqNeeds(0, 29, list(range(30)), 29)], budget=64, max_tokens=64).prefills
    assert (last.start, last.tokens, last.last) == (29, (29,), True)


def test_beside_a_decode_or_another_prompt_the_last_token_takes_no_step_of_its_own() -> None:
    # the reply is batched with the others' rows whatever this step does (module doc, 2.)
    beside_decode = schedule(create_needs(1, [30]), budget=64, max_tokens=64)
    assert [(p.key, len(p.tokens), p.last) for p in beside_decode.prefills] == [(1, 30, True)]
    two_prompts = schedule(create_needs(0, [10, 12]), budget=64, max_tokens=64)
    assert [(p.key, len(p.tokens), p.last) for p in two_prompts.prefills] == [
        (0, 10, True), (1, 12, True)]


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


# -- media spans: a batch carries token ids or embeddings, never both ------------------

def _media_seq(key: int = 5, n_prefilled: int = 0, atomic: bool = False) -> SeqNeeds:
    """Prompt: 4 text tokens, a 10-cell media span (key -9), 3 text tokens."""
    from inferenceos.engine.step_plan import MediaSpan

    prompt = [1, 2, 3, 4, *([-9] * 10), 5, 6, 7]
    return SeqNeeds(key, n_prefilled, prompt, n_prefilled, media=(MediaSpan(4, 14, atomic),))


def test_a_text_chunk_stops_where_a_media_span_begins() -> None:
    [chunk] = schedule([_media_seq()], budget=64, max_tokens=64).prefills
    assert (chunk.start, chunk.tokens, chunk.last) == (0, (1, 2, 3, 4), False)


def test_a_media_span_gets_a_step_of_its_own_chunked_by_the_budget() -> None:
    gen = SeqNeeds(0, 10, [1] * 5, 5, pending=7)
    seqs = [gen, _media_seq(n_prefilled=4)]
    normal = schedule(seqs, budget=64, max_tokens=64)  # not media's turn: decode only
    assert normal.media is None and [d.key for d in normal.decodes] == [0]
    assert not normal.prefills
    media = schedule(seqs, budget=6, max_tokens=64, media_first=True)
    assert not media.decodes and not media.prefills and media.media is not None
    assert (media.media.start, len(media.media.tokens), media.media.last) == (4, 6, False)
    # the rest of the span next time, then the text after it
    rest = schedule([_media_seq(n_prefilled=10)], budget=64, max_tokens=64, media_first=True)
    assert rest.media is not None and (rest.media.start, len(rest.media.tokens)) == (10, 4)
    tail = schedule([_media_seq(n_prefilled=14)], budget=64, max_tokens=64, media_first=True)
    assert tail.media is None and tail.prefills[0].tokens == (5, 6)
    last = schedule([_media_seq(n_prefilled=16)], budget=64, max_tokens=64, media_first=True)
    assert last.prefills[0].tokens == (7,) and last.prefills[0].last


def test_a_prompts_last_token_is_evaluated_alone_as_after_a_cached_prefix() -> None:
    """Cold or with all but its last token cached, the last prompt token is the only row
    of its prefill work: llama.cpp's kernels sum a row differently in a batch of one."""
    cold = schedule(create_needs(0, [12]), budget=64, max_tokens=64)
    assert [(p.start, len(p.tokens), p.last) for p in cold.prefills] == [(0, 11, False)]
    (need,) = create_needs(0, [12])
    cached = schedule([replace(need, n_prefilled=11)], budget=64, max_tokens=64)
    assert [(p.start, len(p.tokens), p.last) for p in cached.prefills] == [(11, 1, True)]
    one = schedule(create_needs(0, [1]), budget=64, max_tokens=64)
    assert [(p.start, len(p.tokens), p.last) for p in one.prefills] == [(0, 1, True)]


def test_an_atomic_span_goes_whole_whatever_the_budget() -> None:
    plan = schedule([_media_seq(n_prefilled=4, atomic=True)], budget=3, max_tokens=64,
                    media_first=True)
    assert plan.media is not None and len(plan.media.tokens) == 10
