"""One model and one llama.cpp context: loading, tokens, evaluation, sequence state.

The small verbs are `tokenize`, `prefill` and `decode_one` (for measurements and
scoring: they decode plainly, with no sampler). Generating is not done here: every
generation, `run`'s one prompt included, goes through the scheduler
(`engine.scheduler.generate_one` for one sequence in process), which owns sampling,
stop strings, eos/length and the `GenerationMetrics` it leaves in `self.metrics`.
Times are wall-clock from `time.perf_counter()`; t/s figures count the tokens
llama.cpp actually evaluated.
llama.cpp's parameters come from `engine/llama/structs.py` (the one builder, shared
with `memory_report.measure_load`); `embed` / `embed_many` run on the second context of
`engine/embeddings.py`.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from inferenceos import interrupt
from inferenceos.engine.candidates import logits_row
from inferenceos.engine.embeddings import Embedder
from inferenceos.engine.generation import GenerationMetrics
from inferenceos.engine.llama.lib import lib, log
from inferenceos.engine.llama.structs import context_params, model_params
from inferenceos.engine.llama.structs import default_threads as default_threads  # re-exported
from inferenceos.engine.llama.tokens import prompt_ids, tokenize
from inferenceos.engine.logprobs import TokenLogprob, read_logprobs
from inferenceos.errors import GenerationError, ModelLoadError
from inferenceos.plan.llama_params import LlamaParams


def _watch_workers(s: LlamaParams) -> Any:
    """A LinkWatchdog over the RPC workers the model uses (None without any): a worker
    that stops answering ends this process instead of hanging a request."""
    if not s.devices:
        return None
    from inferenceos.engine.llama.devices import LinkWatchdog, rpc_addresses

    addresses = rpc_addresses(s.devices)
    return LinkWatchdog(addresses) if addresses else None


def _load_interruptibly(ll: Any, path: bytes, params: Any) -> Any:
    """`llama_model_load_from_file` on a helper thread, waited for in steps that a
    Ctrl-C can break: the first second of a large-vocabulary load (Gemma's 262k tokens)
    runs before llama.cpp calls the progress callback for the first time, so a stop
    asked for then would wait for it. On KeyboardInterrupt the load is left to stop at
    its next progress step, and a model it still returns is freed."""
    box: list[Any] = []
    thread = threading.Thread(target=lambda: box.append(ll.llama_model_load_from_file(
        path, params)), name="llama-load", daemon=True)
    thread.start()
    try:
        while thread.is_alive():
            thread.join(0.05)
    except BaseException:
        interrupt.request()  # the progress callback stops the abandoned load

        def free_when_done() -> None:
            thread.join()
            if box and box[0]:
                ll.llama_model_free(box[0])

        threading.Thread(target=free_when_done, name="llama-load-free", daemon=True).start()
        raise
    return box[0]


def _streamer(path: Path, s: LlamaParams, eval_callback: Any) -> Any:
    """The prefetch thread of a disk-bound load (engine/weights/prefetch.py), or None: when
    nothing streams, and when the caller has its own cb_eval (llama.cpp takes one;
    the attention probe wins, and the kernel pages the weights alone)."""
    if s.stream_resident_bytes <= 0 or eval_callback is not None or not s.use_mmap:
        return None
    from inferenceos.engine.weights.prefetch import LayerStreamer

    source, sink = _heat_store(path)
    return LayerStreamer(path, s.stream_resident_bytes,
                         offloaded=s.n_gpu_layers if s.devices else 0,
                         heat_source=source, heat_sink=sink)


def _heat_store(path: Path) -> tuple[Any, Any]:
    """The telemetry store's expert heat for `path` (telemetry/expert_heat.py): a reader
    and a writer, each called on the streamer's thread. Keyed by the file's digest, so a
    renamed or registry copy shares it; the writer is the process's recorder (off when
    telemetry is)."""
    from inferenceos.telemetry.expert_heat import read_heat
    from inferenceos.telemetry.identity import model_digest
    from inferenceos.telemetry.recorder import recorder

    def source() -> Any:
        return read_heat(model_digest(path))

    def sink(picks: dict[int, Any], tokens: dict[int, float]) -> None:
        recorder().expert_heat(path, picks, tokens)

    return source, sink


def decode_failed(rc: int) -> None:
    """Call when llama_decode returned `rc` != 0: an abort that a Ctrl-C asked for is a
    KeyboardInterrupt (the caller raises its own error for any other code)."""
    if rc == 2:
        interrupt.check()


class LoadedModel:
    """A llama.cpp model with one context. Not thread-safe; call `close()` when done."""

    def __init__(
        self, path: Path, settings: LlamaParams | None = None, eval_callback: Any = None
    ) -> None:
        """Load `path` with `settings`; `eval_callback` (a ctypes cb_eval function, e.g.
        an AttentionProbe's) is handed to llama.cpp and must outlive the context."""
        self.path = Path(path)
        self.settings = settings or LlamaParams()
        self.settings.validate()
        self._streamer = _streamer(self.path, self.settings, eval_callback)
        self._eval_callback = self._streamer.callback if self._streamer else eval_callback
        self._ll = lib()
        t0 = time.perf_counter()
        try:
            self.model = self._load_model()
        except BaseException:
            if self._streamer is not None:
                self._streamer.close()
            raise
        self.ctx: Any = None
        self._embedder = Embedder(self)
        try:
            self.ctx = self._new_context()
            interrupt.check()  # a Ctrl-C that llama.cpp's log callback could not raise
        except BaseException:
            if self.ctx is not None:
                self._ll.llama_free(self.ctx)
            self._ll.llama_model_free(self.model)
            if self._streamer is not None:
                self._streamer.close()
            raise
        self.vocab = self._ll.llama_model_get_vocab(self.model)
        self.n_vocab = int(self._ll.llama_vocab_n_tokens(self.vocab))
        self._adopt_context()
        if self._streamer is not None:
            self._streamer.attach()
        self.load_s = time.perf_counter() - t0
        self._watchdog = _watch_workers(self.settings)  # once loaded: nothing to undo
        self.metrics = GenerationMetrics(load_s=self.load_s)
        self._piece_buf = ctypes.create_string_buffer(256)
        self._piece_bytes: dict[int, bytes] = {}  # piece(): token -> its bytes, once read
        self._eog_of: dict[int, bool] = {}  # is_eog(): token -> whether it ends generation

    def _load_model(self) -> Any:
        params = model_params(self.settings)
        self._keep_alive = params.keep  # llama.cpp points into these while it loads
        mark = log().mark()
        model = _load_interruptibly(self._ll, str(self.path).encode(), params.struct)
        if not model:
            interrupt.check()  # stopped by a Ctrl-C: KeyboardInterrupt, not a load error
            why = "; ".join(log().errors_since(mark)[-3:]) or "see --verbose"
            raise ModelLoadError(f"llama.cpp could not load {self.path}: {why}")
        return model

    def _new_context(self) -> Any:
        params = context_params(self.settings, self._eval_callback)
        mark = log().mark()
        ctx = self._ll.llama_init_from_model(self.model, params)
        if not ctx:
            why = "; ".join(log().errors_since(mark)[-3:]) or "see --verbose"
            raise ModelLoadError(f"llama.cpp could not create a context for {self.path}: {why}")
        return ctx

    # -- tokens ------------------------------------------------------------------------

    def tokenize(
        self, text: str, add_special: bool = True, parse_special: bool = True
    ) -> list[int]:
        """Text → token ids; special tokens written as text (e.g. `<start_of_turn>`) parse."""
        tokens = tokenize(self.vocab, text, add_special, parse_special)
        if tokens is None:
            raise GenerationError("tokenization failed")
        return prompt_ids(tokens, self.bos_token)

    def piece(self, token: int) -> bytes:
        """The bytes of one token (control tokens render as nothing). Kept once read:
        the vocabulary never changes, and a ctypes call and a buffer copy per generated
        token were ~2 us of the step (issue 44)."""
        got = self._piece_bytes.get(token)
        if got is not None:
            return got
        buf = self._piece_buf
        n = self._ll.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
        if n < 0:
            self._piece_buf = buf = ctypes.create_string_buffer(-n)
            n = self._ll.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
        got = self._piece_bytes[token] = buf.raw[: max(n, 0)]
        return got

    def token_text(self, token: int, special: bool = True) -> str:
        buf = ctypes.create_string_buffer(256)
        n = self._ll.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        return buf.raw[: max(n, 0)].decode("utf-8", errors="replace")

    @property
    def bos_token(self) -> int:
        return int(self._ll.llama_vocab_bos(self.vocab))

    @property
    def eos_token(self) -> int:
        return int(self._ll.llama_vocab_eos(self.vocab))

    def is_eog(self, token: int) -> bool:
        got = self._eog_of.get(token)
        if got is None:
            got = self._eog_of[token] = bool(self._ll.llama_vocab_is_eog(self.vocab, token))
        return got

    def logits_row(self, row: int = -1) -> np.ndarray:
        """A read-only view of batch row `row`'s logits (-1: the last row with logits),
        valid until the next decode: copy it to keep it."""
        return logits_row(self._ll, self.ctx, row, self.n_vocab)

    def logprobs(
        self, row: int, chosen: int, top_n: int
    ) -> tuple[TokenLogprob, tuple[TokenLogprob, ...]]:
        """Log-probabilities at batch row `row` of the last decode (see engine.logprobs)."""
        return read_logprobs(self.logits_row(row), chosen, top_n, self.piece)

    # -- evaluation --------------------------------------------------------------------

    def reset(self) -> None:
        """Forget every cached token (start a fresh conversation)."""
        self._ll.llama_memory_clear(self._ll.llama_get_memory(self.ctx), True)

    def _decode(self, tokens: list[int]) -> None:
        arr = (self._ll.llama_token * len(tokens))(*tokens)
        rc = self._ll.llama_decode(self.ctx, self._ll.llama_batch_get_one(arr, len(tokens)))
        if rc != 0:
            decode_failed(rc)
            reason = {1: "no KV cache slot (context full)", 2: "aborted"}.get(rc, f"error {rc}")
            raise GenerationError(f"llama_decode failed: {reason}")

    def prefill(self, tokens: list[int]) -> None:
        """Evaluate prompt tokens in chunks of n_batch; logits kept for the last one."""
        step = self.settings.n_batch
        for i in range(0, len(tokens), step):
            self._decode(tokens[i : i + step])

    def decode_one(self, token: int) -> None:
        self._decode([token])

    # -- sequence state ------------------------------------------------------------------

    def save_sequence(self, seq_id: int = 0) -> bytes:
        """The KV state of one sequence as bytes (the basis of migration and sessions)."""
        ll = self._ll
        size = int(ll.llama_state_seq_get_size(self.ctx, seq_id))
        buf = (ctypes.c_uint8 * size)()
        written = int(ll.llama_state_seq_get_data(self.ctx, buf, size, seq_id))
        if written != size:
            raise GenerationError(f"llama.cpp wrote {written} of {size} state bytes")
        return bytes(buf)

    def restore_sequence(self, data: bytes, seq_id: int = 0) -> None:
        """Replace sequence `seq_id`'s KV state with bytes from `save_sequence`.

        The state must come from the same model; llama.cpp checks its layout and a
        mismatch raises GenerationError, leaving the sequence empty.
        """
        ll = self._ll
        ll.llama_memory_seq_rm(ll.llama_get_memory(self.ctx), seq_id, -1, -1)
        # llama.cpp reads the bytes object's own buffer (const): no copy of what can be
        # 100+ MB (a 4,000-token state of a 1.5B model), ~25 ms saved per restore
        src = ctypes.cast(ctypes.c_char_p(data), ctypes.POINTER(ctypes.c_uint8))
        if int(ll.llama_state_seq_set_data(self.ctx, src, len(data), seq_id)) == 0:
            raise GenerationError("llama.cpp refused the sequence state")

    # -- embeddings --------------------------------------------------------------------

    def embed(self, text: str) -> list[float]:
        """The mean-pooled, L2-normalised embedding of `text`."""
        return self.embed_many([text])[0]

    def embed_many(self, texts: Sequence[str | list[int]]) -> list[list[float]]:
        """Embeddings of `texts`, in order, several texts per llama_decode, on a second
        context created the first time (engine/embeddings.py). An item may be token ids
        (llama.cpp's API), checked against the vocabulary."""
        return self._embedder.embed_many(texts)

    def free_context(self) -> None:
        """Free the context (KV cells, compute and output buffers) and keep the weights:
        a "warm" model. `open_context` makes it usable again without re-reading them."""
        self._embedder.close()
        if self.ctx is not None:
            self._ll.llama_free(self.ctx)
            self.ctx = None

    def open_context(self, settings: LlamaParams | None = None) -> float:
        """A fresh context (with `settings`' context fields, if given) on the loaded
        weights, replacing any current one; returns the seconds it took."""
        t0 = time.perf_counter()
        if settings is not None:
            settings.validate()
            self.settings = settings
        self.free_context()
        self.ctx = self._new_context()
        self._adopt_context()
        return time.perf_counter() - t0

    def _adopt_context(self) -> None:
        """Take the context's sizes from llama.cpp: it pads n_ctx up (to 256 cells) and
        caps n_batch and n_ubatch at the n_ctx asked for, so a batch sized from the
        settings alone (`--ctx 20` with a 22-token prompt) tripped its
        `GGML_ASSERT(n_tokens_all <= cparams.n_batch)` and killed the process. Everything
        that sizes a batch reads `settings.n_batch`, so the settings follow."""
        ll = self._ll
        self.n_ctx = int(ll.llama_n_ctx(self.ctx))
        n_batch, n_ubatch = int(ll.llama_n_batch(self.ctx)), int(ll.llama_n_ubatch(self.ctx))
        if (n_batch, n_ubatch) != (self.settings.n_batch, self.settings.n_ubatch):
            self.settings = replace(self.settings, n_batch=n_batch, n_ubatch=n_ubatch)

    def close(self) -> None:
        if getattr(self, "_watchdog", None) is not None:
            self._watchdog.stop()
            self._watchdog = None
        self._embedder.close()
        # the streamer's threads stop before the mapping they advise and lock goes (its
        # callback object stays alive with self._eval_callback, for the context's sake)
        if getattr(self, "_streamer", None) is not None:
            self._streamer.close()
        if self.ctx is not None:
            self._ll.llama_free(self.ctx)
            self.ctx = None
        if self.model is not None:
            self._ll.llama_model_free(self.model)
            self.model = None
        self._streamer = None

    def __enter__(self) -> LoadedModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
