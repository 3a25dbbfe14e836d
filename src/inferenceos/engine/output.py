"""The output processor: chosen tokens → text events, stop conditions and metrics.

One `OutputStream` per request turns each token the sampler (or the verifier) chose
into what the caller sees: bytes decoded incrementally as UTF-8 (a character split over
two tokens prints whole), text held back while it could begin a stop string, and the
end of the generation on end-of-generation, `max_tokens` or a stop string. It also keeps
the request's GenerationMetrics (TTFT, prompt and decode t/s, speculation counters).
"""

from __future__ import annotations

import codecs
import time
from collections.abc import Callable, Sequence

from inferenceos.engine.generation import GenerationMetrics
from inferenceos.engine.logprobs import TokenLogprob
from inferenceos.engine.messages import Event, Finished, TokenOut
from inferenceos.engine.sampling import SamplingParams
from inferenceos.engine.spec.ngram_replay import ReplayBudget
from inferenceos.engine.stop import StopMatcher

__all__ = ["Event", "Extra", "OutputStream", "snapshot"]

# what rides on a token's event: (its logprob, the top logprobs) when asked for, else ()
Extra = tuple[TokenLogprob, tuple[TokenLogprob, ...]] | tuple[()]


def snapshot(metrics: GenerationMetrics) -> GenerationMetrics:
    """A copy of `metrics` rounded as `to_json` rounds them: what a `Finished` carries,
    so a stream's figures are the same in process and across the worker pipe (where
    they travelled as JSON before events were typed)."""
    return GenerationMetrics.from_json(metrics.to_json())


class OutputStream:
    """Turns one request's chosen tokens into events (see module docstring)."""

    def __init__(
        self,
        req_id: int,
        sampling: SamplingParams,
        prompt_tokens: int,
        reused: int,
        arrival: float,
        piece: Callable[[int], bytes],
        is_eog: Callable[[int], bool],
        prompt: Sequence[int] | None = None,
        replays: ReplayBudget | None = None,
    ) -> None:
        """`prompt`: the prompt's tokens, given when the finished generation should
        replay n-gram drafting on its tokens (`GenerationMetrics.ngram_replay`), within
        `replays` (the scheduler's budget; None: a budget of its own)."""
        self.req_id = req_id
        self.sampling = sampling
        self.metrics = GenerationMetrics(prompt_tokens=prompt_tokens, cached_tokens=reused)
        self._arrival = arrival
        self._piece, self._is_eog = piece, is_eog
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stops = StopMatcher(sampling.stop)
        self._t_start = time.perf_counter()
        self._t_first = 0.0
        self._steps = 0
        self._prompt = prompt
        self._replays = replays if replays is not None else ReplayBudget()
        self._tokens: list[int] = []  # the chosen tokens, for the replay
        self.finished = False

    def push(self, token: int, extra: Extra = ()) -> list[Event]:
        """Account for one chosen token; `extra` (logprob, top logprobs) rides on its
        event. Sets `finished` (and stop_reason) when the generation is over: then the
        events end with the held-back text and the Finished event."""
        now = time.perf_counter()
        m = self.metrics
        if not self._t_first:
            self._t_first = now
            m.ttft_s = now - self._arrival
            prefill_s = now - self._t_start
            new = m.prompt_tokens - m.cached_tokens
            m.prompt_tps = new / prefill_s if prefill_s else 0.0
        else:
            self._steps += 1
            m.decode_tps = self._steps / (now - self._t_first)
        sp = self.sampling
        if self._is_eog(token) and not sp.ignore_eos:
            return self.finish("eos")
        if m.completion_tokens >= sp.max_tokens:
            return self.finish("length")
        m.completion_tokens += 1
        self._tokens.append(token)
        text = self._stops.feed(self._utf8.decode(self._piece(token)))
        events: list[Event] = [TokenOut(self.req_id, token, text, *extra)]
        if self._stops.stopped:
            return events + self.finish("stop")
        if m.completion_tokens >= sp.max_tokens:
            return events + self.finish("length")
        return events

    def finish(self, reason: str) -> list[Event]:
        """End the stream: flush held-back text, then Finished with the metrics."""
        self.metrics.stop_reason = reason
        self.finished = True
        if self._prompt is not None:  # drafted or not: one measure for every run
            replayed = self._replays.replay(self._prompt, self._tokens)
            self.metrics.ngram_replay = replayed.to_json() if replayed else None
        tail = self._stops.feed(self._utf8.decode(b"", final=True)) + self._stops.flush()
        events: list[Event] = [TokenOut(self.req_id, -1, tail)] if tail else []
        return [*events, self.done()]

    def done(self) -> Finished:
        """The Finished event, without flushing (cancellation, errors)."""
        self.finished = True
        return Finished(self.req_id, snapshot(self.metrics))
