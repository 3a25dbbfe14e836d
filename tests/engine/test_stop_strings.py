"""StopMatcher: stop strings split across streamed pieces."""

from __future__ import annotations

from inferenceos.engine.stop import StopMatcher


def feed_all(stops: list[str], pieces: list[str]) -> tuple[str, bool]:
    m = StopMatcher(stops)
    out = "".join(m.feed(p) for p in pieces)
    if not m.stopped:
        out += m.flush()
    return out, m.stopped


def test_no_stop_passes_everything() -> None:
    assert feed_all([], ["ab", "cd"]) == ("abcd", False)


def test_stop_inside_one_piece() -> None:
    assert feed_all(["END"], ["abcENDxyz"]) == ("abc", True)


def test_stop_split_across_pieces_is_never_emitted() -> None:
    m = StopMatcher(["END"])
    assert m.feed("abcE") == "abc"  # "E" held back: it may start "END"
    assert m.feed("N") == ""
    assert m.feed("Dtail") == ""
    assert m.stopped


def test_held_text_released_when_not_a_stop() -> None:
    m = StopMatcher(["END"])
    assert m.feed("xE") == "x"
    assert m.feed("gg") == "Egg"
    assert not m.stopped


def test_flush_releases_partial_at_end() -> None:
    assert feed_all(["END"], ["abcEN"]) == ("abcEN", False)


def test_earliest_of_several_stops_wins() -> None:
    assert feed_all(["bb", "a"], ["xxbba"]) == ("xx", True)


def test_nothing_after_stop() -> None:
    m = StopMatcher(["."])
    assert m.feed("one.") == "one"
    assert m.feed("two") == ""
