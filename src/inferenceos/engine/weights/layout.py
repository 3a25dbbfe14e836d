"""Where a GGUF file's weights lie, grouped by how a token reads them.

A disk-bound plan streams part of the weights (engine/weights/prefetch.py); what it keeps and
what it streams are groups of file byte ranges:
- `HEAD`: the tensors outside the blocks that every token reads whole (the output head,
  the norms, an embedding tied to the head);
- `ROWS`: an untied token embedding, of which a token reads one row;
- a block `i`: its tensors, or on a model with routed experts its dense part
  (attention, norms, router, shared experts);
- `(i, e)`: routed expert `e` of block `i`, its slices of the block's `*_exps` tensors
  (read only when the router picks it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from inferenceos.engine.llama.model_header import model_header
from inferenceos.model.spec import tensor_place

HEAD = -1  # the tensors outside the blocks that every token reads whole
ROWS = -2  # the token embedding when the model has its own output head: read by row

Unit = int | tuple[int, int]  # HEAD, ROWS, a block (its dense part), (block, expert)


@dataclass(frozen=True)
class Span:
    """A byte range of the file: [start, end)."""

    start: int
    end: int


def span_bytes(spans: list[Span]) -> int:
    """Bytes the spans cover."""
    return sum(s.end - s.start for s in spans)


def layer_spans(path: Path, skip_experts: bool = False) -> dict[int, list[Span]]:
    """File byte ranges of each block's tensors, adjacent tensors merged. Outside the
    blocks (they sit at both ends of a typical file): `HEAD` and `ROWS` (module doc;
    Qwen2.5 1.5B's untied embedding: 125 MiB). `skip_experts`: without the routed
    experts' tensors (a block's dense part)."""
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


def experts_used(path: Path) -> int:
    """Experts the router picks per token (`<arch>.expert_used_count`), 0 when dense."""
    meta = model_header(path).metadata
    return int(next((v for k, v in meta.items() if k.endswith(".expert_used_count")), 0)
               or 0)


def weight_units(path: Path) -> dict[Unit, list[Span]]:
    """Every group of the module doc with its byte ranges: on a dense model the blocks
    whole, on a routed-experts model each block's dense part and each expert apart."""
    n_expert = expert_count(path)
    units: dict[Unit, list[Span]] = {
        layer: spans for layer, spans in layer_spans(path, skip_experts=bool(n_expert)).items()}
    for key, ranges in (expert_ranges(path, n_expert) if n_expert else {}).items():
        units[key] = [Span(lo, hi) for lo, hi in ranges]
    return units
