"""GGUF file → ModelSpec: what the planner needs to know about a model, from metadata alone.

Per-layer bytes are split by what they are for (attention, dense FFN, MoE experts,
norms) because the planner places them separately: experts can go to the CPU while the
dense part of the same layer stays on a GPU.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gguf import LlamaFileType

from inferenceos.errors import GGUFFormatError
from inferenceos.model.gguf_file import ArrayInfo, GGUFFile, TensorInfo, read_gguf

# Default sliding-window patterns, as llama.cpp's load_arch_hparams sets them when the
# file has `<arch>.attention.sliding_window` but no `sliding_window_pattern`:
# (n, dense_first) — with dense_first False, layer i is SWA when i % n < n - 1.
_SWA_PATTERN_DEFAULTS: dict[str, tuple[int, bool]] = {
    "gemma2": (2, False),
    "gemma3": (6, False),
    "gemma3n": (5, False),
    "gemma-embedding": (6, False),
    "cohere2": (4, False),
    "exaone4": (4, False),
    "olmo2": (4, False),
    "llama4": (4, False),
    "gpt-oss": (2, False),
    "plamo3": (8, False),
    "smallthinker": (4, True),
}

_LAYER_TENSOR = re.compile(r"^blk\.(\d+)\.(.+)$")


@dataclass(frozen=True)
class LayerSpec:
    """Bytes of one transformer block, split by role, and its attention shape."""

    index: int
    attention_bytes: int = 0
    ffn_bytes: int = 0  # dense FFN, router and shared experts
    expert_bytes: int = 0  # routed experts (`*_exps`), placeable on their own
    norm_bytes: int = 0
    other_bytes: int = 0
    is_swa: bool = False
    head_count_kv: int = 0

    @property
    def bytes(self) -> int:
        return (
            self.attention_bytes
            + self.ffn_bytes
            + self.expert_bytes
            + self.norm_bytes
            + self.other_bytes
        )


@dataclass(frozen=True)
class ModelSpec:
    """Everything about a model that can be known without loading it."""

    path: Path
    name: str
    architecture: str
    file_type: str
    block_count: int
    embedding_length: int
    feed_forward_length: int
    head_count: int
    head_count_kv: int
    key_length: int
    value_length: int
    context_length: int
    sliding_window: int  # 0 when the model has no sliding-window layers
    expert_count: int
    expert_used_count: int
    vocab_size: int
    parameters: int
    size_bytes: int  # the whole file
    tensor_bytes: int  # sum of every tensor's data
    tensor_data_size: int  # the file's data section, tensor bytes plus padding
    non_layer_bytes: dict[str, int]  # token_embd, output, output_norm, ...
    layers: tuple[LayerSpec, ...]
    quant_types: dict[str, int]  # ggml type name → bytes of tensors in it
    chat_template: str | None = None
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    gguf_version: int = 3
    metadata_extra: dict[str, Any] = field(default_factory=dict)

    @property
    def swa_layers(self) -> tuple[int, ...]:
        return tuple(layer.index for layer in self.layers if layer.is_swa)

    @property
    def is_moe(self) -> bool:
        return self.expert_count > 0

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable dict (what `inspect --json` prints)."""
        data = asdict(self)
        data["path"] = str(self.path)
        data["swa_layers"] = list(self.swa_layers)
        data["layers"] = [{**asdict(layer), "bytes": layer.bytes} for layer in self.layers]
        data.pop("metadata_extra")
        return data


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_array(value: ArrayInfo, key: str) -> tuple[int, ...]:
    """The items of a per-layer count array; integers only (no NaN, no floats)."""
    if not value.values or not all(_is_int(v) for v in value.values):
        raise GGUFFormatError(f"{key} must be a non-empty array of integers")
    return tuple(value.values)


def _int_or_first(value: Any, key: str) -> int:
    """A count that may be stored per layer as an array: take its maximum."""
    if isinstance(value, ArrayInfo):
        return max(_int_array(value, key))
    if not _is_int(value):
        raise GGUFFormatError(f"{key} must be an integer, got {value!r}")
    return int(value)


class _Meta:
    """Typed access to `<arch>.*` and general metadata keys."""

    def __init__(self, gf: GGUFFile) -> None:
        self.md = gf.metadata
        arch = self.md.get("general.architecture")
        if not isinstance(arch, str) or not arch:
            raise GGUFFormatError(f"{gf.path}: general.architecture is missing")
        self.arch = arch

    def int(self, key: str, default: int | None = None) -> int:
        full = f"{self.arch}.{key}"
        if full not in self.md:
            if default is None:
                raise GGUFFormatError(f"required metadata key {full} is missing")
            return default
        value = _int_or_first(self.md[full], full)
        if value < 0:
            raise GGUFFormatError(f"{full} is negative ({value})")
        return value

    def raw(self, key: str) -> Any:
        return self.md.get(f"{self.arch}.{key}")


def _swa_flags(meta: _Meta, n_layer: int) -> tuple[bool, ...]:
    window = meta.int("attention.sliding_window", 0)
    if window <= 0:
        return (False,) * n_layer
    pattern = meta.raw("attention.sliding_window_pattern")
    if isinstance(pattern, ArrayInfo) and pattern.values is not None:
        flags = tuple(bool(v) for v in pattern.values)
        return (flags + (False,) * n_layer)[:n_layer]
    n, dense_first = _SWA_PATTERN_DEFAULTS.get(meta.arch, (0, False))
    if isinstance(pattern, int) and not isinstance(pattern, bool):
        n = pattern
    if n == 0:
        return (True,) * n_layer
    if dense_first:
        return tuple(i % n != 0 for i in range(n_layer))
    return tuple(i % n < n - 1 for i in range(n_layer))


def _role(sub_name: str) -> str:
    """Which byte bucket a `blk.N.<sub_name>` tensor belongs to."""
    if "norm" in sub_name:
        return "norm"
    if "_exps" in sub_name:
        return "expert"
    if sub_name.startswith("attn_"):
        return "attention"
    if sub_name.startswith("ffn_"):
        return "ffn"
    return "other"


def tensor_place(name: str, n_layer: int) -> tuple[int, str]:
    """(layer, role) of a tensor: role is a byte bucket (attention, ffn, expert, norm,
    other) for `blk.N.*` tensors of the model's N < n_layer blocks; others get layer -1
    and their name without `.weight` (token_embd, output, output_norm, ...)."""
    m = _LAYER_TENSOR.match(name)
    if m and int(m.group(1)) < n_layer:
        return int(m.group(1)), _role(m.group(2))
    return -1, name.removesuffix(".weight")


def _split_tensors(
    tensors: tuple[TensorInfo, ...], n_layer: int
) -> tuple[list[Counter[str]], dict[str, int]]:
    per_layer: list[Counter[str]] = [Counter() for _ in range(n_layer)]
    non_layer: dict[str, int] = {}
    for t in tensors:
        layer, role = tensor_place(t.name, n_layer)
        if layer >= 0:
            per_layer[layer][role] += t.n_bytes
        else:
            non_layer[role] = non_layer.get(role, 0) + t.n_bytes
    return per_layer, non_layer


def _vocab_size(gf: GGUFFile, meta: _Meta) -> int:
    tokens = gf.metadata.get("tokenizer.ggml.tokens")
    if isinstance(tokens, ArrayInfo):
        return tokens.length
    explicit = meta.int("vocab_size", 0)
    if explicit:
        return explicit
    for t in gf.tensors:
        if t.name == "token_embd.weight" and len(t.shape) >= 2:
            return t.shape[1]
    return 0


def _file_type_name(code: Any) -> str:
    if not isinstance(code, int):
        return "unknown"
    try:
        return LlamaFileType(code).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except ValueError:
        return f"type {code}"


def _optional_int(value: Any) -> int | None:
    return value if _is_int(value) else None


def spec_from_gguf(gf: GGUFFile) -> ModelSpec:
    """Build a ModelSpec from a parsed, validated GGUF file."""
    meta = _Meta(gf)
    n_layer = meta.int("block_count")
    if n_layer > len(gf.tensors):
        raise GGUFFormatError(f"block_count {n_layer} exceeds the {len(gf.tensors)} tensors")
    n_embd = meta.int("embedding_length")
    n_head = meta.int("attention.head_count", 0)
    n_head_kv = meta.int("attention.head_count_kv", n_head)
    head_dim = n_embd // n_head if n_head else 0
    swa = _swa_flags(meta, n_layer)
    kv_raw = meta.raw("attention.head_count_kv")
    kv_per_layer = (n_head_kv,) * n_layer
    if isinstance(kv_raw, ArrayInfo) and kv_raw.length >= n_layer:
        kv_per_layer = _int_array(kv_raw, "attention.head_count_kv")
    per_layer, non_layer = _split_tensors(gf.tensors, n_layer)
    layers = tuple(
        LayerSpec(
            index=i,
            attention_bytes=c["attention"],
            ffn_bytes=c["ffn"],
            expert_bytes=c["expert"],
            norm_bytes=c["norm"],
            other_bytes=c["other"],
            is_swa=swa[i],
            head_count_kv=kv_per_layer[i],
        )
        for i, c in enumerate(per_layer)
    )
    quant: Counter[str] = Counter()
    for t in gf.tensors:
        quant[t.ggml_type.name] += t.n_bytes
    template = gf.metadata.get("tokenizer.chat_template")
    return ModelSpec(
        path=gf.path,
        name=str(gf.metadata.get("general.name") or gf.path.stem),
        architecture=meta.arch,
        file_type=_file_type_name(gf.metadata.get("general.file_type")),
        block_count=n_layer,
        embedding_length=n_embd,
        feed_forward_length=meta.int("feed_forward_length", 0),
        head_count=n_head,
        head_count_kv=n_head_kv,
        key_length=meta.int("attention.key_length", head_dim),
        value_length=meta.int("attention.value_length", head_dim),
        context_length=meta.int("context_length", 0),
        sliding_window=meta.int("attention.sliding_window", 0),
        expert_count=meta.int("expert_count", 0),
        expert_used_count=meta.int("expert_used_count", 0),
        vocab_size=_vocab_size(gf, meta),
        parameters=sum(t.n_elements for t in gf.tensors),
        size_bytes=gf.file_size,
        tensor_bytes=sum(t.n_bytes for t in gf.tensors),
        tensor_data_size=gf.tensor_data_size,
        non_layer_bytes=non_layer,
        layers=layers,
        quant_types=dict(quant.most_common()),
        chat_template=template if isinstance(template, str) else None,
        bos_token_id=_optional_int(gf.metadata.get("tokenizer.ggml.bos_token_id")),
        eos_token_id=_optional_int(gf.metadata.get("tokenizer.ggml.eos_token_id")),
        gguf_version=gf.version,
    )


def load_spec(path: str | Path) -> ModelSpec:
    """Read the GGUF file at `path` (metadata only) and build its ModelSpec."""
    gf = read_gguf(path)
    try:
        return spec_from_gguf(gf)
    except GGUFFormatError as exc:
        msg = str(exc)
        raise GGUFFormatError(
            msg if msg.startswith(str(gf.path)) else f"{gf.path}: {msg}"
        ) from None
