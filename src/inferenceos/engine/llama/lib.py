"""The llama.cpp library as shipped by llama-cpp-python: loading, backend init, logging.

Everything else in `engine/` reaches llama.cpp through `lib()`, which returns the
low-level `llama_cpp.llama_cpp` bindings after a one-time `llama_backend_init()` and
with llama.cpp's log routed into a `LlamaLog` (instead of spamming stderr). The log is
kept because llama.cpp reports facts nowhere else: buffer sizes, why a load failed.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from collections import deque
from pathlib import Path
from types import ModuleType
from typing import Any

from inferenceos import interrupt
from inferenceos.errors import ModelLoadError
from inferenceos.hardware.llama_devices import llama_lib_dir
from inferenceos.hardware.openmp import bounded_spin
from inferenceos.hardware.vulkan import vulkan_environment

# ggml_log_level values (ggml.h)
LOG_LEVEL_NAMES = {0: "none", 1: "debug", 2: "info", 3: "warn", 4: "error", 5: "cont"}


class LlamaLog:
    """A bounded record of llama.cpp log lines, optionally echoed to stderr."""

    def __init__(self, max_lines: int = 4000) -> None:
        self.lines: deque[tuple[str, str]] = deque(maxlen=max_lines)
        self.total = 0  # lines ever appended: marks stay valid after old lines drop off
        self.echo = False
        self._partial = ""
        self._lock = threading.Lock()

    def write(self, level: int, text: str) -> None:
        """Append `text` (llama.cpp may send a line in several pieces)."""
        if self.echo:
            sys.stderr.write(text)
        with self._lock:
            self._partial += text
            while "\n" in self._partial:
                line, self._partial = self._partial.split("\n", 1)
                self.lines.append((LOG_LEVEL_NAMES.get(level, "info"), line))
                self.total += 1

    def mark(self) -> int:
        """A position to read lines from later (see `since`)."""
        with self._lock:
            return self.total

    def _after(self, mark: int) -> list[tuple[str, str]]:
        # the deque holds the last len(lines) of `total` lines; older ones are gone
        first_kept = self.total - len(self.lines)
        return list(self.lines)[max(0, mark - first_kept) :]

    def since(self, mark: int) -> list[str]:
        """Lines logged after `mark` that are still kept (the newest `max_lines`)."""
        with self._lock:
            return [text for _, text in self._after(mark)]

    def errors_since(self, mark: int) -> list[str]:
        with self._lock:
            return [t for lvl, t in self._after(mark) if lvl == "error" and t.strip()]


_lock = threading.Lock()
_lib: ModuleType | None = None
_log = LlamaLog()
_log_callback: Any = None  # keep the ctypes callback alive for the process lifetime
_stop_callbacks: tuple[Any, Any] | None = None  # (progress, abort), alive likewise


def log() -> LlamaLog:
    """The process-wide llama.cpp log."""
    return _log


def lib() -> ModuleType:
    """The initialised low-level llama.cpp bindings (`llama_cpp.llama_cpp`)."""
    global _lib, _log_callback
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            bounded_spin()  # before libgomp loads with the library (hardware/openmp.py)
            vulkan_environment(llama_lib_dir())  # lavapipe where no GPU: hardware/vulkan.py
            try:
                from llama_cpp import llama_cpp as bindings
            except (ImportError, OSError) as exc:
                raise ModelLoadError(
                    f"llama.cpp is not usable: {exc}; reinstall with "
                    "CMAKE_ARGS='-DGGML_RPC=ON' pip install --force-reinstall --no-cache-dir "
                    "llama-cpp-python==0.3.36"
                ) from None

            @bindings.llama_log_callback
            @interrupt.callback  # llama.cpp logs on the main thread all through a load
            def _on_log(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
                _log.write(level, text.decode("utf-8", errors="replace"))

            _log_callback = _on_log
            bindings.llama_log_set(_log_callback, ctypes.c_void_p(0))
            bindings.llama_backend_init()
            _lib = bindings
    assert _lib is not None
    return _lib


def stop_callbacks() -> tuple[Any, Any]:
    """(a model-load progress callback, a context abort callback) that stop llama.cpp
    when `interrupt.requested()`: give the first to `llama_model_params`, the second to
    `llama_context_params` with `interrupt.flag_address()` as its data. A stopped load
    returns no model, a stopped decode returns 2 (see interrupt.py)."""
    global _stop_callbacks
    if _stop_callbacks is None:
        bindings = lib()

        @bindings.llama_progress_callback
        @interrupt.callback
        def _on_progress(_progress: float, _user: ctypes.c_void_p) -> bool:
            return not interrupt.requested()

        _stop_callbacks = (_on_progress, bindings.ggml_abort_callback(interrupt.abort_function()))
    return _stop_callbacks


def route_log(setter: Any) -> None:
    """Send another llama.cpp library's log (e.g. mtmd's `mtmd_log_set`) to `log()`."""
    lib()
    setter(_log_callback, ctypes.c_void_p(0))


def library_dir() -> Path:
    """The folder holding libllama.so and the ggml backend libraries."""
    bounded_spin()  # importing the package loads the libraries
    vulkan_environment(llama_lib_dir())
    import llama_cpp

    return Path(llama_cpp.__file__).parent / "lib"


def has_rpc_backend() -> bool:
    """Whether llama.cpp was built with its RPC backend (-DGGML_RPC=ON)."""
    return any(library_dir().glob("libggml-rpc*"))
