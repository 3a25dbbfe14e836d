"""Stop strings over streamed text: never emit a stop string, nor text after it.

Text that could be the beginning of a stop string is held back until the next piece
shows whether it is one, so a streaming client never sees half of a stop string.
"""

from __future__ import annotations


class StopMatcher:
    """Feed generated text piece by piece; get back what is safe to emit."""

    def __init__(self, stops: tuple[str, ...] | list[str]) -> None:
        self.stops = tuple(s for s in stops if s)
        self._held = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        """Add `text`; return the part that can be emitted now.

        Once a stop string is seen, `stopped` becomes True and the returned text ends
        just before it; later calls return "".
        """
        if not self.stops:  # nothing to hold back (most requests): the text as it is
            return text
        if self.stopped:
            return ""
        buf = self._held + text
        cut = min((i for i in (buf.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            self._held = ""
            return buf[:cut]
        keep = self._longest_partial(buf)
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        """At the end of generation: release any held-back text."""
        held, self._held = self._held, ""
        return "" if self.stopped else held

    def _longest_partial(self, buf: str) -> int:
        """Length of the longest suffix of `buf` that is a proper prefix of a stop string."""
        best = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(buf)), best, -1):
                if buf.endswith(s[:n]):
                    best = n
                    break
        return best
