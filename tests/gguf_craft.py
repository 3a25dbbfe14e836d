"""Build GGUF byte strings by hand — valid, or broken on purpose — for the reader's tests.

`gguf.GGUFWriter` refuses to write most malformed files, so these helpers lay the format
out byte by byte (little-endian, GGUF v3):

    magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
    n_kv × (string key | u32 value type | value)
    n_tensors × (string name | u32 n_dims | n_dims × u64 dim | u32 ggml type | u64 offset)
    padding to the alignment | tensor data

A string is a u64 byte length followed by the bytes. Every helper returns `bytes`, so a
test can corrupt any field by building it with a hostile value or by slicing the result.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from gguf import GGMLQuantizationType, GGUFValueType

U64_MAX = 2**64 - 1
U32_MAX = 2**32 - 1

VT = GGUFValueType
QT = GGMLQuantizationType

SCALAR_FMT = {
    VT.UINT8: "B",
    VT.INT8: "b",
    VT.UINT16: "H",
    VT.INT16: "h",
    VT.UINT32: "I",
    VT.INT32: "i",
    VT.FLOAT32: "f",
    VT.BOOL: "?",
    VT.UINT64: "Q",
    VT.INT64: "q",
    VT.FLOAT64: "d",
}


def u32(v: int) -> bytes:
    return struct.pack("<I", v)


def u64(v: int) -> bytes:
    return struct.pack("<Q", v)


def gstr(s: str | bytes, length: int | None = None) -> bytes:
    """A GGUF string; `length` overrides the declared length (to lie about it)."""
    data = s.encode() if isinstance(s, str) else s
    return u64(len(data) if length is None else length) + data


def kv(key: str | bytes, vtype: int, payload: bytes) -> bytes:
    """One metadata entry with a raw value payload (whatever follows the type field)."""
    return gstr(key) + u32(vtype) + payload


def kv_str(key: str, value: str | bytes) -> bytes:
    return kv(key, VT.STRING, gstr(value))


def kv_scalar(key: str | bytes, vtype: GGUFValueType, value: float | int | bool) -> bytes:
    return kv(key, vtype, struct.pack("<" + SCALAR_FMT[vtype], value))


def kv_u32(key: str | bytes, value: int) -> bytes:
    return kv_scalar(key, VT.UINT32, value)


def array_payload(item_type: int, items: bytes, length: int) -> bytes:
    """The value of an ARRAY entry: item type, declared length, then the raw items."""
    return u32(item_type) + u64(length) + items


def kv_array(key: str, item_type: GGUFValueType, values: Sequence[float | int]) -> bytes:
    items = struct.pack(f"<{len(values)}{SCALAR_FMT[item_type]}", *values)
    return kv(key, VT.ARRAY, array_payload(item_type, items, len(values)))


def kv_str_array(key: str, values: Sequence[str | bytes]) -> bytes:
    items = b"".join(gstr(v) for v in values)
    return kv(key, VT.ARRAY, array_payload(VT.STRING, items, len(values)))


def tensor_info(
    name: str | bytes,
    shape: Sequence[int],
    ggml_type: int = QT.F32,
    offset: int = 0,
    n_dims: int | None = None,
) -> bytes:
    """One tensor-table entry; `n_dims` overrides the declared dimension count."""
    dims = b"".join(u64(d) for d in shape)
    return (
        gstr(name)
        + u32(len(shape) if n_dims is None else n_dims)
        + dims
        + u32(ggml_type)
        + u64(offset)
    )


def header(n_tensors: int, n_kv: int, *, magic: bytes = b"GGUF", version: int = 3) -> bytes:
    return magic + u32(version) + u64(n_tensors) + u64(n_kv)


ARCH_KV = kv_str("general.architecture", "llama")


def build(
    kvs: Sequence[bytes] = (ARCH_KV,),
    tensors: Sequence[bytes] = (),
    data: bytes = b"",
    *,
    magic: bytes = b"GGUF",
    version: int = 3,
    n_kv: int | None = None,
    n_tensors: int | None = None,
    alignment: int = 32,
    pad: bool = True,
) -> bytes:
    """A whole file. Counts default to the number of entries given; with `pad` the
    tensor data starts at the next multiple of `alignment` (as GGUFWriter writes it)."""
    head = header(
        len(tensors) if n_tensors is None else n_tensors,
        len(kvs) if n_kv is None else n_kv,
        magic=magic,
        version=version,
    )
    body = head + b"".join(kvs) + b"".join(tensors)
    if pad and alignment > 0:
        body += b"\x00" * (-len(body) % alignment)
    return body + data


def f32_data(n_values: int) -> bytes:
    return struct.pack(f"<{n_values}f", *([0.5] * n_values))


def valid_file() -> bytes:
    """A small valid GGUF: every value kind in the metadata and three F32 tensors.

    Tensors: `a` [8] at 0, `b` [4, 2] at 32 and `c` [2, 2, 2, 1] at 64 — 96 data bytes,
    contiguous, so every strict prefix of the file is missing data.
    """
    kvs = [
        ARCH_KV,
        kv_str("general.name", "crafted"),
        kv_u32("llama.block_count", 1),
        kv_scalar("llama.rope.freq_base", VT.FLOAT32, 10000.0),
        kv_scalar("general.flag", VT.BOOL, True),
        kv_scalar("general.big", VT.INT64, -(2**40)),
        kv_array("llama.attention.head_count_kv", VT.UINT32, [2, 2]),
        kv_str_array("tokenizer.ggml.tokens", ["<unk>", "<s>", "</s>", "a", "b"]),
    ]
    tensors = [
        tensor_info("a", [8], QT.F32, 0),
        tensor_info("b", [4, 2], QT.F32, 32),
        tensor_info("c", [2, 2, 2, 1], QT.F32, 64),
    ]
    return build(kvs, tensors, f32_data(24))
