"""Read llama.cpp's attention probabilities while it computes (for H2O).

llama.cpp names each layer's softmaxed attention `kq_soft_max-<layer>`: a float32
tensor of shape [n_kv cells, n_tokens, n_head] (ggml order). It exists only with flash
attention off. An eval callback (`cb_eval` in the context params) is asked, node by node,
whether we want a tensor's data; for the layers we watch we say yes, and are called again
once it is computed, when we copy it out with `ggml_backend_tensor_get`.

The probe adds, for each watched layer, the attention mass every KV cell received from
the batch's tokens (summed over heads), and remembers per batch row which cells it saw
(non-zero probability). Masked cells (free, another sequence's, or in the future) get
exactly zero after softmax, and every token sees its own cell: so the cells a batch
added for a sequence are those its rows saw that it did not hold before, in the order
of the first row that saw them. That matches cells to positions without reading
llama.cpp's private cell table (see CellTracker).
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable
from typing import Any

import numpy as np

from inferenceos import interrupt
from inferenceos.engine.llama.lib import library_dir
from inferenceos.errors import GenerationError

GGML_MAX_DIMS = 4
PREFIX = b"kq_soft_max-"


class GGMLTensor(ctypes.Structure):
    """The leading fields of `struct ggml_tensor` (ggml.h), up to `name`."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * GGML_MAX_DIMS),
        ("nb", ctypes.c_size_t * GGML_MAX_DIMS),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * 16),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * 10),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * 64),
    ]


_GGML_F32 = 0


def _tensor_get() -> Any:
    base = ctypes.CDLL(str(library_dir() / "libggml-base.so"))
    fn = base.ggml_backend_tensor_get
    fn.argtypes = [ctypes.POINTER(GGMLTensor), ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
    fn.restype = None
    return fn


class AttentionProbe:
    """Collects attention mass per KV cell from the watched layers' softmax.

    After each llama_decode: `mass[cell]` is the attention the cell received in that
    batch (summed over watched layers, heads and batch rows), and `attended[row, cell]`
    whether batch row `row` saw the cell. Call `reset()` before the next decode.
    """

    def __init__(self, layers: Iterable[int]) -> None:
        self.layers = frozenset(layers)
        self._names = {PREFIX + str(i).encode() for i in self.layers}
        self._get = _tensor_get()
        from llama_cpp.llama_cpp import ggml_backend_sched_eval_callback

        # the type llama-cpp-python declares for cb_eval; keep it alive with the context
        self.callback = ggml_backend_sched_eval_callback(interrupt.callback(self._on_tensor))
        self.mass: np.ndarray = np.zeros(0)
        self.attended: np.ndarray = np.zeros((0, 0), dtype=bool)
        self.layer_mass: dict[int, np.ndarray] = {}  # the same, layer by layer
        self.errors = 0

    def reset(self) -> None:
        self.mass = np.zeros(0)
        self.attended = np.zeros((0, 0), dtype=bool)
        self.layer_mass = {}

    def _on_tensor(self, addr: int, ask: bool, _user: int) -> bool:
        t = ctypes.cast(addr, ctypes.POINTER(GGMLTensor))
        tensor = t.contents
        if tensor.name not in self._names:
            return False  # not ours: llama.cpp need not hand it over
        if ask:
            return True
        try:
            self._collect(t, tensor)
        except Exception:  # never raise through C frames
            self.errors += 1
        return True

    def _collect(self, ptr: ctypes._Pointer, tensor: GGMLTensor) -> None:
        if tensor.type != _GGML_F32:
            self.errors += 1
            return
        n_kv, n_tok, n_head = tensor.ne[0], tensor.ne[1], tensor.ne[2]
        data = np.empty(n_kv * n_tok * n_head * max(1, tensor.ne[3]), dtype=np.float32)
        self._get(ptr, data.ctypes.data, 0, data.nbytes)
        probs = data.reshape(-1, n_head, n_tok, n_kv).sum(axis=(0, 1))  # [n_tok, n_kv]
        if self.mass.shape != (n_kv,):
            self.mass = np.zeros(n_kv)
            self.attended = probs > 0
        per_cell = probs.sum(axis=0)
        self.mass += per_cell
        layer = int(tensor.name[len(PREFIX) :])
        self.layer_mass[layer] = self.layer_mass.get(layer, 0) + per_cell


class CellTracker:
    """Which KV cell holds each position of each sequence, and the attention it got.

    `observe(probe, rows)` after every decode (rows: sequence → its batch rows in
    position order) appends the new cells and adds the batch's attention mass;
    `remove`/`truncate` mirror llama_memory_seq_rm (+ the shift that closes the gap).
    Scores are accumulated attention (H2O's heavy-hitter statistic); a cell's score
    restarts at zero when a new token takes it.
    """

    def __init__(self, n_cells: int) -> None:
        self.score = np.zeros(n_cells)
        self.cells: dict[int, list[int]] = {}

    def observe(self, probe: AttentionProbe, rows: dict[int, list[int]]) -> None:
        seen = probe.attended
        for seq, seq_rows in rows.items():
            cells = self.cells.setdefault(seq, [])
            if not seq_rows or seen.size == 0:
                continue
            hit = seen[seq_rows]  # [rows, n_kv]
            held = np.zeros(hit.shape[1], dtype=bool)
            held[[c for c in cells if c < hit.shape[1]]] = True
            new = np.flatnonzero(hit.any(axis=0) & ~held)
            if len(new) != len(seq_rows):
                raise GenerationError(
                    f"attention probe lost track of KV cells ({len(new)} new for "
                    f"{len(seq_rows)} tokens)"
                )
            order = new[np.argsort(hit[:, new].argmax(axis=0), kind="stable")]
            self.score[order] = 0.0
            cells.extend(int(c) for c in order)
        self.score[: len(probe.mass)] += probe.mass

    def scores(self, seq: int) -> np.ndarray:
        """Accumulated attention of each position of `seq`, in position order."""
        return self.score[self.cells.get(seq, [])]

    def remove(self, seq: int, p0: int, p1: int) -> None:
        del self.cells.setdefault(seq, [])[p0:p1]

    def truncate(self, seq: int, n: int) -> None:
        del self.cells.setdefault(seq, [])[n:]
