"""Which weights a disk-bound plan keeps in memory: the most reads per byte first.

A unit (engine/weights/layout.py) resident saves, at every token, the reads of its
bytes times the odds that the token reads it. `HEAD` and the blocks (on a routed model
their dense parts) are read by every token: odds 1. A routed expert is read when the
router picks it: its heat (the share of tokens that picked it, telemetry/expert_heat.py;
experts used / experts while nothing was seen). So the resident set is `HEAD`, the
blocks in order, then the experts hottest first, as far as the room holds them; an
untied embedding (`ROWS`) is never resident (a token reads one row of it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from inferenceos.engine.weights.layout import HEAD, Span, Unit, span_bytes

# a new resident set replaces the old one only when it saves this share more of the
# streamed reads per token: re-locking costs reads, and heat that wobbles around a tie
# would otherwise swap two experts back and forth
SWAP_GAIN = 0.02


def read_odds(unit: Unit, heat: Mapping[tuple[int, int], float]) -> float:
    """The chance a token reads `unit` (module doc)."""
    return heat.get(unit, 0.0) if isinstance(unit, tuple) else 1.0


def choose_resident(units: Mapping[Unit, list[Span]], blocks: Iterable[int], room: int,
                    heat: Mapping[tuple[int, int], float]) -> frozenset[Unit]:
    """The resident set within `room` bytes: `HEAD`, then `blocks` in order, then the
    experts of those blocks by heat (ties: the earlier layer, the lower index). A unit
    that does not fit is skipped and smaller ones after it still may."""
    blocks = list(blocks)
    watched = set(blocks)
    experts = sorted((u for u in units if isinstance(u, tuple) and u[0] in watched),
                     key=lambda u: (-heat.get(u, 0.0), u))
    chosen: set[Unit] = set()
    left = room
    order: list[Unit] = [HEAD, *blocks, *experts]
    for unit in order:
        size = span_bytes(units.get(unit, []))
        if unit in units and size <= left:
            chosen.add(unit)
            left -= size
    return frozenset(chosen)


def streamed_per_token(units: Mapping[Unit, list[Span]], resident: Iterable[Unit],
                       heat: Mapping[tuple[int, int], float], skip: Iterable[Unit] = ()
                       ) -> float:
    """Bytes a token is expected to read from the file: every unit outside `resident`
    and `skip` times its read odds."""
    out = set(resident) | set(skip)
    return sum(read_odds(u, heat) * span_bytes(s) for u, s in units.items() if u not in out)


def worth_swapping(units: Mapping[Unit, list[Span]], old: frozenset[Unit],
                   new: frozenset[Unit], heat: Mapping[tuple[int, int], float],
                   skip: Iterable[Unit] = ()) -> bool:
    """Whether `new` saves more than SWAP_GAIN of `old`'s streamed reads per token."""
    if new == old:
        return False
    before = streamed_per_token(units, old, heat, skip)
    after = streamed_per_token(units, new, heat, skip)
    return before - after > SWAP_GAIN * before
