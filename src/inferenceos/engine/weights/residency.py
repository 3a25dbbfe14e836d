"""What of a model's weights is in memory, and what reading the rest costs per token.

`WeightResidency` (one per loaded model, in its worker) makes the `weights` record of
`stats()` (engine/messages.py `WeightStats`):
- the planned split: `resident_bytes` the engine keeps in memory and `streamed_bytes`
  it reads back from the file while decoding. With a LayerStreamer (engine/weights/prefetch.py):
  its resident set and the other layers. A disk-bound plan without one (a caller
  with its own cb_eval): the plan's page-cache tier and the rest. Otherwise every
  tensor byte is resident and nothing streams;
- `mapped_resident_bytes`: bytes of llama.cpp's mapping of the file in memory now
  (mincore over each mapped region, found in /proc/self/maps), sampled at most every
  `sample_s` seconds (one syscall and a byte count per region: about a millisecond
  per GiB mapped); absent when the file is not mapped (use_mmap off);
- `page_ins` (major faults, getrusage) and `read_bytes` (/proc/self/io: storage
  reads this process caused, the streamer's read-ahead included) since the load, and
  both per decoded token over the last window: from the previous report at which
  tokens had been decoded to this one (prefill's reads fall in the window of the
  tokens after it). They are the worker process's counters: on a streamed model
  nearly all are the weights', otherwise they also hold the KV store's disk reads;
- with routed experts and a streamer watching the router: `expert_hit_ratio`, the
  share of the router's picks since the previous sample whose expert was in memory
  at this sample, each pick weighted by the share of its expert's pages in core (a
  half-resident expert counts half). Absent for dense models and without a streamer.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from inferenceos.engine.weights.stats import WeightStats

if TYPE_CHECKING:
    from inferenceos.engine.session import LoadedModel
    from inferenceos.engine.weights.prefetch import LayerStreamer

SAMPLE_S = 5.0


@dataclass(frozen=True)
class Region:
    """One mapped region of the file: addresses [start, end) hold file bytes from
    `offset` on."""

    start: int
    end: int
    offset: int


def mapped_regions(path: Path) -> list[Region]:
    """This process's readable mappings of `path` (llama.cpp's, after it unmapped the
    fragments it does not use); [] without /proc or when the file is not mapped."""
    real = str(Path(path).resolve())
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        f = line.split(maxsplit=5)
        if len(f) == 6 and f[5] == real and f[1].startswith("r"):
            lo, hi = (int(x, 16) for x in f[0].split("-"))
            out.append(Region(lo, hi, int(f[2], 16)))
    return out


def process_io() -> tuple[int, int]:
    """(major faults, bytes read from storage) of this process so far; the bytes are
    0 where /proc/self/io is unreadable."""
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_majflt
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("read_bytes:"):
                return faults, int(line.split()[1])
    except OSError:
        pass
    return faults, 0


class _Core:
    """mincore over the file's mapped regions: which pages are in memory now."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        self.regions: list[tuple[Region, np.ndarray]] = []
        self._sums: list[np.ndarray] = []

    def sample(self) -> bool:
        """Read the residency of every mapped page; False when nothing is mapped."""
        page, out = mmap.PAGESIZE, []
        for r in mapped_regions(self.path):
            vec = np.zeros((r.end - r.start + page - 1) // page, np.uint8)
            if self._libc.mincore(ctypes.c_void_p(r.start), ctypes.c_size_t(r.end - r.start),
                                  vec.ctypes.data_as(ctypes.c_void_p)) != 0:
                continue  # unmapped since /proc/self/maps was read
            out.append((r, (vec & 1).astype(bool)))
        self.set(out)
        return bool(out)

    def set(self, regions: list[tuple[Region, np.ndarray]]) -> None:
        """Take `regions` (page in core or not) as the sample, indexed by running sums
        so that each range's count is two lookups (a MoE has ~10^4 expert slices)."""
        self.regions = regions
        self._sums = [np.concatenate(([0], np.cumsum(v, dtype=np.int64))) for _, v in regions]

    def resident_bytes(self) -> int:
        return sum(int(c[-1]) for c in self._sums) * mmap.PAGESIZE

    def fraction(self, ranges: list[tuple[int, int]]) -> float:
        """Share of the pages of these file byte ranges in memory (unmapped: 0)."""
        page, have, total = mmap.PAGESIZE, 0, 0
        for lo, hi in ranges:
            total += (hi - 1) // page - lo // page + 1
            for (r, v), sums in zip(self.regions, self._sums, strict=True):
                a, b = max(lo, r.offset), min(hi, r.offset + len(v) * page)
                if a < b:
                    have += int(sums[(b - 1 - r.offset) // page + 1] - sums[(a - r.offset) // page])
        return have / total if total else 0.0


class WeightResidency:
    """The `weights` record of one loaded model's stats (module doc). Not
    thread-safe: `count()` and `report()` from the worker's loop."""

    def __init__(self, path: Path, resident: int, streamed: int,
                 streamer: LayerStreamer | None = None,
                 sample_s: float = SAMPLE_S) -> None:
        self.path, self.streamer, self.sample_s = Path(path), streamer, sample_s
        self.planned = (resident, streamed)
        self.tokens = 0
        self._core = _Core(self.path)
        self._sampled_at: float | None = None
        self._mapped: int | None = None
        self._start = process_io()
        self._window = (0, *self._start)  # (tokens, faults, read bytes) at its start
        self._per_token: tuple[float, float] | None = None
        # the streamer's own expert units (no second walk over the file's header)
        self._experts = {u: [(sp.start, sp.end) for sp in spans]
                         for u, spans in (streamer.units.items() if streamer else ())
                         if isinstance(u, tuple)}
        self._hit: float | None = None

    @classmethod
    def of(cls, lm: LoadedModel, streamer: LayerStreamer | None,
           tensor_bytes: int | None = None) -> WeightResidency:
        """For `lm` as it was loaded, its streamer (None: nothing streams).
        `tensor_bytes`: the file's tensor data (ModelSpec.tensor_data_size, which the
        worker has), else measured from the tensor table (a parse of the header)."""
        if streamer is not None:
            return cls(lm.path, streamer.resident_bytes, streamer.streamed_bytes, streamer)
        if tensor_bytes is None:
            from inferenceos.engine.weights.layout import layer_spans

            tensor_bytes = sum(s.end - s.start for spans in layer_spans(lm.path).values()
                               for s in spans)
        total = tensor_bytes
        page_cache = lm.settings.stream_resident_bytes  # a disk-bound plan, not streamed
        resident = min(total, page_cache) if page_cache > 0 else total
        return cls(lm.path, resident, total - resident)

    def count(self, tokens: int) -> None:
        """`tokens` more decoded (the worker counts the TokenOut events it sends)."""
        self.tokens += tokens

    def report(self) -> WeightStats:
        """The record now (module doc); cheap between samples."""
        now = time.monotonic()
        if self._sampled_at is None or now - self._sampled_at >= self.sample_s:
            self._sampled_at = now
            self._mapped = self._core.resident_bytes() if self._core.sample() else None
            self._hit = self._hit_ratio()
        faults, read = process_io()
        self._advance(faults, read)
        out: WeightStats = {
            "resident_bytes": self.planned[0], "streamed_bytes": self.planned[1],
            "tokens": self.tokens, "page_ins": faults - self._start[0],
            "read_bytes": read - self._start[1],
        }
        if self._mapped is not None:
            out["mapped_resident_bytes"] = self._mapped
        if self.streamer is not None:
            out["locked_bytes"] = self.streamer.locked
        if self._per_token is not None:
            out["page_ins_per_token"], out["read_bytes_per_token"] = self._per_token
        if self._hit is not None:
            out["expert_hit_ratio"] = self._hit
        return out

    def _advance(self, faults: int, read: int) -> None:
        """Close the window when tokens were decoded in it; a window without any
        keeps the last figures (a scrape between generations changes nothing)."""
        tokens0, faults0, read0 = self._window
        if self.tokens > tokens0:
            n = self.tokens - tokens0
            self._per_token = ((faults - faults0) / n, (read - read0) / n)
            self._window = (self.tokens, faults, read)

    def _hit_ratio(self) -> float | None:
        """The picks since the last sample, weighted by their experts' pages in
        core now; the last ratio when nothing was picked since."""
        if self.streamer is None or not self._experts:
            return None
        picks = self.streamer.take_picks()
        total = sum(int(c.sum()) for c in picks.values())
        if total == 0 or not self._core.regions:
            return self._hit
        hit = sum(float(n) * self._core.fraction(self._experts.get((layer, e), []))
                  for layer, c in picks.items() for e, n in enumerate(c) if n)
        return hit / total
