"""Helpers for tests that step a Scheduler directly."""

from __future__ import annotations

from inferenceos.engine.scheduler import Scheduler


def drain(sched: Scheduler) -> tuple[dict[int, list[int]], dict[int, dict]]:
    """Step `sched` until it has no work: (tokens by request, "done" payload by
    request). Any error event fails the test."""
    tokens: dict[int, list[int]] = {}
    done: dict[int, dict] = {}
    while sched.has_work():
        for rid, kind, payload in sched.step():
            assert kind != "error", payload
            if kind == "token" and payload[0] >= 0:
                tokens.setdefault(rid, []).append(payload[0])
            elif kind == "done":
                done[rid] = payload
    return tokens, done
