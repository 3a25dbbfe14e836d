"""What llama.cpp itself achieves here: a few-second prefill and decode of a probe model.

The roofline of `plan/perf.py` needs two machine constants it cannot know from specs:
how much of the measured RAM bandwidth llama.cpp's decode kernels reach, and how fast
its prefill kernels compute. Guessing them left a fresh machine's predictions 20-29 %
off, so `hardware` (when it measures bandwidth) also runs llama.cpp once:

1. The probe model. Preferably the built-in model (Gemma 3 270M Q4_K_M), when it is
   already assembled in the model cache: a real model, with what real small models
   spend their time on (a 262k-row output head that streams from RAM every token, 18
   layers of small matrices, Q5_0 kernels), so that the roofline fitted on it predicts
   real models; `default_model_if_ready()` never assembles it (that takes seconds).
   Otherwise `write_probe_model` writes a llama-shaped stand-in of ~220 MB with
   `gguf.GGUFWriter`: 6 layers, n_embd 1024, n_ff 4096, tensor types in the proportions
   of a typical Q4_K_M file (q8_0 for most bytes, q5_0 attention, q4_K down
   projections), and a tied output head over a 128k vocabulary (as Llama 3, Qwen and
   Gemma have). Weights are zeros: speed does not depend on the values, and zeros are
   valid in every type. Why that size: the first probe (85 MB, no large head) was read
   ~40 % from a 32 MB L3 here and streamed 44 GB/s at 2 threads where models larger
   than the cache stream ~31 GB/s (paired runs), so predictions were 1.4-1.9x too fast.
2. A child process (`python -m inferenceos.engine.llama.speed_probe MODEL`: a crash
   inside llama.cpp must not take the parent down; it loads through the engine's own
   parameter builder, so the probe times the load the engine makes: no import of the
   engine from here, only its module's name) loads it, prints "ready" and reads its
   thread count from stdin (`SpeedProbe`: the load overlaps the caller's untimed
   probes), then prefills `PROMPT` tokens in
   one ubatch and decodes `DECODE` tokens one at a time (with an argmax over the logits,
   as sampling would), best of `ROUNDS` (the prefill, a fifth of a round's time, best of
   `PREFILL_ROUNDS`: one disturbed 0.2 s prefill had put a probe 27 % below the same
   machine's speed a minute later); with more than one thread, decodes
   `DECODE_1THREAD` tokens again with one (`ROUNDS_1THREAD` times), after the same
   prompt (a thread's kernel
   rate, apart from what memory allows: see `plan.calibration.probe_calibration`;
   reported scaled to `DECODE` tokens); and prints one JSON line.
3. A written stand-in stays in the cache dir (re-created when missing, reused by the
   next refresh: writing it takes ~0.4 s, the vocabulary packed at once); the data dir gets a copy
   of its header whose tensor data is a sparse hole, which the planner reads to compute
   the probe's roofline features (`plan/calibration.py`): a few KB. The built-in model
   is read where it is.

The result is a `LlamaSpeed` record in the profile. A failure (no llama.cpp, a timeout)
is one warning in the profile and no record: the planner then uses its defaults.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferenceos.hardware.profile import LlamaSpeed

PROMPT = 64
DECODE = 24
ROUNDS = 2
PREFILL_ROUNDS = 3
# a thread's own rate: fewer tokens (at 1 thread each takes ~1.7x as long), in one
# round, so that a refresh stays within its 5 s on a slow host (a 2-core VM whose
# refresh took 5.0-5.5 s in the suite with two rounds and four prefills)
DECODE_1THREAD = 12
ROUNDS_1THREAD = 1
N_CTX = 1024
TIMEOUT_S = 60.0
# v2: the 128k-vocabulary head (a cached v1 stand-in, 85 MB, must not be reused)
PROBE_NAME = "llama-speed-probe-v2.gguf"
OLD_PROBE_NAMES = ("llama-speed-probe.gguf",)

_SHAPE = {"n_layer": 6, "n_embd": 1024, "n_ff": 4096, "n_head": 16, "n_head_kv": 4,
          "n_vocab": 131072}
_LETTERS = "abcdefghijklmnopqrstuvwxyz ."


def write_probe_model(path: Path, shape: dict[str, int] | None = None) -> Path:
    """Write the probe model (see the module doc) to `path`; returns `path`.
    `shape` overrides its dimensions (the overhead probes are tiny)."""
    import numpy as np
    from gguf import (
        GGML_QUANT_SIZES,
        GGMLQuantizationType,
        GGUFValueType,
        GGUFWriter,
        Keys,
        TokenType,
    )

    s = {**_SHAPE, **(shape or {})}
    e, ff, nh, nkv = s["n_embd"], s["n_ff"], s["n_head"], s["n_head_kv"]
    hd = e // nh
    tokens = [b"<unk>", b"<s>", b"</s>"] + [f"<0x{i:02X}>".encode() for i in range(256)]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL] + [TokenType.BYTE] * 256
    for ch in _LETTERS:
        tokens.append(("▁" if ch == " " else ch).encode())
        types.append(TokenType.NORMAL)
    n_letters = len(tokens) - 259
    pad = max(0, s.get("n_vocab", 0) - len(tokens))
    tokens += [f"<pad{i}>".encode() for i in range(pad)]
    types += [TokenType.UNUSED] * pad
    n_vocab = len(tokens)
    w = _probe_writer(GGUFWriter)(str(path), "llama")
    w.add_name("llama-speed-probe")
    for key, val in (
        ("context_length", N_CTX),
        ("embedding_length", e),
        ("block_count", s["n_layer"]),
        ("feed_forward_length", ff),
        ("attention.head_count", nh),
        ("attention.head_count_kv", nkv),
        ("rope.dimension_count", hd),
    ):
        w.add_uint32(f"llama.{key}", val)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_uint32("general.file_type", 15)  # MOSTLY_Q4_K_M
    w.add_tokenizer_model("llama")
    # the vocabulary's 3 x 131k values packed at once: gguf packs them one by one in
    # Python, 1.2 s of a 1.7 s write (a third of the first-use calibration)
    scores = [0.0] * 3 + [-1000.0] * 256 + [-float(i) for i in range(n_letters)] + [-1e9] * pad
    w.add_key_value(Keys.Tokenizer.LIST, _Packed.strings(tokens), GGUFValueType.ARRAY)
    w.add_key_value(Keys.Tokenizer.SCORES, _Packed.numbers(scores, GGUFValueType.FLOAT32),
                    GGUFValueType.ARRAY)
    w.add_key_value(Keys.Tokenizer.TOKEN_TYPE,
                    _Packed.numbers([int(t) for t in types], GGUFValueType.INT32),
                    GGUFValueType.ARRAY)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

    def quant(name: str, qtype: GGMLQuantizationType, rows: int, cols: int) -> None:
        block, size = GGML_QUANT_SIZES[qtype]
        data = np.zeros((rows, cols // block * size), dtype=np.uint8)
        w.add_tensor(name, data, raw_dtype=qtype)

    def ones(name: str, n: int) -> None:
        w.add_tensor(name, np.ones(n, dtype=np.float32))

    Q8, Q5, Q4K = GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q5_0, GGMLQuantizationType.Q4_K
    quant("token_embd.weight", Q8, n_vocab, e)
    for i in range(s["n_layer"]):
        b = f"blk.{i}."
        ones(b + "attn_norm.weight", e)
        quant(b + "attn_q.weight", Q5, nh * hd, e)
        quant(b + "attn_k.weight", Q5, nkv * hd, e)
        quant(b + "attn_v.weight", Q5, nkv * hd, e)
        quant(b + "attn_output.weight", Q5, e, nh * hd)
        ones(b + "ffn_norm.weight", e)
        quant(b + "ffn_gate.weight", Q8, ff, e)
        quant(b + "ffn_up.weight", Q8, ff, e)
        quant(b + "ffn_down.weight", Q4K, e, ff)
    ones("output_norm.weight", e)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@dataclass(frozen=True)
class _Packed:
    """A GGUF metadata array already packed: its element type, count and item bytes
    (little-endian, as GGUFWriter writes by default)."""

    ltype: int
    count: int
    items: bytes

    @classmethod
    def strings(cls, values: list[bytes]) -> _Packed:
        from gguf import GGUFValueType

        data = b"".join(struct.pack("<Q", len(v)) + v for v in values)
        return cls(int(GGUFValueType.STRING), len(values), data)

    @classmethod
    def numbers(cls, values: list[Any], ltype: Any) -> _Packed:
        import numpy as np
        from gguf import GGUFValueType

        dtype = {GGUFValueType.FLOAT32: "<f4", GGUFValueType.INT32: "<i4"}[ltype]
        return cls(int(ltype), len(values), np.asarray(values, dtype=dtype).tobytes())


def _probe_writer(base: Any) -> Any:
    """GGUFWriter (gguf 0.19, pinned) that writes `_Packed` arrays as they are."""

    class ProbeWriter(base):
        def _pack_val(self, val: Any, vtype: Any, add_vtype: bool,
                      sub_type: Any = None) -> bytes:
            if not isinstance(val, _Packed):
                return bytes(super()._pack_val(val, vtype, add_vtype, sub_type))
            head = self._pack("I", vtype) if add_vtype else b""
            return bytes(head + self._pack("I", val.ltype) + self._pack("Q", val.count)
                         + val.items)

    return ProbeWriter


def _complete(path: Path) -> bool:
    """`path` holds its data (it was not punched out or cut short)."""
    try:
        st = path.stat()
    except OSError:
        return False
    return st.st_size > 1 << 20 and st.st_blocks * 512 >= 0.9 * st.st_size


def header_copy(src: Path, dst: Path) -> Path:
    """`dst`: `src`'s header with the tensor data a sparse hole of the same size."""
    from inferenceos.model.gguf_file import read_gguf

    size = src.stat().st_size
    # our bounded reader: header and tensor table only (gguf's GGUFReader also parses
    # every metadata array into numpy, ~4 s for the stand-in's 128k-token vocabulary)
    start = min(read_gguf(src).data_offset, size)
    tmp = dst.with_suffix(".tmp")
    with open(src, "rb") as f, open(tmp, "wb") as g:
        g.write(f.read(start))
        g.truncate(size)
    os.replace(tmp, dst)
    return dst


def default_model_if_ready() -> Path | None:
    """The built-in model when it is already assembled in the model cache, else None
    (never assembles it: that is `run`'s first-time job, and takes seconds)."""
    try:
        from inferenceos.model.default_model import default_model_path

        path = default_model_path()
        marker = path.with_suffix(".verified.json")
    except ImportError:  # the built-in model's package is not installed
        return None
    return path if path.is_file() and marker.is_file() else None


class SpeedProbe:
    """A probe child started ahead of time (`start_llama_speed`): it imports llama.cpp,
    loads the model and warms up while the caller does untimed work, then waits;
    `finish(threads)` has it time prefill and decode with that many threads."""

    def __init__(self, proc: subprocess.Popen[str], path: Path, model: Path, real: bool,
                 start: float, warnings: list[str]) -> None:
        self.proc, self.path, self.model, self.real = proc, path, model, real
        self.start, self.warnings = start, warnings

    def wait_ready(self, timeout: float = TIMEOUT_S) -> bool:
        """Block until the child has loaded its model (True), died or timed out."""
        import select

        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        return bool(ready) and self.proc.stdout.readline().strip() == "ready"

    def cancel(self) -> None:
        """Stop the child without a result (no llama.cpp here, or nothing to measure)."""
        self.proc.kill()
        self.proc.communicate()

    def finish(self, threads: int) -> LlamaSpeed | None:
        """Time the loaded model with `threads` threads; None on failure (a warning)."""
        try:
            out, err = self.proc.communicate(f"{threads}\n", timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.cancel()
            self.warnings.append(f"llama.cpp speed probe: no result within {TIMEOUT_S:g} s")
            return None
        except OSError as exc:  # the child is gone: its stdin closed under us
            self.warnings.append(f"llama.cpp speed probe: {exc}")
            return None
        lines = out.strip().splitlines()
        if self.proc.returncode != 0 or not lines or lines[-1] == "ready":
            why = (err.strip().splitlines() or [f"exit status {self.proc.returncode}"])[-1]
            self.warnings.append(f"llama.cpp speed probe failed: {why}")
            return None
        return self._record(lines[-1])

    def _record(self, line: str) -> LlamaSpeed | None:
        try:
            data = json.loads(line)
            return LlamaSpeed(
                model_path=str(self.path),
                threads=int(data["threads"]),
                prompt_tokens=int(data["prompt_tokens"]),
                prefill_s=float(data["prefill_s"]),
                decode_tokens=int(data["decode_tokens"]),
                decode_s=float(data["decode_s"]),
                n_ctx=int(data["n_ctx"]),
                n_ubatch=int(data["n_ubatch"]),
                flash_attn=bool(data["flash_attn"]),
                seconds=round(time.perf_counter() - self.start, 3),
                probe=f"built-in model {self.model.name}" if self.real else "synthetic",
                decode_s_1thread=(float(data["decode_s_1thread"])
                                  if data.get("decode_s_1thread") else None),
            )
        except (ValueError, KeyError, TypeError) as exc:
            self.warnings.append(f"llama.cpp speed probe printed something unreadable: {exc}")
            return None


def start_llama_speed(
    probe_dir: Path,
    warnings: list[str] | None = None,
    model_dir: Path | None = None,
    model: Path | None = None,
) -> SpeedProbe | None:
    """Start the probe child on `model` or the stand-in (see `measure_llama_speed`);
    None (with a warning) when it cannot be started. Loading the model (a second or
    more) then overlaps the caller's own untimed work; `SpeedProbe.finish` times it."""
    warnings = warnings if warnings is not None else []
    model_dir = model_dir or probe_dir
    real = model is not None
    if model is None:
        model = model_dir / ("full-" + PROBE_NAME)
    path = model if real else probe_dir / PROBE_NAME  # the planner reads a real one as is
    start = time.perf_counter()
    try:
        if not real:
            model_dir.mkdir(parents=True, exist_ok=True)
            probe_dir.mkdir(parents=True, exist_ok=True)
            if not _complete(model):
                tmp = model.with_suffix(".tmp")
                write_probe_model(tmp)
                os.replace(tmp, model)
                for old in OLD_PROBE_NAMES:  # earlier stand-ins and their header copies
                    (model_dir / ("full-" + old)).unlink(missing_ok=True)
                    (probe_dir / old).unlink(missing_ok=True)
            header_copy(model, path)
        # the probe calibrates the CPU's kernels: a Vulkan build must not put its layers
        # (llama.cpp's default: all) on a Vulkan device, lavapipe included (vulkan.py)
        env = {**os.environ, "GGML_VK_VISIBLE_DEVICES": ""}
        proc = subprocess.Popen(
            [sys.executable, "-m", "inferenceos.engine.llama.speed_probe", str(model)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env=env,
        )
    except (OSError, ValueError, ImportError) as exc:
        warnings.append(f"llama.cpp speed probe: {exc}")
        return None
    return SpeedProbe(proc, path, model, real, start, warnings)


def measure_llama_speed(
    probe_dir: Path,
    threads: int,
    warnings: list[str] | None = None,
    model_dir: Path | None = None,
    model: Path | None = None,
) -> LlamaSpeed | None:
    """Time the probe model in a child; None on failure (with a warning).

    `model`: a real model to probe (the built-in one, see the module doc): the record
    names it, and the planner reads its header there. Without it, the written stand-in,
    which lives (with its data) in `model_dir` (default `probe_dir`; `hardware` passes
    the cache dir: it is written once and reused by later refreshes); a header-only copy
    goes to `probe_dir`, where the planner reads it.
    """
    warnings = warnings if warnings is not None else []
    probe = start_llama_speed(probe_dir, warnings, model_dir, model)
    return probe.finish(threads) if probe is not None else None
