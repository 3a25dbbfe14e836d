"""The `self` drafter's model: a shallower, narrower-headed copy of the model itself.

Written on the spot with `gguf.GGUFWriter` from the model's own tensors, into the cache
dir, once per (model digest-ish key, recipe); nothing is downloaded. Two cuts:

- **layer skipping**: whole middle layers are dropped. On a model with a sliding-window
  pattern (Gemma 3: five local layers then one global, llama.cpp derives which layer is
  which from its index) whole pattern groups are dropped, so every kept layer keeps its
  kind; otherwise the middle layers go.
- **vocabulary head trimming** (as FR-Spec, Zhao et al. 2025): on small models the output
  head dominates a token's cost (Gemma 3 270M: 262 144 × 640 weights, more than all 18
  layers), so the draft keeps only the first `vocab` token ids (SentencePiece orders ids
  by merge rank: the common pieces come first). Its drafts can only be those tokens;
  input tokens beyond the cut are fed to it as the unknown token. The target verifies
  every draft, so this costs acceptance, never correctness.

The metadata is read with a small walker over the already validated header (gguf-py's
reader builds one numpy view per vocabulary entry: 34 s on Gemma's 262k vocabulary).
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter

from inferenceos.errors import ModelLoadError
from inferenceos.model.gguf_file import TensorInfo, read_gguf
from inferenceos.paths import cache_dir, ensure_dir

_SCALAR = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h", GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?", GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d",
}
# per-token metadata arrays that must be cut with the vocabulary
_VOCAB_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type")
_BLK = re.compile(r"^blk\.(\d+)\.(.+)$")


def _read_kv(buf: Any, pos: int, n_kv: int) -> list[tuple[str, Any, GGUFValueType, Any]]:
    """(key, value, type, array item type) of every metadata entry, from offset `pos`.
    Only called on a file `read_gguf` already validated, so lengths are trusted."""

    def u32() -> int:
        nonlocal pos
        (v,) = struct.unpack_from("<I", buf, pos)
        pos += 4
        return int(v)

    def string() -> bytes:
        nonlocal pos
        (n,) = struct.unpack_from("<Q", buf, pos)
        pos += 8
        s = bytes(buf[pos : pos + n])
        pos += n
        return s

    def value(vt: GGUFValueType) -> Any:
        nonlocal pos
        if vt == GGUFValueType.STRING:
            return string().decode("utf-8", errors="replace")
        fmt = _SCALAR[vt]
        (v,) = struct.unpack_from(fmt, buf, pos)
        pos += struct.calcsize(fmt)
        return v

    out: list[tuple[str, Any, GGUFValueType, Any]] = []
    for _ in range(n_kv):
        key = string().decode()
        vt = GGUFValueType(u32())
        if vt != GGUFValueType.ARRAY:
            out.append((key, value(vt), vt, None))
            continue
        it = GGUFValueType(u32())
        (n,) = struct.unpack_from("<Q", buf, pos)
        pos += 8
        if it == GGUFValueType.STRING:
            items: list[Any] = [string() for _ in range(n)]
        else:
            fmt = _SCALAR[it]
            size = struct.calcsize(fmt)
            items = np.frombuffer(buf, dtype=np.dtype(fmt), count=n, offset=pos).tolist()
            pos += n * size
        out.append((key, items, vt, it))
    return out


def kept_layers(n_layer: int, keep: float) -> list[int]:
    """Which layers the draft keeps: about `keep` of them, the first and last always; a
    contiguous block in the middle is skipped (the early layers build the representation
    and the last ones map it to the vocabulary, so the middle is the cheapest to lose)."""
    n_keep = max(2, min(n_layer, round(n_layer * keep)))
    drop = n_layer - n_keep
    first = (n_layer - drop + 1) // 2
    return [i for i in range(n_layer) if not first <= i < first + drop]


def swa_flags(metadata: Any, arch: str, n_layer: int) -> list[int] | None:
    """Per layer, 1 if it uses the sliding window (llama.cpp's rule: a per-layer array
    if the file has one, else a period, 6 for Gemma 3); None without a window."""
    if not metadata.get(f"{arch}.attention.sliding_window"):
        return None
    period = metadata.get(f"{arch}.attention.sliding_window_pattern")
    if period is not None and not isinstance(period, (int, float)):
        return None  # a per-layer array: copied (and cut) like any per-layer array
    n = int(period or (6 if arch == "gemma3" else 0))
    return [int(n == 0 or i % n < n - 1) for i in range(n_layer)]


def self_draft_path(model: Path, keep: float = 0.83, vocab: int = 0) -> Path:
    """The cached self-draft of `model` with this recipe, built now when missing."""
    st = model.stat()
    tag = f"{model.stem}-{st.st_size}-{int(st.st_mtime)}-k{int(keep * 100)}-v{vocab}"
    target = ensure_dir(cache_dir() / "self-drafts") / f"{tag}.gguf"
    if not target.is_file():
        tmp = target.with_suffix(f".{os.getpid()}.tmp")
        try:
            build_self_draft(model, tmp, keep, vocab)
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
    return target


def build_self_draft(model: Path, out: Path, keep: float = 0.83, vocab: int = 0) -> None:
    """Write the self-draft of `model` to `out` (see module docstring). `vocab` 0 keeps
    the whole vocabulary."""
    info = read_gguf(model)
    arch = str(info.metadata.get("general.architecture", ""))
    n_layer = int(info.metadata.get(f"{arch}.block_count", 0))
    if n_layer < 3:
        raise ModelLoadError(f"{model.name} has {n_layer} layers: too few for a self-draft")
    layers = kept_layers(n_layer, keep)
    flags = swa_flags(info.metadata, arch, n_layer)
    renumber = {old: new for new, old in enumerate(layers)}
    with open(model, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        (n_kv,) = struct.unpack_from("<Q", buf, 16)
        kvs = _read_kv(buf, 24, n_kv)
        n_vocab = next((len(v) for k, v, _, _ in kvs if k == "tokenizer.ggml.tokens"), 0)
        cut = vocab if 0 < vocab < n_vocab else n_vocab
        w = GGUFWriter(str(out), arch)
        try:
            for key, value, vt, it in kvs:
                if key in ("general.architecture", "general.alignment"):
                    continue  # the writer adds them
                if key == f"{arch}.block_count":
                    value = len(layers)
                elif key == f"{arch}.attention.sliding_window_pattern" and flags is not None:
                    continue  # written per layer below
                elif key in _VOCAB_ARRAYS:
                    value = value[:cut]
                elif vt == GGUFValueType.ARRAY and len(value) == n_layer:
                    value = [value[i] for i in layers]  # per-layer arrays
                if vt == GGUFValueType.ARRAY and not value:
                    continue
                w.add_key_value(key, value, vt, it)
            if flags is not None:  # which kept layer is local: by its old index
                w.add_key_value(f"{arch}.attention.sliding_window_pattern",
                                [flags[i] for i in layers], GGUFValueType.ARRAY,
                                GGUFValueType.UINT32)
            if cut < n_vocab and not any(k == "tokenizer.ggml.unknown_token_id" for k, *_ in kvs):
                w.add_key_value("tokenizer.ggml.unknown_token_id", 0, GGUFValueType.UINT32)
            for t in info.tensors:
                name = _draft_name(t, renumber)
                if name is not None:
                    _add_tensor(w, name, t, buf, cut, n_vocab)
            w.write_header_to_file()
            w.write_kv_data_to_file()
            w.write_tensors_to_file()
        finally:
            w.close()


def _draft_name(t: TensorInfo, renumber: dict[int, int]) -> str | None:
    m = _BLK.match(t.name)
    if m is None:
        return t.name
    new = renumber.get(int(m.group(1)))
    return None if new is None else f"blk.{new}.{m.group(2)}"


def _add_tensor(w: GGUFWriter, name: str, t: TensorInfo, buf: Any, cut: int, n_vocab: int) -> None:
    """Copy tensor `t`'s raw bytes (cut to the first `cut` vocabulary rows when its
    outer dimension is the vocabulary)."""
    shape = list(t.shape)
    n_bytes = t.n_bytes
    if cut < n_vocab and len(shape) == 2 and shape[1] == n_vocab:
        n_bytes = n_bytes // n_vocab * cut  # rows are whole blocks: bytes per row × rows
        shape[1] = cut
    raw = np.frombuffer(buf, dtype=np.uint8, count=n_bytes, offset=t.offset)
    outer = list(reversed(shape))  # numpy order: outermost first, the reverse of ggml's ne
    plain = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16}
    if t.ggml_type in plain:
        w.add_tensor(name, raw.view(plain[t.ggml_type]).reshape(outer).copy())
    else:  # quantized: the writer takes bytes shaped (rows..., bytes per row)
        w.add_tensor(name, raw.reshape([*outer[:-1], -1]).copy(), raw_dtype=t.ggml_type)
