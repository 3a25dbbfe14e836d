"""Helpers for tests that step a Scheduler directly."""

from __future__ import annotations

from inferenceos.engine.core import EngineCore
from inferenceos.engine.messages import Failed, Finished, TokenOut
from inferenceos.engine.scheduler import Scheduler


def drain(sched: Scheduler) -> tuple[dict[int, list[int]], dict[int, dict]]:
    """Step `sched` until it has no work: (tokens by request, the Finished metrics by
    request, as JSON). Any Failed event fails the test."""
    tokens: dict[int, list[int]] = {}
    done: dict[int, dict] = {}
    for events in EngineCore(lambda: sched).steps():
        for ev in events:
            assert not isinstance(ev, Failed), ev
            if isinstance(ev, TokenOut) and ev.token >= 0:
                tokens.setdefault(ev.req_id, []).append(ev.token)
            elif isinstance(ev, Finished):
                done[ev.req_id] = ev.metrics.to_json()
    return tokens, done
