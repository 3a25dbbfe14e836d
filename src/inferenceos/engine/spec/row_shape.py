"""Verification batch shapes that llama.cpp's CPU kernels compute without an extra pass.

With more than one row, llama.cpp's CPU matrix multiply for Q8_0 / Q4_0 / Q5_0 / IQ4_NL /
F16 / F32 weights is llamafile's tinyBLAS: it tiles the weight rows by the activation
rows in tiles of 4 x 2 on x86 with 16 vector registers (AVX2) and 4 x 4 with 32
(AVX512F), and the rows left over after the last whole tile are computed by a second
walk over the entire weight matrix. For a speculative verification step every row needs
logits, so the output head (Gemma 3 270M's 262k x 640 Q8_0 matrix, 168 MB, two thirds
of the model) runs on as many rows as the step verifies: on this project's AVX2 machine
an odd row count cost about one more memory-bound pass over the head (measured,
`benchmarks/verify_rows.py`: 3 rows 66 ms against 4 rows 61, 17 rows 177 against 18
rows 176, 49 rows 444 against 50 rows 424, 97 rows 810 against 96 rows 745).

So a step's drafts are shaped to make the step's logit rows a multiple of the kernel's
column tile (`row_multiple`): the scheduler asks drafters for a few spare tokens, uses
them to round up, and otherwise drops the last draft tokens to round down
(`shape_drafts`). Greedy output does not change: only how many draft tokens a step
verifies does.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

from inferenceos.engine.llama.model_header import model_header
from inferenceos.errors import InferenceOSError

# weight types llamafile's tinyBLAS multiplies on x86 (sgemm.cpp); others take ggml's
# own kernels, whose row blocking has no such leftover pass
TINYBLAS_TYPES = frozenset({"Q8_0", "Q4_0", "Q5_0", "IQ4_NL", "F16", "F32"})


def row_multiple(system_info: str, head_type: str | None, head_on_cpu: bool) -> int:
    """The row count a verification step's logit rows should be a multiple of: the
    column tile of tinyBLAS in this llama.cpp build (`system_info`, as
    `llama_print_system_info` writes it) when the CPU computes an output head of a type
    tinyBLAS takes, else 1 (no shaping). 2 for AVX2 (measured); 4 for AVX512F (from the
    kernel source, not measured here)."""
    if not head_on_cpu or head_type not in TINYBLAS_TYPES:
        return 1
    if "AVX512 = 1" in system_info:
        return 4
    if "AVX2 = 1" in system_info:
        return 2
    return 1


def head_type(path: Path) -> str | None:
    """The ggml type name of the model's output head (`output.weight`, or the tied
    `token_embd.weight`); None when the file has neither or cannot be read. Reading the
    tensor table means walking the metadata (0.25 s for Gemma's 262k-token vocabulary),
    so the answer is kept per file version."""
    try:
        st = path.stat()
    except OSError:
        return None
    return _head_type(str(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _head_type(path: str, size: int, mtime_ns: int) -> str | None:
    try:
        tensors = {t.name: t for t in model_header(path).tensors}
    except (OSError, InferenceOSError):
        return None
    t = tensors.get("output.weight") or tensors.get("token_embd.weight")
    return t.ggml_type.name if t is not None else None


def shape_drafts(drafts: Sequence[Sequence[int]], wanted: Sequence[int], other_rows: int,
                 multiple: int) -> list[list[int]]:
    """The drafts cut so that the step's logit rows, `other_rows` plus one row per
    drafting sequence and one per draft token, are a multiple of `multiple`.

    `drafts[i]` may hold spare tokens beyond `wanted[i]` (what the sequence's own draft
    length asked for): spares are used first, to round up; when they are too few, the
    longest drafts lose their last tokens to round down. A draft may end empty (its
    sequence then decodes plainly). With multiple <= 1, or nothing to trim, each draft
    is just cut to its wanted length."""
    base = [list(d[: max(0, w)]) for d, w in zip(drafts, wanted, strict=True)]
    if multiple <= 1 or not drafts:
        return base
    rows = other_rows + sum(1 + len(d) for d in base)
    short = -rows % multiple
    if not short:
        return base
    spare = [list(d[len(b):]) for d, b in zip(drafts, base, strict=True)]
    if sum(len(s) for s in spare) >= short:
        for b, s in zip(base, spare, strict=True):
            take = min(short, len(s))
            b.extend(s[:take])
            short -= take
        return base
    excess = multiple - short  # rows to drop instead
    if sum(len(b) for b in base) < excess:
        return base
    for _ in range(excess):
        max(base, key=len).pop()
    return base
