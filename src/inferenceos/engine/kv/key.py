"""What makes a saved KV state valid: the key of a KV-cache entry's family.

A state from `llama_state_seq_get_data` is only meaningful in a context of the same
model file and the same KV layout. The key hashes everything that changes the bytes
or how llama.cpp reads them: the model file's sha256, the K and V cache types, flash
attention (it decides whether V is stored transposed), `swa_full` (whether sliding-
window layers keep every cell or only their window), the pool layout (`kv_unified`)
and the llama.cpp build (its state format). The context size is *not* in it: a state
of n tokens restores into any context with room for n, which is what lets resizes and
restarts with another `n_ctx` reuse the entries. Placement (GPU layers) is left out
too: a state computed on a GPU restores on the CPU, with that device's rounding.
Prompts with media are never stored (their cells are keyed per request), so the
projector does not enter the key. RoPE settings (base, scale, YaRN) are not fields
either: no rope parameter is passed to llama.cpp (LlamaParams has none; it reads them
from the file, and `rope_scaling` only lets the planner ask for a longer context), so
the file's digest covers them. A rope override, if one is ever passed, belongs here.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from inferenceos.hardware.llama_devices import package_version

FORMAT = 1  # bump when the entry layout or the key's fields change


def key_fields(model_digest: str, settings: Any) -> dict[str, Any]:
    """The fields the key hashes (for `cache list` and tests)."""
    return {
        "format": FORMAT,
        "model": model_digest,
        "type_k": settings.type_k,
        "type_v": settings.type_v,
        "flash_attn": int(settings.flash_attn),
        "swa_full": bool(settings.swa_full),
        "kv_unified": bool(settings.kv_unified),
        # not installed as a distribution: key on the format alone
        "llama_cpp": package_version() or "unknown",
    }


def kv_key(model_digest: str, settings: Any) -> str:
    """32 hex digits naming the entries valid for this model and KV layout."""
    blob = json.dumps(key_fields(model_digest, settings), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:32]


def model_key(path: Path, settings: Any) -> str:
    """`kv_key` of the model file at `path` (its digest, cached by size and mtime)."""
    from inferenceos.model.digest import file_digest

    return kv_key(file_digest(Path(path)), settings)
