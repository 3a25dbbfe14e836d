"""A model's eyes (and ears): llama.cpp's mtmd context for one projector file.

`MediaEncoder` turns a prompt with media markers plus its `MediaItem`s into the
scheduler's prompt: a list of token ids in which each media chunk is a run of one
negative id repeated once per context cell it takes (`MediaRun.key`, derived from the
content's digest). The scheduler prefills text as usual and, when a sequence reaches a
run, encodes it (`encode`) and decodes the embeddings in their own batch. Because the
key is the content's, the slot table's prefix matching reuses a cached image exactly as
it reuses cached text: same tokens, same image, same position.

Not supported (refused at load): projectors whose models place media with M-RoPE
(Qwen2-VL family: several positions per cell). Runs in the worker (or the in-process
engine), on the scheduler's thread; not thread-safe.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from inferenceos.engine.llama.lib import lib, log, route_log
from inferenceos.errors import GenerationError, ModelLoadError, UsageError
from inferenceos.media.item import MEDIA_MARKER, MediaItem

_TEXT, _IMAGE, _AUDIO = 0, 1, 2


def media_key(digest: str) -> int:
    """The negative id a media chunk's cells carry in a prompt (never a vocabulary id;
    within int32, as llama.cpp's token arrays are)."""
    return -(1 + int(digest[:8], 16) % (2**31 - 2))


@dataclass
class MediaRun:
    """One media chunk of a prompt: `n_tokens` cells, all carrying `key`."""

    key: int
    n_tokens: int
    kind: str  # "image" or "audio"
    chunk: Any  # an owned mtmd_input_chunk (freed by MediaEncoder.release)
    non_causal: bool  # its cells attend to each other both ways (decoded in one batch)


def _mtmd() -> Any:
    lib()  # backend init and log routing first
    from llama_cpp import mtmd_cpp

    route_log(mtmd_cpp.mtmd_log_set)  # into our log, not the user's terminal
    route_log(mtmd_cpp.mtmd_helper_log_set)
    return mtmd_cpp


class MediaEncoder:
    """The mtmd context of `mmproj` over a loaded text model (see module docstring)."""

    def __init__(self, mmproj: Path, model: Any, n_threads: int, use_gpu: bool,
                 device: str | None = None) -> None:
        """`use_gpu`: the encoder may run on a GPU backend; `device` (a llama.cpp device
        name from the plan, e.g. "CUDA1") picks which, else mtmd takes the first."""
        self._m = _mtmd()
        self._ll = lib()
        params = self._m.mtmd_context_params_default()
        params.use_gpu = use_gpu
        if use_gpu and device and device != "CPU":
            from inferenceos.engine.llama.devices import device_handle

            params.device = device_handle(device)
        params.n_threads = max(1, n_threads)
        params.print_timings = False
        params.warmup = False  # the first image pays it; a load should not
        params.media_marker = MEDIA_MARKER.encode()
        mark = log().mark()
        t0 = time.perf_counter()
        self.ctx = self._m.mtmd_init_from_file(str(mmproj).encode(), model, params)
        if not self.ctx:
            why = "; ".join(log().errors_since(mark)[-3:]) or "see --verbose"
            raise ModelLoadError(f"llama.cpp could not load the projector {mmproj}: {why}")
        self.load_s = time.perf_counter() - t0
        self.path = Path(mmproj)
        if self._m.mtmd_decode_use_mrope(self.ctx):
            self.close()
            raise ModelLoadError(f"{mmproj.name}: projectors that place media with M-RoPE "
                                 "(the Qwen2-VL family) are not supported yet")
        self.vision = bool(self._m.mtmd_support_vision(self.ctx))
        self.audio = bool(self._m.mtmd_support_audio(self.ctx))
        n_inp = getattr(self._ll, "llama_model_n_embd_inp", self._ll.llama_model_n_embd)
        self.n_embd = int(n_inp(model))
        self.encode_s = 0.0  # time spent encoding, for metrics

    # -- tokenizing ----------------------------------------------------------------------

    def _check(self, items: Sequence[MediaItem]) -> None:
        for item in items:
            if item.kind == "image" and not self.vision:
                raise UsageError(f"this model's projector ({self.path.name}) takes audio, "
                                 "not images")
            if item.kind == "audio" and not self.audio:
                raise UsageError(f"this model's projector ({self.path.name}) cannot hear "
                                 "audio: it takes images only")

    def _bitmap(self, item: MediaItem) -> Any:
        m = self._m
        buf = (ctypes.c_uint8 * len(item.data)).from_buffer_copy(item.data)
        if item.kind == "image":
            bmp = m.mtmd_bitmap_init(item.nx, item.ny, buf)
        else:  # audio: mtmd decodes (WAV, MP3, FLAC) and resamples
            bmp = m.mtmd_helper_bitmap_init_from_buf(self.ctx, buf, len(item.data), False)
        if not bmp:
            raise UsageError(f"the {item.kind} could not be decoded")
        m.mtmd_bitmap_set_id(bmp, item.digest.encode())
        return bmp

    def tokenize(self, text: str, items: Sequence[MediaItem],
                 add_special: bool = True) -> tuple[list[int], dict[int, MediaRun]]:
        """(prompt ids with one run of negative keys per media chunk, the runs by key).
        The caller owns the runs: `release` them when the request ends."""
        if text.count(MEDIA_MARKER) != len(items):
            raise UsageError(f"the prompt has {text.count(MEDIA_MARKER)} media markers "
                             f"for {len(items)} media inputs")
        self._check(items)
        m = self._m
        bitmaps = [self._bitmap(item) for item in items]
        chunks = m.mtmd_input_chunks_init()
        try:
            data = text.encode("utf-8")
            inp = m.mtmd_input_text(data, len(data), add_special, True)
            arr = (m.mtmd_bitmap_p_ctypes * max(1, len(bitmaps)))(*bitmaps)
            rc = int(m.mtmd_tokenize(self.ctx, chunks, ctypes.byref(inp), arr, len(bitmaps)))
            if rc != 0:
                raise UsageError(f"the media could not be tokenized (mtmd code {rc}: "
                                 "an image too small or too large for this projector?)")
            return self._collect(chunks)
        finally:
            m.mtmd_input_chunks_free(chunks)
            for bmp in bitmaps:
                m.mtmd_bitmap_free(bmp)

    def _collect(self, chunks: Any) -> tuple[list[int], dict[int, MediaRun]]:
        m = self._m
        prompt: list[int] = []
        runs: dict[int, MediaRun] = {}
        for i in range(int(m.mtmd_input_chunks_size(chunks))):
            chunk = m.mtmd_input_chunks_get(chunks, i)
            kind = int(m.mtmd_input_chunk_get_type(chunk))
            if kind == _TEXT:
                n = ctypes.c_size_t(0)
                ptr = m.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                prompt.extend(int(ptr[j]) for j in range(n.value))
                continue
            n_tok = int(m.mtmd_input_chunk_get_n_tokens(chunk))
            key = media_key((m.mtmd_input_chunk_get_id(chunk) or b"0").decode())
            if key not in runs:
                runs[key] = MediaRun(key, n_tok, "image" if kind == _IMAGE else "audio",
                                     m.mtmd_input_chunk_copy(chunk),
                                     bool(m.mtmd_decode_use_non_causal(self.ctx, chunk)))
            prompt.extend([key] * n_tok)
        return prompt, runs

    def media_tokens(self, item: MediaItem) -> int:
        """Context cells `item` takes (its chunk alone, without text)."""
        prompt, runs = self.tokenize(MEDIA_MARKER, [item], add_special=False)
        self.release(runs.values())
        return sum(1 for t in prompt if t < 0)

    # -- encoding ------------------------------------------------------------------------

    def encode(self, run: MediaRun) -> np.ndarray:
        """The run's embeddings, (n_tokens, n_embd) float32, from the projector."""
        t0 = time.perf_counter()
        rc = int(self._m.mtmd_encode_chunk(self.ctx, run.chunk))
        if rc != 0:
            raise GenerationError(f"the projector failed to encode the {run.kind} (code {rc})")
        ptr = self._m.mtmd_get_output_embd(self.ctx)
        out = np.ctypeslib.as_array(ptr, shape=(run.n_tokens * self.n_embd,))
        self.encode_s += time.perf_counter() - t0
        return out.reshape(run.n_tokens, self.n_embd).copy()

    def release(self, runs: Any) -> None:
        """Free the chunks `tokenize` handed out."""
        for run in runs:
            if run.chunk:
                self._m.mtmd_input_chunk_free(run.chunk)
                run.chunk = None

    def close(self) -> None:
        if self.ctx:
            self._m.mtmd_free(self.ctx)
            self.ctx = None

    def __enter__(self) -> MediaEncoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_encoder(lm: Any, mmproj: Path | None, use_gpu: bool,
                 device: str | None = None) -> MediaEncoder | None:
    """The MediaEncoder of `mmproj` over the LoadedModel `lm` (its threads), or None
    without a projector. The caller still owns `lm` when this raises."""
    if mmproj is None:
        return None
    from inferenceos.engine.session import default_threads

    return MediaEncoder(Path(mmproj), lm.model, lm.settings.n_threads or default_threads(),
                        use_gpu, device)
