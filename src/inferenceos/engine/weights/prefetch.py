"""Streaming weights that do not fit: read the next layers ahead, keep a resident set.

A disk-bound plan leaves part of the weights in the file. Left to itself the kernel
faults them in one read-around window at a time, synchronously, on the compute
threads, and evicts by recency: every token reads the layers in the same order, the
pattern least-recently-used eviction handles worst. `LayerStreamer` replaces that with
the plan's choice:
- the resident set (engine/weights/resident_choice.py): the units of weights (output head and
  norms, blocks, on a routed model each block's dense part and each expert apart:
  engine/weights/layout.py) a token reads most per byte, as far as the page cache the
  plan leaves (`resident_bytes`) less the prefetch window and 5 % slack holds them,
  read once at start and locked (mlock; where RLIMIT_MEMLOCK refuses, only advised);
  an untied token embedding is left to the kernel (a token reads one row of it);
- the streamed layers: when layer i starts computing (a cb_eval on its `attn_norm-i`
  node), a prefetch thread asks the kernel to read layers i+1 .. i+ahead (and the
  head after the last layer, when it is not resident; MADV_WILLNEED on llama.cpp's
  own mapping of the file: asynchronous, large reads),
  and marks the streamed layer i-1 cold (MADV_COLD), so reclaim takes streamed pages
  before resident ones.
Where the mapping cannot be found (no /proc, not mmap'd) it degrades to
posix_fadvise(WILLNEED) on its own descriptor and no drop-behind.

On a model with routed experts the same cb_eval also watches the router's choice
(`ffn_moe_topk-i`, llama.cpp's `build_moe_ffn`: int32 expert ids, [n_expert_used,
n_tokens] in ggml order, a strided view): a streamed layer is read ahead without its
experts and the picked ones are asked for as soon as the router has picked them; the
picks are counted per layer and expert. They are the experts' heat: the stored heat
(`heat_source`, telemetry/expert_heat.py) and the picks since the load together
choose which experts are resident, chosen again every `RECHOOSE_TOKENS` tokens on the
prefetch thread (unlocking what cooled, locking what warmed), and the new picks go
to `heat_sink` every `RECORD_TOKENS` tokens and at close. `take_picks()` hands the
picks to engine/weights/residency.py, which reports the share that fell on experts in
memory.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import mmap
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from inferenceos import interrupt
from inferenceos.engine.weights.layout import (
    HEAD,
    ROWS,
    Span,
    Unit,
    expert_count,
    experts_used,
    layer_spans,
    span_bytes,
    weight_units,
)
from inferenceos.engine.weights.resident_choice import choose_resident, worth_swapping
from inferenceos.plan.llama_params import offloaded_blocks
from inferenceos.telemetry.expert_heat import Heat, layer_odds

MADV_WILLNEED = 4
MADV_COLD = 20  # Linux 5.4+; EINVAL before: drop-behind is then skipped
PREFIX = b"attn_norm-"
TOPK = b"ffn_moe_topk-"  # the router's chosen expert ids (llama-graph.cpp, build_moe_ffn)
GGML_TYPE_I32 = 26
READ_CHUNK = 1 << 20  # one read of a picked expert (the readers' buffers: 4 x 1 MiB)
READERS = 4  # threads reading a layer's picked experts at once
RECHOOSE_TOKENS = 32  # tokens between two looks at the heat
RECORD_TOKENS = 512  # tokens between two writes of the picks to the heat store

HeatSource = Callable[[], Heat | None]
HeatSink = Callable[[dict[int, np.ndarray], dict[int, float]], None]  # picks, tokens

__all__ = ["HEAD", "ROWS", "LayerStreamer", "Span", "layer_spans", "span_bytes"]


def _mapping_base(path: Path) -> int | None:
    """The address file offset 0 of `path` has in llama.cpp's mapping of it. llama.cpp
    maps the whole file, then unmaps the fragments before the first and after the last
    tensor it uses, so the mapping left starts at a page of the header, not at 0."""
    real = str(path.resolve())
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        f = line.split(maxsplit=5)
        if len(f) == 6 and f[5] == real and f[1].startswith("r"):
            return int(f[0].split("-")[0], 16) - int(f[2], 16)
    return None


def _cpu_blocks(blocks: list[int], offloaded: int) -> list[int]:
    """The blocks that compute on the CPU when llama.cpp's n_gpu_layers is `offloaded`
    (llama_params.offloaded_blocks: the last ones go). Only these are streamed and
    watched: a cb_eval that stops the graph at a node of an RPC device's split cuts that
    split into views, which llama.cpp's RPC backend cannot compute (GGML_ASSERT(buffer)
    in ggml-backend.cpp, or SIGSEGV, in most loads of a disk-bound CPU + RPC plan)."""
    on_cpu = len(blocks) - offloaded_blocks(offloaded, len(blocks))
    return [i for i in blocks if i < on_cpu]


class LayerStreamer:
    """Prefetch and residency for one loaded model (see the module doc).

    `callback` is the ctypes cb_eval to hand llama.cpp (keep this object alive with the
    context); `attach()` after the load finds the mapping and reads the resident set.
    `offloaded`: the plan's n_gpu_layers where it names devices (their layers are
    neither streamed nor watched). `heat_source` / `heat_sink`: where a routed model's
    expert heat is read from (on the prefetch thread, before the first re-choice) and
    its new picks go (module doc); None: the picks since the load alone.
    """

    def __init__(
        self, path: Path, resident_bytes: int, ahead: int = 2, offloaded: int = 0,
        heat_source: HeatSource | None = None, heat_sink: HeatSink | None = None,
    ) -> None:
        self.path = Path(path)
        self.spans = layer_spans(self.path)  # whole blocks: what a read-ahead may hold
        self.units: dict[Unit, list[Span]] = weight_units(self.path)
        self.n_expert = expert_count(self.path)
        self.n_used = experts_used(self.path)
        self.prior = self.n_used / self.n_expert if self.n_expert else 0.0
        self.expert_fetches = 0  # picked experts asked for (a figure for tests)
        self.blocks = _cpu_blocks(sorted(i for i in self.spans if i >= 0), offloaded)
        # the prefetch window's parts: the largest block whole (the layer computing) and
        # the largest read-ahead of a layer (_read_ahead_bytes)
        self._block_max = max((span_bytes(self.spans[i]) for i in self.blocks), default=0)
        self._ahead_max = max((self._read_ahead_bytes(i) for i in self.blocks), default=0)
        self.ahead = self._fit_ahead(resident_bytes, ahead)
        self.room = self._room(resident_bytes)
        self._heat_source, self._heat_sink = heat_source, heat_sink
        self._stored: Heat | None = None
        moe = sorted({u[0] for u in self.units if isinstance(u, tuple)} & set(self.blocks))
        self._first_moe = moe[0] if moe else None
        self._seen = {layer: np.zeros(self.n_expert) for layer in moe}  # since the load
        self._layer_tokens = {layer: 0.0 for layer in moe}  # rows each layer routed
        # what _record handed to the sink so far (the next record is the difference)
        self._recorded = ({layer: np.zeros(self.n_expert) for layer in moe},
                          {layer: 0.0 for layer in moe})
        self._chosen_at = 0.0  # _tokens_seen() at the last re-choice
        self.resident = choose_resident(self.units, self.blocks, self.room, self.heat())
        self.rechosen = 0  # times the heat changed the resident set
        self._libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        self._base: int | None = None
        self._attached = threading.Event()
        self._fd = os.open(self.path, os.O_RDONLY)
        with contextlib.suppress(OSError):  # exact reads of picked experts (_fetch_experts)
            os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_RANDOM)
        self._readers = ThreadPoolExecutor(READERS, thread_name_prefix="expert-read")
        self._buffers = threading.local()
        self._want: int | None = None
        self._cv = threading.Condition()
        self._lock_units = threading.Lock()  # attach and a re-choice never interleave
        self._closed = False
        self.prefetched = 0  # layer reads asked for (a figure for tests and reports)
        self.locked = 0  # resident bytes mlock'ed
        self._watched = frozenset(self.blocks)
        self._picks: dict[int, np.ndarray] = {}  # layer -> picks per expert, since taken
        from llama_cpp.llama_cpp import ggml_backend_sched_eval_callback

        from inferenceos.engine.kv.attention_probe import GGMLTensor, _tensor_get

        self._tensor = GGMLTensor
        self._get = _tensor_get() if self.n_expert else None
        self.callback = ggml_backend_sched_eval_callback(interrupt.callback(self._on_tensor))
        self._thread = threading.Thread(target=self._run, name="layer-prefetch", daemon=True)
        self._thread.start()
        if self._seen and heat_source is not None:
            threading.Thread(target=self._load_heat, name="expert-heat", daemon=True).start()

    def _fit_ahead(self, budget: int, ahead: int) -> int:
        """Layers to read ahead: at most `ahead`, and no more than the page cache holds
        beside the layer computing. A read-ahead with no room evicts the layer being
        computed, which then faults back in: at a budget of one layer, 2 ahead took a
        decode to 0.4 tok/s and thrashed for minutes where the kernel alone did not."""
        if self._block_max == 0 or self._ahead_max == 0:
            return max(0, ahead)
        return max(0, min(ahead, (budget - self._block_max) // self._ahead_max))

    def _read_ahead_bytes(self, layer: int) -> int:
        """What a layer read ahead holds: the block whole, or on a routed model its
        dense part and the experts one token picks (the largest ones: a prompt's
        batch picks more, but only in the layer computing)."""
        if not self.n_expert:
            return span_bytes(self.spans.get(layer, []))
        experts = sorted((span_bytes(s) for u, s in self.units.items()
                          if isinstance(u, tuple) and u[0] == layer), reverse=True)
        return span_bytes(self.units.get(layer, [])) + sum(experts[: self.n_used])

    def _room(self, budget: int) -> int:
        """What the resident set may hold: `budget` less the prefetch window (the layer
        computing, whole, and those read ahead: _read_ahead_bytes) and 5 % slack.
        Locked pages are never reclaimed: the slack covers the plan's anonymous figure,
        which ran up to 7-12 % low on Qwen's vocabulary. (Locking an untied embedding
        whole cost Qwen 1.5B its head and every block under 50 % of its size: 1078 MiB
        read at every token.)"""
        window = self._block_max + self.ahead * self._ahead_max
        return budget - window - budget // 20

    # -- heat ------------------------------------------------------------------------------

    def heat(self) -> dict[tuple[int, int], float]:
        """(layer, expert) -> the chance a token picks it: the stored heat and the picks
        since the load together (telemetry/expert_heat.odds); {} for a dense model."""
        if not self._seen:
            return {}
        stored_picks, stored_tokens = self._stored or ({}, {})
        out: dict[tuple[int, int], float] = {}
        for layer, seen in self._seen.items():
            have = stored_picks.get(layer)
            picks, tokens = seen, self._layer_tokens[layer]
            if have is not None and have.shape == seen.shape:
                picks, tokens = seen + have, tokens + stored_tokens.get(layer, 0.0)
            p = layer_odds(picks, tokens, self.prior)
            out.update({(layer, e): float(x) for e, x in enumerate(p)})
        return out

    def _rechoose(self) -> None:
        """Choose the resident set again from the heat; swap in the new one when it
        saves enough reads (resident_choice.worth_swapping): unlock and cool what
        leaves before what comes is read and locked, so the two never both hold room."""
        heat = self.heat()
        self._chosen_at = self._tokens_seen()
        new = choose_resident(self.units, self.blocks, self.room, heat)
        with self._lock_units:
            old = self.resident
            if self._closed or not worth_swapping(self.units, old, new, heat, skip=(ROWS,)):
                return
            for unit in old - new:
                self.locked -= self._unlock(unit)
                self._advise(unit, MADV_COLD)
            self.resident = new
            for unit in sorted(new - old, key=str):
                self._advise(unit, MADV_WILLNEED)
                self.locked += self._lock(unit)
            self.rechosen += 1

    def _load_heat(self) -> None:
        """The heat thread: read the stored heat (a model's digest may take seconds to
        compute the first time, and the store may be busy: neither on the decode's
        path nor the prefetch's) and choose the resident set by it: before `attach`
        when it comes in time (the load takes a second or more), else by a swap. A
        swap costs a read of the new set while decoding: on the upcycled MoE under 60 %
        of its size, 14 experts (130 MiB) swapped at the start of every run made it
        0.91x the file-order set over 16 tokens, despite a hit ratio of 0.28 against
        0.17."""
        if self._heat_source is None:
            return
        with contextlib.suppress(Exception):
            self._stored = self._heat_source()
        if self._stored is None:
            return
        with self._lock_units:
            if not self._attached.is_set():  # in time: attach reads and locks this set
                self.resident = choose_resident(self.units, self.blocks, self.room,
                                                self.heat())
                return
        if not self._closed:  # late: swap (the old set was read and locked already)
            self._rechoose()

    def _record(self) -> None:
        """Hand the picks not yet recorded to the heat sink (errors never reach the
        decode: heat only orders residency)."""
        seen = {layer: counts.copy() for layer, counts in self._seen.items()}
        tokens = dict(self._layer_tokens)
        done_picks, done_tokens = self._recorded
        self._recorded = seen, tokens
        new = {layer: tokens[layer] - done_tokens[layer] for layer in tokens}
        if self._heat_sink is not None and any(n > 0 for n in new.values()):
            with contextlib.suppress(Exception):
                self._heat_sink({layer: seen[layer] - done_picks[layer] for layer in seen},
                                new)

    def _tokens_seen(self) -> float:
        """Tokens through the first routed layer since the load (every token passes
        it): the clock of re-choices and records."""
        return self._layer_tokens.get(self._first_moe, 0.0) if self._first_moe is not None \
            else 0.0

    # -- memory ----------------------------------------------------------------------------

    def attach(self) -> None:
        """Find llama.cpp's mapping and ask for the resident set once. The kernel's
        fault read-around stays on: turning it off (MADV_RANDOM) cut the bytes read per
        token 3x on tests/tiny_q4.py under a 90 MiB cgroup but made decode 3x slower,
        every fault the prefetch had not covered becoming a 4 KiB synchronous read (on
        the upcycled MoE under 40 %, off for the streamed experts only: 0.26 t/s
        against 0.86; under a tight limit the kernel drops a WILLNEED's reads rather
        than reclaim for them)."""
        with self._lock_units:
            self._base = _mapping_base(self.path)
            for unit in sorted(self.resident, key=str):
                self._advise(unit, MADV_WILLNEED)
            if self._base is not None:
                self.locked = sum(self._lock(u) for u in sorted(self.resident, key=str))
            self._attached.set()

    def _pages(self, unit: Unit) -> list[tuple[int, int]]:
        """The unit's spans as (address, length) in the mapping, page-aligned."""
        page, base = mmap.PAGESIZE, self._base
        if base is None:
            return []
        return [(base + s.start // page * page, s.end - s.start // page * page)
                for s in self.units.get(unit, ())]

    def _lock(self, unit: Unit) -> int:
        """mlock the unit's mapped pages, so reclaim cannot take them: without it the
        kernel's LRU evicted the resident layers too and every token read the whole
        model (Qwen 1.5B under 70 % of its size: 898 MiB/token read; under 90 % with
        555 MiB locked: 537 MiB/token, the streamed part). Returns the bytes locked, 0
        where RLIMIT_MEMLOCK refuses (then the pages are only advised)."""
        return sum(n for addr, n in self._pages(unit)
                   if self._libc.mlock(ctypes.c_void_p(addr), ctypes.c_size_t(n)) == 0)

    def _unlock(self, unit: Unit) -> int:
        """munlock the unit's pages; returns the bytes unlocked."""
        return sum(n for addr, n in self._pages(unit)
                   if self._libc.munlock(ctypes.c_void_p(addr), ctypes.c_size_t(n)) == 0)

    def _advise(self, unit: Unit, advice: int) -> None:
        for s in self.units.get(unit, ()):
            self._advise_range(s.start, s.end, advice)

    def _advise_range(self, lo: int, hi: int, advice: int) -> None:
        start = lo // mmap.PAGESIZE * mmap.PAGESIZE
        if self._base is None:
            if advice == MADV_WILLNEED:
                os.posix_fadvise(self._fd, start, hi - start, os.POSIX_FADV_WILLNEED)
            return
        self._libc.madvise(ctypes.c_void_p(self._base + start), ctypes.c_size_t(hi - start),
                           advice)

    def _fetch_experts(self, layer: int, experts: np.ndarray) -> None:
        """Read the slices of the experts the router just picked in a layer that are not
        resident (read ahead, a layer brings only its dense part), exactly and at once,
        before the graph goes on: `READERS` threads `pread` them into the page cache in
        `READ_CHUNK` pieces through our own descriptor, which has no read-ahead
        (POSIX_FADV_RANDOM), so the compute then finds them cached and never faults.
        A fault would read the kernel's read-around window (8 MiB here) around it,
        wider than an expert's slice (~3 MiB on the upcycled Qwen MoE): the unpicked
        neighbours too, ~983 of its 1087 MiB per token under 40 % of its size. An
        asynchronous ask (MADV_WILLNEED) does not do: under a tight limit the kernel
        drops its reads rather than reclaim for them."""
        resident = self.resident
        chunks: list[tuple[int, int]] = []
        for e in experts.tolist():
            unit = (layer, int(e))
            if unit in resident or unit not in self.units:
                continue
            for s in self.units[unit]:
                chunks += [(lo, min(lo + READ_CHUNK, s.end))
                           for lo in range(s.start, s.end, READ_CHUNK)]
            self.expert_fetches += 1
        if chunks:
            list(self._readers.map(self._read_range, chunks))

    def _read_range(self, span: tuple[int, int]) -> None:
        """pread [lo, hi) of the file into this reader thread's buffer (and so into
        the page cache); errors leave it to the fault that follows."""
        lo, hi = span
        buf = getattr(self._buffers, "buf", None)
        if buf is None:
            buf = self._buffers.buf = memoryview(bytearray(READ_CHUNK))
        with contextlib.suppress(OSError):
            while lo < hi:
                got = os.preadv(self._fd, [buf[: hi - lo]], lo)
                if got <= 0:
                    return
                lo += got

    def _cool(self, layer: int) -> None:
        """Mark what of `layer` is streamed (its dense part or whole, its experts not
        resident) cold: reclaim takes it before the resident set."""
        resident = self.resident
        if layer not in resident:
            self._advise(layer, MADV_COLD)
        for e in range(self.n_expert if layer >= 0 else 0):
            if (layer, e) not in resident:
                self._advise((layer, e), MADV_COLD)

    def resident_in_core(self) -> float:
        """Share of the resident set's pages in memory now (mincore on the mapping);
        1.0 when nothing is resident, 0.0 when the mapping is unknown."""
        if self._base is None:
            return 0.0
        page, have, total = mmap.PAGESIZE, 0, 0
        for unit in self.resident:
            for addr, length in self._pages(unit):
                n = (length + page - 1) // page
                vec = (ctypes.c_ubyte * n)()
                if self._libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(length),
                                      vec) != 0:
                    return 0.0
                have += sum(b & 1 for b in vec)
                total += n
        return have / total if total else 1.0

    @property
    def resident_bytes(self) -> int:
        """File bytes of the resident set (what `attach` reads and locks)."""
        return sum(span_bytes(self.units.get(u, [])) for u in self.resident)

    @property
    def streamed_bytes(self) -> int:
        """File bytes of the units read back while decoding (all the others but the
        embedding's rows)."""
        return sum(span_bytes(s) for u, s in self.units.items()
                   if u not in self.resident and u != ROWS)

    @property
    def ring(self) -> list[int]:
        """The order a token reads its streamed groups in: the blocks, then the head
        when it is not resident (prefetched while the last blocks compute, rather than
        faulted in 128 KiB at a time once the graph reaches it)."""
        head = [HEAD] if HEAD in self.units and HEAD not in self.resident else []
        return [*self.blocks, *head]

    # -- the router's picks ----------------------------------------------------------------

    def take_picks(self) -> dict[int, np.ndarray]:
        """The router's picks since the last call: layer -> count per expert."""
        picks, self._picks = self._picks, {}
        return picks

    def _count_picks(self, addr: int, layer: int) -> None:
        """Add one `ffn_moe_topk` tensor's ids to the layer's counts. The tensor is a
        view (its rows `nb[1]` apart); ggml_backend_tensor_get copies its span from
        whatever buffer holds it."""
        t = ctypes.cast(addr, ctypes.POINTER(self._tensor)).contents
        used, rows, stride = int(t.ne[0]), int(t.ne[1]), int(t.nb[1])
        if t.type != GGML_TYPE_I32 or int(t.nb[0]) != 4 or used <= 0 or rows <= 0:
            return
        span = stride * (rows - 1) + 4 * used
        buf = np.empty(span // 4, np.int32)
        self._get(ctypes.cast(addr, ctypes.POINTER(self._tensor)),  # type: ignore[misc]
                  buf.ctypes.data, 0, span)
        ids = np.lib.stride_tricks.as_strided(buf, (rows, used), (stride, 4))
        ids = ids[(ids >= 0) & (ids < self.n_expert)]
        self._fetch_experts(layer, np.unique(ids))
        counts = np.bincount(ids, minlength=self.n_expert)
        picks = self._picks  # one dict throughout: a take_picks meanwhile loses these
        have = picks.get(layer)  # counts, it never counts them twice
        picks[layer] = counts if have is None else have + counts
        if layer in self._seen:
            # per layer: a prompt's last layer routes only the rows it outputs
            # (llama.cpp's inp_out_ids), so its picks are over fewer tokens
            self._seen[layer] += counts
            self._layer_tokens[layer] += rows

    def _on_tensor(self, addr: int, ask: bool, _user: int) -> bool:
        name = ctypes.cast(addr, ctypes.POINTER(self._tensor)).contents.name
        topk = bool(self.n_expert) and name.startswith(TOPK)
        if not topk and not name.startswith(PREFIX):
            return False
        try:
            layer = int(name[len(TOPK if topk else PREFIX):])
        except ValueError:
            return False
        if layer not in self._watched:
            return False  # another device's layer: never cut its split (_cpu_blocks)
        if ask:
            return True  # stop the graph here (a layer's start, or the router's picks)
        if topk:
            # an exception here would return 0 to C, which aborts the decode: a figure
            # is never worth that
            with contextlib.suppress(Exception):
                self._count_picks(addr, layer)
            return True
        with self._cv:
            self._want = layer
            self._cv.notify()
        return True

    # -- the prefetch thread ---------------------------------------------------------------

    def _run(self) -> None:
        """The prefetch thread: for each layer that starts, read the next `ahead`
        streamed groups of the `ring` (wrapping to the next token's first ones) and
        cool the one before it; every RECHOOSE_TOKENS tokens the heat may change the
        resident set."""
        ring = self.ring
        n = len(ring)
        where = {layer: k for k, layer in enumerate(ring)}
        while True:
            with self._cv:
                while self._want is None and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                layer, self._want = self._want, None
            if layer is None or layer not in where:
                continue
            at = where[layer]
            for k in range(1, self.ahead + 1):
                nxt = ring[(at + k) % n]
                if nxt not in self.resident:
                    self._advise(nxt, MADV_WILLNEED)
                    self.prefetched += 1
            self._cool(ring[(at - 1) % n])
            seen = self._tokens_seen()
            if self._seen and seen - self._chosen_at >= RECHOOSE_TOKENS:
                self._rechoose()
            if seen - self._recorded[1].get(self._first_moe or 0, 0.0) >= RECORD_TOKENS:
                self._record()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join(timeout=2)
        with self._lock_units:  # a re-choice under way ends before the mapping may go
            pass
        self._record()
        self._readers.shutdown(wait=True)
        os.close(self._fd)

    def __enter__(self) -> LayerStreamer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
