"""A model as the planner sees it: its ModelSpec and a compact tensor table.

The spec gives bytes per layer and role; placement and the weight-buffer model also
need each tensor's type and row count (llama.cpp's CPU repacking depends on both), so
the GGUF header is read once and both are kept. Metadata only: no tensor data is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from inferenceos.model.gguf_file import read_gguf
from inferenceos.model.spec import ModelSpec, spec_from_gguf, tensor_place


@dataclass(frozen=True)
class TensorFact:
    """One weight tensor: where it belongs and what llama.cpp will do with it.

    `layer` is the block index or -1 outside the blocks; `role` is one of attention,
    ffn, expert, norm, other (as in ModelSpec) or, outside the blocks, the tensor name
    without `.weight` (token_embd, output, output_norm, ...). `rows` is ggml's ne[1].
    """

    name: str
    layer: int
    role: str
    ggml_type: str
    rows: int
    n_dims: int
    n_bytes: int
    n_elements: int = 0


@dataclass(frozen=True)
class ModelFacts:
    """ModelSpec plus its tensors; what every planner function takes."""

    spec: ModelSpec
    tensors: tuple[TensorFact, ...]

    @property
    def has_output_tensor(self) -> bool:
        """False when the output projection is tied to token_embd (llama.cpp then
        duplicates token_embd where the output layer is placed)."""
        return any(t.name == "output.weight" for t in self.tensors)

    def tensor_bytes(self, name_prefix: str) -> int:
        return sum(t.n_bytes for t in self.tensors if t.name.startswith(name_prefix))


def load_model_facts(path: str | Path) -> ModelFacts:
    """Read `path`'s GGUF header once; raise GGUFFormatError when it is malformed."""
    gf = read_gguf(path)
    spec = spec_from_gguf(gf)
    facts = []
    for t in gf.tensors:
        layer, role = tensor_place(t.name, spec.block_count)
        facts.append(
            TensorFact(
                name=t.name,
                layer=layer,
                role=role,
                ggml_type=t.ggml_type.name.lower(),
                rows=t.shape[1] if len(t.shape) > 1 else 1,
                n_dims=len(t.shape),
                n_bytes=t.n_bytes,
                n_elements=t.n_elements,
            )
        )
    return ModelFacts(spec=spec, tensors=tuple(facts))
