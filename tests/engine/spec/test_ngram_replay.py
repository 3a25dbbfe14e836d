"""What n-gram drafting would have done on a plain generation (engine/spec/ngram_replay.py)."""

from __future__ import annotations

import random

from inferenceos.engine.spec.ngram_replay import (
    MAX_OUTPUT,
    MIN_OUTPUT,
    ReplayBudget,
    replay_ngram,
)


def _words(n: int, seed: int, vocab: int = 30000) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(n)]


def test_a_reply_that_quotes_its_prompt_is_drafted_in_long_accepted_runs() -> None:
    prompt = _words(300, 1)
    output = prompt[40:240] + _words(40, 2)
    r = replay_ngram(prompt, output)
    assert r is not None
    # every step emits its accepted drafts and one token: the counts add up exactly
    assert 1 + r.decode_steps + r.draft_accepted == len(output)
    assert r.draft_accepted >= 180 and r.decode_steps < 100
    assert r.draft_accepted / r.draft_tokens > 0.9


def test_free_text_without_repeats_is_never_drafted() -> None:
    r = replay_ngram(_words(200, 3), _words(300, 4))
    assert r is not None
    assert (r.draft_tokens, r.draft_accepted, r.decode_steps) == (0, 0, 299)


def test_a_greedy_loop_is_found_and_drafted() -> None:
    """A base model stuck repeating a phrase: the loop's continuation is drafted."""
    loop = [11, 12, 13, 14, 15, 16]
    r = replay_ngram(_words(50, 5), loop * 30)
    assert r is not None and r.draft_accepted > 150


def test_short_replies_and_long_ones_are_bounded() -> None:
    assert replay_ngram([1, 2, 3], [4] * (MIN_OUTPUT - 1)) is None
    r = replay_ngram([1, 2, 3], _words(MAX_OUTPUT + 500, 6))
    assert r is not None and 1 + r.decode_steps + r.draft_accepted == MAX_OUTPUT


def test_the_incremental_index_matches_as_the_scan_does() -> None:
    """NgramIndex (the replay's match, O(new tokens)) answers ngram_match's (start,
    length) at every length of growing sequences, small vocabularies (many repeats)
    and steps of several tokens included."""
    from inferenceos.engine.spec.ngram import NgramIndex, ngram_match

    rng = random.Random(7)
    for _ in range(300):
        vocab = rng.choice([2, 3, 5, 40])
        seq = [rng.randrange(vocab) for _ in range(rng.randrange(1, 150))]
        n_min = rng.choice([1, 2])
        index, end = NgramIndex(seq[:1], 4, n_min), 1
        while end < len(seq):
            step = rng.randrange(1, 4)
            index.extend(seq[end:end + step])
            end = min(end + step, len(seq))
            assert index.match() == ngram_match(seq[:end], 4, n_min)


def test_replays_take_a_bounded_share_of_the_schedulers_time() -> None:
    """A fake clock read 30 ms apart: each replay 'takes' 30 ms. With 50 ms in hand and
    1 % of the time refilling it, two replays run, the third is skipped (None), and a
    second later the budget allows one again."""
    t = [0.0]

    def clock() -> float:
        t[0] += 0.03
        return t[0]

    budget = ReplayBudget(share=0.01, burst_s=0.05, clock=clock)
    prompt, output = _words(50, 5), _words(40, 6)
    first = budget.replay(prompt, output)
    assert first == replay_ngram(prompt, output)
    assert budget.replay(prompt, output) is not None
    assert budget.replay(prompt, output) is None
    t[0] += 1.0
    assert budget.replay(prompt, output) == first
