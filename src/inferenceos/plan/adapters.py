"""What LoRA adapters take in memory, and on which device (pure, from GGUF headers).

llama.cpp (src/llama-adapter.cpp) allocates each adapter tensor `<W>.lora_a` /
`<W>.lora_b` in the buffer type of the base weight W it adapts: on the device of W's
layer, or in plain CPU memory where W sits in a CPU_REPACK buffer (adapters are never
repacked). The tensors are copied from the file as they are (not mapped), so their
bytes count in full where they land, for as long as the model is loaded (the engine
keeps every adapter a request named until the model is freed: engine/lora.py).

Only the header is read (`model/gguf_file.read_gguf`); no tensor data.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from inferenceos.errors import UsageError
from inferenceos.model.gguf_file import read_gguf
from inferenceos.model.spec import tensor_place
from inferenceos.plan.model_facts import TensorFact
from inferenceos.plan.placement import Placement

_SUFFIXES = (".lora_a", ".lora_b")


@dataclass(frozen=True)
class AdapterFacts:
    """One adapter file: its tensors, each named and placed as the base weight it
    adapts (`name` without `.lora_a`/`.lora_b`), with the adapter tensor's bytes."""

    path: str
    tensors: tuple[TensorFact, ...]

    @property
    def bytes(self) -> int:
        return sum(t.n_bytes for t in self.tensors)


def load_adapter_facts(path: str | Path, n_layer: int) -> AdapterFacts:
    """The facts of the LoRA GGUF `path` for a base model of `n_layer` blocks.
    UsageError when the file is not a LoRA adapter (GGUFFormatError when malformed)."""
    gf = read_gguf(path)
    meta = gf.metadata
    if meta.get("general.type") != "adapter" or meta.get("adapter.type") != "lora":
        raise UsageError(f"{Path(path).name} is not a LoRA adapter GGUF "
                         "(general.type adapter, adapter.type lora)")
    facts = []
    for t in gf.tensors:
        base = next((t.name[: -len(s)] for s in _SUFFIXES if t.name.endswith(s)), t.name)
        layer, role = tensor_place(base, n_layer)
        facts.append(TensorFact(
            name=base, layer=layer, role=role, ggml_type=t.ggml_type.name.lower(),
            rows=t.shape[1] if len(t.shape) > 1 else 1, n_dims=len(t.shape),
            n_bytes=t.n_bytes, n_elements=t.n_elements))
    return AdapterFacts(str(path), tuple(facts))


def adapter_bytes_by_device(adapters: Iterable[AdapterFacts], placement: Placement
                            ) -> dict[str, int]:
    """Bytes per device the `adapters` take under `placement`: each tensor on the
    device of the weight it adapts (a CPU weight: the CPU, repacked or not)."""
    out: dict[str, int] = {}
    for a in adapters:
        for t in a.tensors:
            dev = placement.device_of(t)
            out[dev] = out.get(dev, 0) + t.n_bytes
    return out
