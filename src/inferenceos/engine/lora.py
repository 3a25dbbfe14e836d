"""LoRA adapters: loaded once per model, applied per scheduler step.

A request's adapter set (`SamplingParams.lora`: (adapter file, scale) pairs) is a
setting of the llama.cpp *context* (`llama_set_adapters_lora`), not of a batch row, so
rows with different sets cannot share one `llama_decode`. The scheduler therefore
evaluates one set per step (`step_set`: the sets of the running sequences take turns,
round robin) and applies it right before the decode (`Adapters.apply`, a no-op when the
context already has it). Each adapter file is read once per loaded model
(`llama_adapter_lora_init`, on the first request naming it) and kept until the model is
freed: requests swap adapters without reloading the base.

The set is also part of what a KV cell means (the adapter changes the K and V
projections), so a slot's cached prefix is reused only by a request with the same set
(`Slot.lora`, kv/slots.py), and the tiered store holds only the states computed under
the engine's default set (`KVStore` keys are per model and layout; kv/key.py).

Scale 0 is the base model: such pairs are dropped when a set is normalised, so a set
of only zero scales is the empty set and shares the base's cache.
"""

from __future__ import annotations

import ctypes
import weakref
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from inferenceos.errors import UsageError

LoraSet = tuple[tuple[str, float], ...]  # (adapter file, scale), by path, no zero scales

MAX_ADAPTERS = 16  # per request: a bound on what a client can make us load


def lora_set(pairs: Iterable[tuple[str | Path, float]]) -> LoraSet:
    """The normalised set of `pairs`: paths as absolute strings, scales summed per file
    (llama.cpp applies each adapter once), zero scales dropped, sorted by path.
    UsageError for a scale that is not a finite number or too many adapters."""
    scales: dict[str, float] = {}
    for path, scale in pairs:
        s = float(scale)
        if s != s or s in (float("inf"), float("-inf")):
            raise UsageError(f"LoRA scale must be a finite number, got {scale}")
        key = str(Path(path).expanduser().absolute())
        scales[key] = scales.get(key, 0.0) + s
    out = tuple(sorted((p, s) for p, s in scales.items() if s != 0.0))
    if len(out) > MAX_ADAPTERS:
        raise UsageError(f"at most {MAX_ADAPTERS} LoRA adapters per request, got {len(out)}")
    return out


def parse_lora_arg(text: str) -> tuple[str, float]:
    """`FILE[:SCALE]` (the `--lora` option) → (absolute path, scale; default 1.0). The
    scale is split off the last colon only when what follows is a number, so paths with
    colons still work. UsageError when the file does not exist."""
    path, scale = text, 1.0
    head, sep, tail = text.rpartition(":")
    if sep and head:
        try:
            path, scale = head, float(tail)
        except ValueError:
            path = text
    p = Path(path).expanduser()
    if not p.is_file():
        raise UsageError(f"--lora: no adapter file {path}")
    return str(p.absolute()), scale


def set_key(lora: LoraSet) -> str:
    """A short printable name of a set ("" for the base), for slot tags and logs."""
    return ";".join(f"{p}:{s:g}" for p, s in lora)


def step_set(sets: Sequence[LoraSet], last: LoraSet | None) -> LoraSet:
    """Which adapter set this step evaluates, given each running sequence's set (in
    running order) and the set of the previous step: the next distinct set after `last`
    in order of first appearance (round robin), so no set waits more than one step per
    other set. One set only (the usual case): that set."""
    order = list(dict.fromkeys(sets))
    if len(order) <= 1 or last not in order:
        return order[0] if order else ()
    return order[(order.index(last) + 1) % len(order)]


class Adapters:
    """The adapters loaded on one llama.cpp model, by file; applies a set to a context.
    Not thread-safe (one per scheduler, like the context)."""

    def __init__(self, ll: Any, model: Any) -> None:
        self._ll, self._model = ll, model
        self._loaded: dict[str, Any] = {}
        self._applied: tuple[int, LoraSet] | None = None  # (context address, set)

    def load(self, path: str) -> Any:
        """The adapter in file `path`, read on first use (UsageError when llama.cpp
        refuses it: not a LoRA GGUF, or made for another base model)."""
        ptr = self._loaded.get(path)
        if ptr is None:
            if not Path(path).is_file():
                raise UsageError(f"no LoRA adapter file {path}")
            ptr = self._ll.llama_adapter_lora_init(self._model, path.encode())
            if not ptr:
                raise UsageError(f"llama.cpp could not load the LoRA adapter {Path(path).name}"
                                 " (not a LoRA GGUF, or made for another base model)")
            self._loaded[path] = ptr
        return ptr

    def check(self, lora: LoraSet) -> None:
        """Load every adapter of `lora` now, so a bad file fails the request at submit."""
        for path, _ in lora:
            self.load(path)

    def apply(self, ctx: Any, lora: LoraSet) -> None:
        """Make `lora` the context's adapter set (the empty set clears it)."""
        addr = ctypes.cast(ctx, ctypes.c_void_p).value or 0
        if self._applied == (addr, lora):
            return
        n = len(lora)
        ptrs = (self._ll.llama_adapter_lora_p_ctypes * max(1, n))(
            *[self.load(p) for p, _ in lora])
        scales = (ctypes.c_float * max(1, n))(*[s for _, s in lora])
        rc = int(self._ll.llama_set_adapters_lora(ctx, ptrs if n else None, n,
                                                  scales if n else None))
        if rc != 0:
            raise UsageError(f"llama.cpp refused the LoRA adapter set (code {rc})")
        self._applied = (addr, lora)

    @property
    def loaded(self) -> list[str]:
        return list(self._loaded)


_BY_MODEL: weakref.WeakKeyDictionary[Any, Adapters] = weakref.WeakKeyDictionary()


def adapters_of(lm: Any) -> Adapters:
    """The Adapters of the LoadedModel `lm` (made on first use, kept with it: a
    llama.cpp adapter lives as long as its model)."""
    a = _BY_MODEL.get(lm)
    if a is None or a._model is not lm.model:
        a = _BY_MODEL[lm] = Adapters(lm._ll, lm.model)
    return a


def adapter_bytes(paths: Iterable[str | Path]) -> int:
    """What the adapters' tensors take in memory: their files' sizes (the tensors are
    stored as they are in the file), for the planner."""
    return sum(Path(p).stat().st_size for p in paths if Path(p).is_file())
