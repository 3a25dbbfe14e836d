"""Whether a GGUF model can fill in the middle, from its header alone (no load).

llama.cpp (src/llama-vocab.cpp) takes a model's FIM prefix, suffix and middle tokens
from `tokenizer.ggml.fim_{pre,suf,mid}_token_id`, and where a file has none, from the
vocabulary by their texts (`<|fim_prefix|>` for Qwen, `<PRE>` for CodeLlama,
`<｜fim▁begin｜>` for DeepSeek, ...). `has_fim` answers the same from the header: the
metadata keys, else the token texts, found as GGUF strings (a u64 length, then the
bytes) in the header's bytes, so the vocabulary is never decoded. What the server's
`/infill` and `suffix` then use are llama.cpp's own ids (server/infill.py).
"""

from __future__ import annotations

import functools
import mmap
import struct
from pathlib import Path

from inferenceos.model.gguf_file import read_gguf

# llama-vocab.cpp's texts for each role, in its order
FIM_TEXTS: dict[str, tuple[str, ...]] = {
    "pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>",
            "▁<PRE>", "<|code_prefix|>", "<|prefix|>"),
    "suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>",
            "▁<SUF>", "<|code_suffix|>", "<|suffix|>"),
    "mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
            "▁<MID>", "<|code_middle|>", "<|middle|>"),
}


def has_fim(path: str | Path) -> bool:
    """Whether the model at `path` has FIM prefix, suffix and middle tokens, as llama.cpp
    finds them (ModelNotFoundError / GGUFFormatError as `read_gguf` raises them)."""
    p = Path(path)
    st = p.stat()
    return _has_fim(str(p.resolve()), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _has_fim(path: str, _size: int, _mtime_ns: int) -> bool:
    gf = read_gguf(path)
    need = [role for role in FIM_TEXTS
            if f"tokenizer.ggml.fim_{role}_token_id" not in gf.metadata]
    if not need:
        return True
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        end = min(gf.data_offset, len(mm))
        return all(any(mm.find(_gguf_string(t), 0, end) >= 0 for t in FIM_TEXTS[role])
                   for role in need)


def _gguf_string(text: str) -> bytes:
    """`text` as a GGUF string: its UTF-8 length (u64, little-endian), then its bytes."""
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw
