"""Streaming weights that do not fit: read the next layers ahead, keep a resident set.

A disk-bound plan leaves part of the weights in the file. Left to itself the kernel
faults them in one read-around window at a time, synchronously, on the compute
threads, and evicts by recency: every token reads the layers in the same order, the
pattern least-recently-used eviction handles worst. `LayerStreamer` replaces that with
the plan's choice:
- the resident set, by tensor role: what every token reads whole (the output head,
  the norms), then the first layers, as far as the page cache the plan leaves
  (`resident_bytes`) less the prefetch window and 5 % slack holds them, read once at
  start and locked (mlock; where RLIMIT_MEMLOCK refuses, only advised); an untied
  token embedding is left to the kernel (a token reads one row of it);
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
n_tokens] in ggml order, a strided view) and counts the picks per layer and expert;
`take_picks()` hands them to engine/weight_residency.py, which reports the share that
fell on experts in memory.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import mmap
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from inferenceos import interrupt
from inferenceos.engine.model_header import model_header
from inferenceos.model.spec import tensor_place
from inferenceos.plan.llama_params import offloaded_blocks

MADV_WILLNEED = 4
MADV_COLD = 20  # Linux 5.4+; EINVAL before: drop-behind is then skipped
PREFIX = b"attn_norm-"
TOPK = b"ffn_moe_topk-"  # the router's chosen expert ids (llama-graph.cpp, build_moe_ffn)
GGML_TYPE_I32 = 26


@dataclass(frozen=True)
class Span:
    """A byte range of the file: [start, end)."""

    start: int
    end: int


HEAD = -1  # the tensors outside the blocks that every token reads whole
ROWS = -2  # the token embedding when the model has its own output head: read by row


def layer_spans(path: Path, skip_experts: bool = False) -> dict[int, list[Span]]:
    """File byte ranges of each block's tensors, adjacent tensors merged. Outside the
    blocks (they sit at both ends of a typical file): `HEAD`, what every token reads
    whole (the output head, the norms, an embedding tied to the head), and `ROWS`, an
    untied token embedding, of which a token reads one row (Qwen2.5 1.5B: 125 MiB).
    `skip_experts`: without the routed experts' tensors (a block's dense part)."""
    g = model_header(path)
    n = int(next((v for k, v in g.metadata.items() if k.endswith(".block_count")), 0))
    untied = any(t.name == "output.weight" for t in g.tensors)
    spans: dict[int, list[Span]] = {}
    for t in sorted(g.tensors, key=lambda t: t.offset):
        layer, role = tensor_place(t.name, n)
        if skip_experts and role == "expert":
            continue
        if layer < 0 and untied and t.name.startswith("token_embd"):
            layer = ROWS
        lo, hi = t.offset, t.offset + t.n_bytes
        own = spans.setdefault(layer, [])
        if own and lo - own[-1].end < 4096:  # the alignment gap between neighbours
            own[-1] = Span(own[-1].start, hi)
        else:
            own.append(Span(lo, hi))
    return spans


def expert_ranges(path: Path, n_expert: int) -> dict[tuple[int, int], list[tuple[int, int]]]:
    """(layer, expert) -> file byte ranges of that expert's slices of the layer's
    `*_exps` tensors (the expert is a tensor's slowest dimension: its bytes are one
    contiguous n_bytes / n_expert slice)."""
    g = model_header(path)
    n = int(next((v for k, v in g.metadata.items() if k.endswith(".block_count")), 0))
    out: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for t in g.tensors:
        layer, role = tensor_place(t.name, n)
        if role != "expert" or not t.shape or t.shape[-1] != n_expert:
            continue
        size = t.n_bytes // n_expert
        for e in range(n_expert):
            lo = t.offset + e * size
            out.setdefault((layer, e), []).append((lo, lo + size))
    return out


def expert_count(path: Path) -> int:
    """Routed experts per layer (`<arch>.expert_count`), 0 for a dense model."""
    meta = model_header(path).metadata
    return int(next((v for k, v in meta.items() if k.endswith(".expert_count")), 0) or 0)


def _bytes(spans: list[Span]) -> int:
    return sum(s.end - s.start for s in spans)


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
    neither streamed nor watched).
    """

    def __init__(
        self, path: Path, resident_bytes: int, ahead: int = 2, offloaded: int = 0
    ) -> None:
        self.path = Path(path)
        self.spans = layer_spans(self.path)
        self.n_expert = expert_count(self.path)
        # with routed experts, a layer read ahead is its dense part; its experts are
        # read when the router has picked them (`_fetch_experts`)
        self._ahead_spans = layer_spans(self.path, skip_experts=True) if self.n_expert \
            else self.spans
        self._experts = expert_ranges(self.path, self.n_expert) if self.n_expert else {}
        self.expert_fetches = 0  # picked experts asked for (a figure for tests)
        self.blocks = _cpu_blocks(sorted(i for i in self.spans if i >= 0), offloaded)
        self.ahead = self._fit_ahead(resident_bytes, ahead)
        self.resident = self._choose_resident(resident_bytes)
        self._libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        self._base: int | None = None
        self._fd = os.open(self.path, os.O_RDONLY)
        self._want: int | None = None
        self._cv = threading.Condition()
        self._closed = False
        self.prefetched = 0  # layer reads asked for (a figure for tests and reports)
        self.locked = 0  # resident bytes mlock'ed
        self._watched = frozenset(self.blocks)
        self._picks: dict[int, np.ndarray] = {}  # layer -> picks per expert, since taken
        from llama_cpp.llama_cpp import ggml_backend_sched_eval_callback

        from inferenceos.engine.attention_probe import GGMLTensor, _tensor_get

        self._tensor = GGMLTensor
        self._get = _tensor_get() if self.n_expert else None
        self.callback = ggml_backend_sched_eval_callback(interrupt.callback(self._on_tensor))
        self._thread = threading.Thread(target=self._run, name="layer-prefetch", daemon=True)
        self._thread.start()

    def _fit_ahead(self, budget: int, ahead: int) -> int:
        """Layers to read ahead: at most `ahead`, and no more than the page cache holds
        beside the layer computing. A read-ahead with no room evicts the layer being
        computed, which then faults back in: at a budget of one layer, 2 ahead took a
        decode to 0.4 tok/s and thrashed for minutes where the kernel alone did not."""
        largest = max((_bytes(self.spans[i]) for i in self.blocks), default=0)
        if largest == 0:
            return max(0, ahead)
        return max(0, min(ahead, budget // largest - 1))

    def _choose_resident(self, budget: int) -> frozenset[int]:
        """By role: the tensors every token reads whole (`HEAD`: output head, norms),
        then the first blocks, as far as `budget` less the prefetch window holds them.
        An untied embedding (`ROWS`) is never resident nor streamed: a token faults in
        its one row. Locking it whole cost Qwen 1.5B its head and every block under 50 %
        of its size (307 MiB of head and embedding against 271 MiB of room): the whole
        file, 1078 MiB, was read at every token."""
        sizes = {i: _bytes(s) for i, s in self.spans.items()}
        window = (self.ahead + 1) * max((sizes[i] for i in self.blocks), default=0)
        # locked pages are never reclaimed: keep 5 % of the budget as slack besides the
        # window (the plan's anonymous figure ran up to 7-12 % low on Qwen's vocabulary)
        left = budget - window - budget // 20
        chosen: set[int] = set()
        for i in [HEAD, *self.blocks]:
            if sizes.get(i, 0) <= left:
                chosen.add(i)
                left -= sizes.get(i, 0)
            else:
                break
        return frozenset(chosen)

    def attach(self) -> None:
        """Find llama.cpp's mapping and ask for the resident set once. The kernel's
        fault read-around stays on: turning it off (MADV_RANDOM) cut the bytes read per
        token 3x on tests/tiny_q4.py under a 90 MiB cgroup but made decode 3x slower,
        every fault the prefetch had not covered becoming a 4 KiB synchronous read."""
        self._base = _mapping_base(self.path)
        for i in sorted(self.resident):
            self._advise(i, MADV_WILLNEED)
        if self._base is not None:
            self.locked = sum(self._lock(i) for i in sorted(self.resident))

    def _lock(self, layer: int) -> int:
        """mlock the layer's mapped pages, so reclaim cannot take them: without it the
        kernel's LRU evicted the resident layers too and every token read the whole
        model (Qwen 1.5B under 70 % of its size: 898 MiB/token read; under 90 % with
        555 MiB locked: 537 MiB/token, the streamed part). Returns the bytes locked, 0
        where RLIMIT_MEMLOCK refuses (then the pages are only advised)."""
        page, done, base = mmap.PAGESIZE, 0, self._base
        if base is None:
            return 0
        for s in self.spans.get(layer, ()):
            start = s.start // page * page
            if self._libc.mlock(ctypes.c_void_p(base + start),
                                ctypes.c_size_t(s.end - start)) == 0:
                done += s.end - start
        return done

    def _advise(self, layer: int, advice: int,
                spans: dict[int, list[Span]] | None = None) -> None:
        for s in (self.spans if spans is None else spans).get(layer, ()):
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
        """Ask for the slices of the experts the router just picked in a streamed layer:
        read ahead, the layer brought only its dense part."""
        if layer in self.resident:
            return
        for e in experts.tolist():
            for lo, hi in self._experts.get((layer, int(e)), ()):
                self._advise_range(lo, hi, MADV_WILLNEED)
            self.expert_fetches += 1

    def resident_in_core(self) -> float:
        """Share of the resident set's pages in memory now (mincore on the mapping);
        1.0 when nothing is resident, 0.0 when the mapping is unknown."""
        base, page = self._base, mmap.PAGESIZE
        if base is None:
            return 0.0
        have = total = 0
        for layer in self.resident:
            for s in self.spans.get(layer, ()):
                start = s.start // page * page
                n = (s.end - start + page - 1) // page
                vec = (ctypes.c_ubyte * n)()
                if self._libc.mincore(ctypes.c_void_p(base + start),
                                      ctypes.c_size_t(s.end - start), vec) != 0:
                    return 0.0
                have += sum(b & 1 for b in vec)
                total += n
        return have / total if total else 1.0

    @property
    def resident_bytes(self) -> int:
        """File bytes of the resident set (what `attach` reads and locks)."""
        return sum(_bytes(self.spans.get(i, [])) for i in self.resident)

    @property
    def streamed_bytes(self) -> int:
        """File bytes of the layers read back while decoding (all the others but the
        embedding's rows)."""
        return sum(_bytes(s) for i, s in self.spans.items()
                   if i not in self.resident and i != ROWS)

    @property
    def ring(self) -> list[int]:
        """The order a token reads its streamed groups in: the blocks, then the head
        when it is not resident (prefetched while the last blocks compute, rather than
        faulted in 128 KiB at a time once the graph reaches it)."""
        head = [HEAD] if HEAD in self.spans and HEAD not in self.resident else []
        return [*self.blocks, *head]

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

    def _run(self) -> None:
        """The prefetch thread: for each layer that starts, read the next `ahead`
        streamed groups of the `ring` (wrapping to the next token's first ones) and
        cool the one before it."""
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
                    self._advise(nxt, MADV_WILLNEED, self._ahead_spans)
                    self.prefetched += 1
            prev = ring[(at - 1) % n]
            if prev not in self.resident:
                self._advise(prev, MADV_COLD)

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join(timeout=2)
        os.close(self._fd)

    def __enter__(self) -> LayerStreamer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
