"""What n-gram drafting would have done on a generation, replayed on its tokens.

The planner chooses a drafter from what each one gave this model before
(plan/draft_choice.py). A drafter that never ran would never be chosen, so every
generation replays the `ngram` drafter on its own tokens when it ends: the same
`NgramDrafter` and per-sequence `DraftState` the scheduler uses, asked at each step
what it would draft, its draft compared with the tokens the model really chose. The
counts (draft tokens, accepted, verification steps) are what greedy verification would
have recorded; a sampled generation's acceptance is that of its own sample, close to
but not the speculative-sampling rule's. Timing is left out (the drafter's measured
pause rule needs real steps): the replay counts, the planner prices them. A run that
did draft is replayed too, so that its measured speed can be set against the replay's
promise in the same measure (plan/speculative.DraftEvidence.speedup).

Bounded, since it runs in the scheduler's loop when a reply ends: at most `MAX_OUTPUT`
output tokens are replayed, looking back over at most `WINDOW` tokens before them (a
lookup scans what it looks back over: ~70 ms for 512 unmatched steps over 4k tokens,
where the whole 128k prompt of a long context would take seconds). A quote from further
back than the window is missed: the replay then promises less than drafting gives.

And budgeted (`ReplayBudget`): a 128-token reply's replay takes ~1 ms, which at 8
streams of the tiny model (~27 replies a second) was 3 % of the worker's time, in the
step that every other stream waits on. The planner needs evidence, not a replay of
every reply (a run without one is left out: plan/speculative._counters), so replays
take at most `REPLAY_SHARE` of the scheduler's time; a fresh scheduler's first replays
(`REPLAY_BURST_S`) always run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from inferenceos.engine.kv.slots import shared_prefix
from inferenceos.engine.spec.ngram import NgramDrafter, NgramIndex, continuation, draft_cap
from inferenceos.engine.spec.speculative import DraftState

MAX_OUTPUT = 512  # output tokens replayed
WINDOW = 4096  # prompt tokens looked back over (the prompt's end)
MIN_OUTPUT = 8  # shorter replies say nothing about a drafter
REPLAY_SHARE = 0.002  # of the scheduler's time, at most, in replays
REPLAY_BURST_S = 0.05  # replay time a fresh scheduler has in hand (~50 short replies)


@dataclass(frozen=True)
class ReplayedDraft:
    """The counters a drafted run records (GenerationMetrics' draft fields)."""

    draft_tokens: int
    draft_accepted: int
    decode_steps: int

    def to_json(self) -> dict[str, int]:
        return {"draft_tokens": self.draft_tokens, "draft_accepted": self.draft_accepted,
                "decode_steps": self.decode_steps}


def replay_ngram(prompt: Sequence[int], output: Sequence[int]) -> ReplayedDraft | None:
    """Replay n-gram drafting over `output` (the generated tokens, in order) after
    `prompt`; None for an output shorter than MIN_OUTPUT. The first output token comes
    from the prompt's prefill (no draft); each later step drafts what the drafter and the
    sequence's DraftState would ask for, accepts the prefix equal to `output`, and
    emits one token more (the correction, or the token after a fully accepted draft)."""
    output = list(output[:MAX_OUTPUT])
    if len(output) < MIN_OUTPUT:
        return None
    prompt = prompt[-WINDOW:]
    drafter = NgramDrafter()
    state = DraftState(drafter, k=drafter.k_start, k_max=drafter.k_max, clock=lambda: 0.0)
    index = NgramIndex([*prompt, output[0]], drafter.n_max, drafter.n_min)
    done, tokens, accepted, steps = 1, 0, 0, 0
    while done < len(output):
        room = len(output) - done - 1  # the step's own token is not a draft
        k, min_match = state.want(done, room), 0
        if k == 0:
            k, min_match = state.sure_ask(done, room)
        draft = _propose(drafter, index, k, min_match)
        n_acc = shared_prefix(draft, output[done:])  # greedy verification's rule
        if draft:
            tokens, accepted = tokens + len(draft), accepted + n_acc
            state.update(len(draft), n_acc, done)
        steps += 1
        new = output[done:done + n_acc + 1]
        index.extend(new)
        done += len(new)
    return ReplayedDraft(tokens, accepted, steps)


class ReplayBudget:
    """The replay time one scheduler may spend (module doc): a token bucket that fills
    at `share` seconds a second up to `burst_s`, and that each replay empties by what
    it took. A replay runs while the bucket is not empty."""

    def __init__(self, share: float = REPLAY_SHARE, burst_s: float = REPLAY_BURST_S,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self._share, self._burst, self._clock = share, burst_s, clock
        self._credit = burst_s
        self._last = clock()

    def replay(self, prompt: Sequence[int], output: Sequence[int]) -> ReplayedDraft | None:
        """`replay_ngram(prompt, output)`, or None while the budget is spent."""
        now = self._clock()
        self._credit = min(self._burst, self._credit + (now - self._last) * self._share)
        self._last = now
        if self._credit <= 0:
            return None
        try:
            return replay_ngram(prompt, output)
        finally:
            self._last = self._clock()
            self._credit -= self._last - now


def _propose(drafter: NgramDrafter, index: NgramIndex, k: int, min_match: int) -> list[int]:
    """`drafter.propose([DraftAsk(0, index.tokens, k, min_match)])[0][:k]`, with the
    match from the incremental index (the same answer, without a scan per step)."""
    if k <= 0:
        return []
    start, length = index.match()
    kk = min(k, draft_cap(length, drafter.k_max)) if length >= max(1, min_match) else 0
    return continuation(index.tokens, start, kk)[:k] if kk else []
