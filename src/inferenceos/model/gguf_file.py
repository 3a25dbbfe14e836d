"""Bounded reader for the GGUF container: header, metadata and tensor table.

A GGUF file is attacker-controlled input (llama.cpp and Ollama have had many CVEs in
this parser). Every count, string length, array length and tensor size read here is
checked against the bytes left in the file *before* anything is allocated for it, so a
hostile file costs at most O(file size) work and O(header size) memory, and is rejected
with a `GGUFFormatError` naming the offending value. No other exception escapes
`parse_gguf` for any input bytes.

The checks follow llama.cpp's own loader (`ggml/src/gguf.cpp`) where it is stricter than
the format needs to be (non-empty keys, `general.alignment` of type uint32, tensor names
shorter than GGML_MAX_NAME), so that a file accepted here does not trip an assertion in
the engine later. Tensor data may be laid out in any order with any gaps, as long as every
tensor is aligned, lies inside the file, and overlaps no other.

Why not `gguf.GGUFReader`: it builds one numpy view per array element (34 s on Gemma 3's
262 144-token vocabulary) and does not bound counts. We still take the format's schema —
value types, quantisation block sizes — from the official `gguf` package.

Arrays of strings are not decoded (a vocabulary is only counted); arrays of numbers are
kept when short (`MAX_KEPT_ARRAY`), otherwise only their length is recorded.
"""

from __future__ import annotations

import itertools
import mmap
import struct
import threading
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import IO, Any, NamedTuple

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from inferenceos.errors import GGUFFormatError, ModelNotFoundError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
ALIGNMENT_KEY = "general.alignment"
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_NAME_BYTES = 63  # GGML_MAX_NAME (64) less the terminating NUL
MAX_SHOWN = 80  # characters of a key quoted in an error message
MAX_KEPT_ARRAY = 4096  # numeric arrays longer than this keep only their length
INT64_MAX = 2**63 - 1

# What `parse_gguf` can read from: anything struct.unpack_from and slicing accept.
Buffer = bytes | bytearray | memoryview | mmap.mmap

# struct format and size of each fixed-size scalar value type
_SCALARS: dict[GGUFValueType, tuple[str, int]] = {
    GGUFValueType.UINT8: ("<B", 1),
    GGUFValueType.INT8: ("<b", 1),
    GGUFValueType.UINT16: ("<H", 2),
    GGUFValueType.INT16: ("<h", 2),
    GGUFValueType.UINT32: ("<I", 4),
    GGUFValueType.INT32: ("<i", 4),
    GGUFValueType.FLOAT32: ("<f", 4),
    GGUFValueType.BOOL: ("<?", 1),
    GGUFValueType.UINT64: ("<Q", 8),
    GGUFValueType.INT64: ("<q", 8),
    GGUFValueType.FLOAT64: ("<d", 8),
}
_U64 = struct.Struct("<Q")
_MIN_KV_BYTES = 8 + 1 + 4 + 1  # 1-byte key, type, 1-byte value
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8  # empty name, n_dims, type, offset


class ArrayInfo(NamedTuple):
    """A metadata array: its element type, length, and the values when kept."""

    item_type: GGUFValueType
    length: int
    values: tuple[Any, ...] | None  # None when not kept (strings, or too long)


class TensorInfo(NamedTuple):
    """One entry of the tensor table. `offset` is absolute within the file.

    Invariants after `parse_gguf`: `0 <= n_bytes`, `offset + n_bytes <= file_size`,
    `offset` is aligned, and no two tensors' byte ranges overlap.
    """

    name: str
    shape: tuple[int, ...]  # ggml order: shape[0] is the fastest-varying dimension
    ggml_type: GGMLQuantizationType
    offset: int
    n_bytes: int

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


class GGUFFile(NamedTuple):
    """Everything in a GGUF file except the tensor data itself.

    Invariant after `parse_gguf`: `data_offset <= file_size`, so `tensor_data_size >= 0`.
    """

    path: Path
    version: int
    metadata: Mapping[str, Any]  # scalars as Python values, arrays as ArrayInfo
    tensors: tuple[TensorInfo, ...]
    alignment: int
    data_offset: int  # start of the tensor data section
    file_size: int

    @property
    def tensor_data_size(self) -> int:
        """Bytes from the start of the data section to the end of the file."""
        return self.file_size - self.data_offset


class _Cursor:
    """Reads little-endian primitives from a buffer, never past `size`."""

    def __init__(self, buf: Buffer, size: int) -> None:
        self.buf = buf
        self.size = size
        self.pos = 0

    def left(self) -> int:
        return self.size - self.pos

    def need(self, n: int, what: str) -> None:
        """Raise unless `n` more bytes are available; call before reading or allocating."""
        if n < 0 or n > self.left():
            raise GGUFFormatError(
                f"truncated file: {what} needs {n} bytes at offset {self.pos}, "
                f"only {self.left()} left"
            )

    def scalar(self, vtype: GGUFValueType, what: str) -> Any:
        fmt, n = _SCALARS[vtype]
        self.need(n, what)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return value

    def u32(self, what: str) -> int:
        return int(self.scalar(GGUFValueType.UINT32, what))

    def u64(self, what: str) -> int:
        return int(self.scalar(GGUFValueType.UINT64, what))

    def raw_string(self, what: str) -> bytes:
        length = self.u64(f"length of {what}")
        self.need(length, f"{what} of {length} bytes")
        data = bytes(self.buf[self.pos : self.pos + length])
        self.pos += length
        return data

    def skip_strings(self, count: int, what: str) -> None:
        """Skip `count` length-prefixed strings (a vocabulary: keep this loop tight)."""
        buf, size, pos, unpack = self.buf, self.size, self.pos, _U64.unpack_from
        for i in range(count):
            if size - pos < 8:
                self.pos = pos
                self.need(8, f"length of string {i} of {what}")
            (length,) = unpack(buf, pos)
            pos += 8
            if length > size - pos:
                self.pos = pos
                self.need(length, f"string {i} of {what} of {length} bytes")
            pos += length
        self.pos = pos

    def text(self, what: str) -> str:
        data = self.raw_string(what)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise GGUFFormatError(f"{what} is not valid UTF-8 (at byte {exc.start})") from None


def _show(text: str) -> str:
    """`text` quoted for an error message, cut short: a key may be megabytes long."""
    return repr(text) if len(text) <= MAX_SHOWN else f"{text[:MAX_SHOWN]!r}..."


def _value_type(code: int, what: str) -> GGUFValueType:
    try:
        return GGUFValueType(code)
    except ValueError:
        raise GGUFFormatError(f"{what} has unknown value type {code}") from None


def _read_array(cur: _Cursor, label: str) -> ArrayInfo:
    item_type = _value_type(cur.u32(f"item type of array {label}"), f"array {label}")
    if item_type == GGUFValueType.ARRAY:
        raise GGUFFormatError(f"array {label} holds arrays; nested arrays are not supported")
    length = cur.u64(f"length of array {label}")
    if item_type == GGUFValueType.STRING:
        # every string costs at least its 8-byte length prefix
        cur.need(length * 8, f"array {label} of {length} strings")
        cur.skip_strings(length, f"array {label}")
        return ArrayInfo(item_type, length, None)
    fmt, size = _SCALARS[item_type]
    cur.need(length * size, f"array {label} of {length} items")
    values: tuple[Any, ...] | None = None
    if length <= MAX_KEPT_ARRAY:
        values = struct.unpack_from(f"<{length}{fmt[1]}", cur.buf, cur.pos)
    cur.pos += length * size
    return ArrayInfo(item_type, length, values)


def _read_value(cur: _Cursor, vtype: GGUFValueType, label: str) -> Any:
    if vtype == GGUFValueType.STRING:
        return cur.raw_string(f"value of {label}").decode("utf-8", errors="replace")
    if vtype == GGUFValueType.ARRAY:
        return _read_array(cur, label)
    return cur.scalar(vtype, f"value of {label}")


def _read_metadata(cur: _Cursor, kv_count: int) -> dict[str, Any]:
    metadata: dict[str, Any] = {}
    for i in range(kv_count):
        key = cur.text(f"key {i}")
        label = _show(key)
        if not key:
            raise GGUFFormatError(f"metadata key {i} is empty")
        if key in metadata:
            raise GGUFFormatError(f"duplicate metadata key {label}")
        vtype = _value_type(cur.u32(f"type of {label}"), f"key {label}")
        if key == ALIGNMENT_KEY and vtype != GGUFValueType.UINT32:
            # llama.cpp rejects any other type; a bool or float here means a broken file
            raise GGUFFormatError(f"{ALIGNMENT_KEY} must be of type UINT32, got {vtype.name}")
        metadata[key] = _read_value(cur, vtype, label)
    return metadata


def _tensor_bytes(name: str, shape: tuple[int, ...], ggml_type: GGMLQuantizationType) -> int:
    """Bytes of a tensor's data; raises on negative or overflowing shapes, bad row sizes."""
    block, type_size = GGML_QUANT_SIZES[ggml_type]
    n = 1
    for d in shape:
        if d < 0 or d > INT64_MAX:
            raise GGUFFormatError(f"tensor {name!r} has invalid dimension {d}")
        n *= d
        if n > INT64_MAX:
            raise GGUFFormatError(f"tensor {name!r} dimensions {list(shape)} overflow int64")
    row = shape[0] if shape else 1  # ggml pads missing dimensions with 1
    if row % block != 0:
        raise GGUFFormatError(
            f"tensor {name!r} row of {row} values is not a multiple of the "
            f"{ggml_type.name} block size {block}"
        )
    n_bytes = n // block * type_size
    if n_bytes > INT64_MAX:
        raise GGUFFormatError(f"tensor {name!r} size of {n_bytes} bytes overflows int64")
    return n_bytes


def _read_tensor_info(
    cur: _Cursor, index: int
) -> tuple[str, tuple[int, ...], GGMLQuantizationType, int]:
    """One tensor-table entry: (name, shape, type, offset relative to the data section)."""
    name = cur.text(f"name of tensor {index}")
    if len(name.encode("utf-8")) > MAX_NAME_BYTES:
        raise GGUFFormatError(
            f"tensor {index} name is too long ({len(name.encode('utf-8'))} bytes, "
            f"max {MAX_NAME_BYTES}): {name[:MAX_NAME_BYTES]!r}..."
        )
    n_dims = cur.u32(f"dimension count of tensor {name!r}")
    if n_dims > MAX_DIMS:
        raise GGUFFormatError(f"tensor {name!r} has {n_dims} dimensions (max {MAX_DIMS})")
    shape = tuple(cur.u64(f"dimension {d} of tensor {name!r}") for d in range(n_dims))
    type_code = cur.u32(f"type of tensor {name!r}")
    try:
        ggml_type = GGMLQuantizationType(type_code)
    except ValueError:
        raise GGUFFormatError(f"tensor {name!r} has unknown type {type_code}") from None
    if ggml_type not in GGML_QUANT_SIZES:
        raise GGUFFormatError(f"tensor {name!r} has unsupported type {ggml_type.name}")
    offset = cur.u64(f"offset of tensor {name!r}")
    return name, shape, ggml_type, offset


def _alignment(metadata: Mapping[str, Any]) -> int:
    alignment = metadata.get(ALIGNMENT_KEY, DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or isinstance(alignment, bool):
        raise GGUFFormatError(f"{ALIGNMENT_KEY} must be an integer, got {alignment!r}")
    if alignment <= 0 or alignment & (alignment - 1):
        raise GGUFFormatError(f"{ALIGNMENT_KEY} {alignment} is not a power of two")
    return alignment


def _read_tensors(
    cur: _Cursor, tensor_count: int, alignment: int
) -> tuple[tuple[TensorInfo, ...], int]:
    """Read the tensor table and place every tensor inside the data section."""
    raw = []
    seen: set[str] = set()
    for i in range(tensor_count):
        entry = _read_tensor_info(cur, i)
        if entry[0] in seen:
            raise GGUFFormatError(f"duplicate tensor name {entry[0]!r}")
        seen.add(entry[0])
        raw.append(entry)
    data_offset = -(-cur.pos // alignment) * alignment
    if data_offset > cur.size:
        if tensor_count:
            raise GGUFFormatError("truncated file: tensor data section is missing")
        data_offset = cur.size  # no tensors: the padding before an empty section may be cut
    data_size = cur.size - data_offset
    tensors = []
    for name, shape, ggml_type, rel in raw:
        if rel % alignment:
            raise GGUFFormatError(
                f"tensor {name!r} offset {rel} is not aligned to {alignment} bytes"
            )
        n_bytes = _tensor_bytes(name, shape, ggml_type)
        if rel > data_size or n_bytes > data_size - rel:
            past = (f"tensor {name!r} data [{rel}, {rel + n_bytes}) lies past the end of "
                    f"the data section ({data_size} bytes)")
            need = _packed_end(raw, alignment)
            if need is None or rel > data_size:
                raise GGUFFormatError(past)
            total = data_offset + need  # the file's size had it not been cut
            raise GGUFFormatError(
                f"truncated file: {past}; its tensors need {total:,} bytes, the file has "
                f"{cur.size:,} ({total - cur.size:,} missing: an interrupted download or "
                "copy?)"
            )
        tensors.append(TensorInfo(name, shape, ggml_type, data_offset + rel, n_bytes))
    _check_no_overlap(tensors)
    return tuple(tensors), data_offset


def _packed_end(raw: list[tuple[str, tuple[int, ...], GGMLQuantizationType, int]],
                alignment: int) -> int | None:
    """Where the tensor data ends when the tensors are packed as writers lay them out
    (sorted by offset, each at the aligned end of the one before, the first at 0): a
    well-formed table whose file was cut short. None for any other layout (a corrupt
    table is not called truncated)."""
    end = 0
    try:
        for name, shape, ggml_type, rel in sorted(raw, key=lambda e: e[3]):
            if rel != -(-end // alignment) * alignment:
                return None
            end = rel + _tensor_bytes(name, shape, ggml_type)
    except GGUFFormatError:
        return None
    return end


def _check_no_overlap(tensors: list[TensorInfo]) -> None:
    """Raise if two tensors share a byte (an empty tensor occupies none).

    Among non-empty ranges sorted by start, any overlap implies one between neighbours.
    """
    ordered = sorted((t for t in tensors if t.n_bytes), key=lambda t: t.offset)
    for prev, nxt in itertools.pairwise(ordered):
        if prev.offset + prev.n_bytes > nxt.offset:
            raise GGUFFormatError(f"tensors {prev.name!r} and {nxt.name!r} overlap")


def _check_version(version: int) -> None:
    if version in SUPPORTED_VERSIONS:
        return
    if int.from_bytes(version.to_bytes(4, "little"), "big") in SUPPORTED_VERSIONS:
        raise GGUFFormatError("big-endian GGUF files are not supported")
    raise GGUFFormatError(f"unsupported GGUF version {version} (supported: 2, 3)")


def parse_gguf(buf: Buffer, size: int, path: Path) -> GGUFFile:
    """Parse and validate the GGUF image in the first `size` bytes of `buf`.

    Contract: for any bytes, returns a `GGUFFile` satisfying the invariants documented on
    `GGUFFile` and `TensorInfo`, or raises `GGUFFormatError`; it never allocates more than
    the header's own size and never reads past `size`. `path` is only recorded. Passing
    a `size` larger than `buf` (or negative) is a caller bug and raises `ValueError`.
    """
    if not 0 <= size <= len(buf):
        raise ValueError(f"size {size} is outside the buffer of {len(buf)} bytes")
    cur = _Cursor(buf, size)
    if size < 4:
        raise GGUFFormatError(f"not a GGUF file (only {size} bytes)")
    magic = bytes(buf[0:4])
    if magic != GGUF_MAGIC:
        raise GGUFFormatError(f"not a GGUF file (magic {magic!r}, expected b'GGUF')")
    cur.pos = 4
    _check_version(version := cur.u32("version"))
    tensor_count = cur.u64("tensor count")
    kv_count = cur.u64("metadata count")
    if kv_count > cur.left() // _MIN_KV_BYTES:
        raise GGUFFormatError(f"metadata count {kv_count} exceeds what the file can hold")
    metadata = _read_metadata(cur, kv_count)
    if tensor_count > cur.left() // _MIN_TENSOR_INFO_BYTES:
        raise GGUFFormatError(f"tensor count {tensor_count} exceeds what the file can hold")
    alignment = _alignment(metadata)
    tensors, data_offset = _read_tensors(cur, tensor_count, alignment)
    return GGUFFile(path, version, metadata, tensors, alignment, data_offset, size)


def read_gguf(path: str | Path) -> GGUFFile:
    """Read and validate the GGUF file at `path`.

    Raises `ModelNotFoundError` when the path is missing, not a regular file or unreadable,
    and `GGUFFormatError` for any malformed content; both messages start with the path.
    Maps the file and touches only the header pages. (A file truncated by another process
    *while* it is being parsed can still end the process with SIGBUS: mmap's limit.)
    """
    p = Path(path)
    if not p.is_file():
        reason = "not a regular file" if p.exists() else "model file not found"
        raise ModelNotFoundError(f"{p}: {reason}")
    try:
        key = _identity(p)
        with _parsed_lock:
            hit = _parsed.get(key)
        if hit is not None:
            return hit
        with p.open("rb") as fh, _map_read_only(fh) as mm:
            parsed = parse_gguf(mm, len(mm), p)
        parsed = parsed._replace(metadata=MappingProxyType(dict(parsed.metadata)))
        with _parsed_lock:
            _parsed[key] = parsed
            while len(_parsed) > _PARSED_KEPT:
                _parsed.pop(next(iter(_parsed)))
        return parsed
    except GGUFFormatError as exc:
        raise GGUFFormatError(f"{p}: {exc}") from None
    except OSError as exc:
        raise ModelNotFoundError(f"{p}: cannot read model file: {exc.strerror}") from None


# Parsed headers by file identity: one `run` reads its model's header for the plan, the
# spec and the telemetry (Gemma's 262k-token vocabulary costs ~0.25 s to walk each
# time). A file changed in place has another size or mtime and is parsed again; only
# good parses are kept, so a malformed file is judged anew every time.
_PARSED_KEPT = 8
_parsed: dict[tuple[str, int, int, int, int], GGUFFile] = {}
_parsed_lock = threading.Lock()


def _identity(p: Path) -> tuple[str, int, int, int, int]:
    st = p.stat()
    return str(p), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _map_read_only(fh: IO[bytes]) -> mmap.mmap:
    try:
        return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except ValueError:  # "cannot mmap an empty file"
        raise GGUFFormatError("empty file, not a GGUF model") from None
