"""A scheduler request: what a caller submits (prompt token ids, sampling, per-request
choices) before it runs in a slot.

It sits below everything that handles requests (running, scheduler, spec_decode) and
below the migration state that carries them (live_state, and so the pipe messages), so
each of them can name it without importing the others. `running.prompt_request` builds
one from text or token ids and media items.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from inferenceos.engine.sampling import SamplingParams
from inferenceos.engine.step_plan import MediaSpan


@dataclass
class Request:
    """One request for the scheduler; `prompt` holds token ids, and each media run's
    key (a negative id) once per cell it takes."""

    id: int
    prompt: list[int]
    sampling: SamplingParams
    arrival: float = field(default_factory=time.perf_counter)
    kv_policy: str | None = None  # None: the scheduler's default policy
    draft: str | None = None  # drafter name, "none", or None: the scheduler's default
    # media runs by key (media_encoder.MediaRun): `prompt` holds each key once per cell
    media: dict[int, Any] = field(default_factory=dict)
    progress: bool = False  # emit "progress" events while the prompt is processed

    @cached_property
    def spans(self) -> tuple[MediaSpan, ...]:
        """Where the prompt's media runs lie (consecutive cells carrying one key)."""
        spans: list[MediaSpan] = []
        i, prompt = 0, self.prompt if self.media else []
        while i < len(prompt):
            if prompt[i] >= 0:
                i += 1
                continue
            run = self.media[prompt[i]]
            spans.append(MediaSpan(i, i + run.n_tokens, run.non_causal))
            i += run.n_tokens
        return tuple(spans)
