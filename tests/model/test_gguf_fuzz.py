"""Property tests: no input bytes make the GGUF reader do anything but parse or reject.

Two generators, both deterministic (`derandomize=True`) so CI sees the same examples:
- mutations of the valid tiny models — flipped bytes, structural fields overwritten with
  hostile integers, truncations, splices — applied in memory, never written to disk;
- files assembled field by field (`gguf_craft`) from adversarial counts, types, shapes
  and offsets, which reach the tensor table far more often than random bytes do.

The property: `parse_gguf` returns a `GGUFFile` whose invariants hold, or raises
`GGUFFormatError`; never another exception, within the deadline, with a small bounded
peak of traced memory. A `GGUFFile` the reader accepts must also never crash
`spec_from_gguf` (what `load_spec` runs after `read_gguf`) with anything but
`GGUFFormatError`.
"""

from __future__ import annotations

import contextlib
import itertools
import struct
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import pytest
from gguf import GGUFReader, ReaderField
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import gguf_craft as gc
from gguf_craft import QT, U32_MAX, U64_MAX, VT
from inferenceos.errors import GGUFFormatError
from inferenceos.model.gguf_file import GGUFFile, parse_gguf
from inferenceos.model.spec import spec_from_gguf

T = TypeVar("T")
PEAK_LIMIT = 8 * 2**20  # bytes the parser may allocate at its peak, whatever the input
FUZZ = settings(
    max_examples=300,
    deadline=1000,  # ms per example
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

_U64_HOSTILE = [0, 1, 7, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**63, U64_MAX - 31, U64_MAX]
_U32_HOSTILE = [0, 1, 4, 5, 8, 9, 12, 13, 14, 64, 2**31, U32_MAX]


class Base(NamedTuple):
    """A valid file and the offsets where its structural fields start."""

    data: bytes
    header_end: int  # data_offset: everything before it is structure
    kv_fields: tuple[int, ...]  # header counts, key lengths, types, array lengths
    tensor_fields: tuple[int, ...]  # name lengths, n_dims, dims, types, offsets


def _part_starts(field: ReaderField, max_parts: int) -> list[int]:
    """Offsets of the first `max_parts` primitives of a field: for an array, its key,
    types, length and first item, not the 287 tokens that follow."""
    starts, pos = [], field.offset
    for part in field.parts[:max_parts]:
        starts.append(pos)
        pos += part.nbytes
    return starts


def _base(path: Path) -> Base:
    data = path.read_bytes()
    reader = GGUFReader(path)
    kv_fields = [s for f in reader.fields.values() for s in _part_starts(f, 7)]
    tensor_fields = [s for t in reader.tensors for s in _part_starts(t.field, 12)]
    return Base(data, reader.data_offset, tuple(kv_fields), tuple(tensor_fields))


@pytest.fixture(scope="module")
def bases(tiny_llama: Path, tiny_moe: Path, tiny_swa: Path) -> list[Base]:
    return [_base(path) for path in (tiny_llama, tiny_moe, tiny_swa)]


def _check_invariants(gf: GGUFFile) -> None:
    assert 0 <= gf.data_offset <= gf.file_size
    assert gf.alignment > 0 and gf.alignment & (gf.alignment - 1) == 0
    spans = []
    for t in gf.tensors:
        assert len(t.shape) <= 4 and all(0 <= d < 2**63 for d in t.shape)
        assert t.offset >= gf.data_offset and (t.offset - gf.data_offset) % gf.alignment == 0
        assert t.n_bytes >= 0 and t.offset + t.n_bytes <= gf.file_size
        if t.n_bytes:
            spans.append((t.offset, t.offset + t.n_bytes))
    spans.sort()
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
    assert len({t.name for t in gf.tensors}) == len(gf.tensors)


def _parse_bounded(data: bytes) -> GGUFFile | None:
    """Parse with tracemalloc on (only around the parse: it slows every allocation);
    None when rejected. Fails on any other outcome or on a large peak of memory."""
    tracemalloc.start()
    try:
        gf = parse_gguf(data, len(data), Path("fuzz.gguf"))
    except GGUFFormatError as exc:
        assert str(exc) and "\n" not in str(exc)
        event(_kind(str(exc)))
        gf = None
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < PEAK_LIMIT, f"parser peak {peak} bytes"
    if gf is not None:
        event("accepted")
        _check_invariants(gf)
    return gf


def _kind(message: str) -> str:
    """A coarse class of rejection, for `--hypothesis-show-statistics`."""
    words = [w for w in message.replace(":", " ").split() if w.isalpha() and len(w) > 2]
    return "rejected: " + " ".join(words[:4])


def _spec_only_format_errors(gf: GGUFFile) -> None:
    with contextlib.suppress(GGUFFormatError):
        spec_from_gguf(gf)


# --- mutations of valid files ---------------------------------------------------------

Mutation = Callable[[bytearray], None]


def _flip(pos: int, xor: int) -> Mutation:
    def apply(buf: bytearray) -> None:
        if pos < len(buf):
            buf[pos] ^= xor

    return apply


def _put(pos: int, fmt: str, value: int) -> Mutation:
    def apply(buf: bytearray) -> None:
        packed = struct.pack(fmt, value)
        buf[pos : pos + len(packed)] = packed

    return apply


def _truncate(n: int) -> Mutation:
    def apply(buf: bytearray) -> None:
        del buf[n:]

    return apply


def _splice(src: int, length: int, dst: int, insert: bool) -> Mutation:
    def apply(buf: bytearray) -> None:
        chunk = bytes(buf[src : src + length])
        if insert:
            buf[dst:dst] = chunk
        else:
            buf[dst : dst + len(chunk)] = chunk

    return apply


def _delete(pos: int, length: int) -> Mutation:
    def apply(buf: bytearray) -> None:
        del buf[pos : pos + length]

    return apply


Draw = Callable[[st.SearchStrategy[Any]], Any]


def _mutation(draw: Draw, base: Base) -> Mutation:
    anywhere = st.integers(0, len(base.data) - 1)
    in_header = st.integers(0, base.header_end + 64)
    field = st.one_of(st.sampled_from(base.kv_fields), st.sampled_from(base.tensor_fields))
    pos = st.one_of(field, in_header, anywhere)
    kind = draw(st.sampled_from(["flip", "u64", "u32", "truncate", "splice", "delete"]))
    if kind == "flip":
        return _flip(draw(st.one_of(field, in_header)), draw(st.integers(1, 255)))
    if kind == "u64":
        value = draw(st.one_of(st.sampled_from(_U64_HOSTILE), st.integers(0, U64_MAX)))
        return _put(draw(field), "<Q", value)
    if kind == "u32":
        value = draw(st.one_of(st.sampled_from(_U32_HOSTILE), st.integers(0, U32_MAX)))
        return _put(draw(field), "<I", value)
    if kind == "truncate":
        return _truncate(draw(st.one_of(in_header, anywhere)))
    if kind == "splice":
        return _splice(draw(pos), draw(st.integers(1, 64)), draw(pos), draw(st.booleans()))
    return _delete(draw(st.one_of(field, in_header)), draw(st.integers(1, 16)))


@FUZZ
@given(data=st.data())
def test_mutated_tiny_models(data: st.DataObject, bases: list[Base]) -> None:
    base = data.draw(st.sampled_from(bases), label="base")
    buf = bytearray(base.data)
    for _ in range(data.draw(st.integers(1, 4), label="n_mutations")):
        _mutation(data.draw, base)(buf)
    gf = _parse_bounded(bytes(buf))
    if gf is not None:
        _spec_only_format_errors(gf)


# --- files assembled field by field ---------------------------------------------------

_KEYS = ["general.alignment", "llama.block_count", "x.y", "x.z", "general.architecture", ""]
_NAMES = ["a", "b", "c", "blk.0.attn_q.weight", "blk.1.ffn_up_exps.weight", "t" * 64]
_SIZES = {vt: struct.calcsize("<" + fmt) for vt, fmt in gc.SCALAR_FMT.items()}


def _mostly(valid: st.SearchStrategy[T], hostile: st.SearchStrategy[T]) -> st.SearchStrategy[T]:
    """Draw from `valid` nine times in ten, else from `hostile`, so that a file with
    one bad field gets past the others and reaches the check for that field. (Hostile is
    not tied to 0 or 9: hypothesis favours the bounds of integer ranges.)"""
    return st.integers(0, 9).flatmap(lambda i: hostile if i == 7 else valid)


@st.composite
def _valid_value(draw: st.DrawFn) -> tuple[int, bytes]:
    vtype = draw(st.sampled_from(list(VT)))
    if vtype == VT.STRING:
        return vtype, gc.gstr(draw(st.text(max_size=8)))
    if vtype == VT.ARRAY:
        item = draw(st.sampled_from([t for t in VT if t != VT.ARRAY]))
        n = draw(st.integers(0, 4))
        if item == VT.STRING:
            return vtype, gc.array_payload(item, gc.gstr("s") * n, n)
        return vtype, gc.array_payload(
            item, draw(st.binary(min_size=n * _SIZES[item], max_size=n * _SIZES[item])), n
        )
    return vtype, draw(st.binary(min_size=_SIZES[vtype], max_size=_SIZES[vtype]))


@st.composite
def _hostile_value(draw: st.DrawFn) -> tuple[int, bytes]:
    vtype = draw(st.sampled_from([VT.ARRAY, VT.ARRAY, VT.STRING, 13, U32_MAX, *VT]))
    if vtype == VT.ARRAY:
        item = draw(st.sampled_from([VT.ARRAY, VT.ARRAY, VT.STRING, 13, *VT]))
        length = draw(st.one_of(st.integers(0, 4), st.sampled_from(_U64_HOSTILE)))
        return vtype, gc.array_payload(item, draw(st.binary(max_size=48)), length)
    if vtype == VT.STRING:
        text = draw(st.binary(max_size=16))
        return vtype, gc.gstr(text, draw(st.sampled_from([len(text) + 1, *_U64_HOSTILE])))
    return vtype, draw(st.binary(max_size=9))


@st.composite
def _tensor(draw: st.DrawFn, index: int) -> bytes:
    """A tensor-table entry; valid ones are small enough to fit, often next to another."""
    qtype = draw(_mostly(st.sampled_from([QT.F32, QT.F16, QT.Q8_0, QT.Q4_K]), st.integers(0, 42)))
    row = 256 if qtype in (QT.Q8_0, QT.Q4_K) else draw(st.sampled_from([8, 16, 1, 0]))
    dims = st.lists(st.sampled_from([1, 2, 3, 0]), max_size=3).map(lambda d: [row, *d])
    hostile_dims = st.lists(st.sampled_from([0, 31, *_U64_HOSTILE]), min_size=1, max_size=5)
    shape = draw(_mostly(dims, hostile_dims))
    offset = draw(
        _mostly(st.integers(0, 24).map(lambda i: 32 * i), st.sampled_from([4, 16, *_U64_HOSTILE]))
    )
    n_dims = draw(_mostly(st.none(), st.sampled_from([0, 5, U32_MAX])))
    previous = f"blk.{max(index - 1, 0)}.ffn_up.weight"
    name = draw(
        _mostly(st.just(f"blk.{index}.ffn_up.weight"), st.sampled_from([previous, *_NAMES]))
    )
    return gc.tensor_info(name, shape, qtype, offset, n_dims)


@st.composite
def _crafted_file(draw: st.DrawFn) -> bytes:
    """A whole file from fields that are each valid, usually, or hostile."""
    kvs = [gc.ARCH_KV]
    for _ in range(draw(st.integers(0, 4))):
        key = draw(
            _mostly(
                st.sampled_from(_KEYS[:-2]).map(lambda k: k + str(len(kvs))),
                st.one_of(st.sampled_from(_KEYS), st.text(max_size=8)),
            )
        )
        vtype, payload = draw(st.one_of(_valid_value(), _hostile_value()))
        kvs.append(gc.kv(key, vtype, payload))
    tensors = [draw(_tensor(i)) for i in range(draw(st.integers(0, 4)))]
    duplicate: bool = draw(_mostly(st.just(False), st.just(True)))
    if tensors and duplicate:
        tensors.append(draw(st.sampled_from(tensors)))  # a duplicate entry
    count = _mostly(st.none(), st.sampled_from(_U64_HOSTILE))
    data = gc.build(
        kvs,
        tensors,
        b"\0" * draw(st.sampled_from([1024, 0, 32, 4096])),
        version=draw(_mostly(st.just(3), st.sampled_from([2, 0, 1, 4, 3 << 24]))),
        n_kv=draw(count),
        n_tensors=draw(count),
        pad=draw(_mostly(st.just(True), st.just(False))),
    )
    cut = draw(_mostly(st.none(), st.integers(0, len(data))))
    return data if cut is None else data[:cut]


@FUZZ
@given(data=_crafted_file())
def test_crafted_files(data: bytes) -> None:
    _parse_bounded(data)


# --- spec.py on files the reader accepts ------------------------------------------------


def _spec_input(*kvs: bytes) -> GGUFFile:
    data = gc.build(
        [gc.ARCH_KV, gc.kv_u32("llama.embedding_length", 64), *kvs],
        [
            gc.tensor_info("blk.0.attn_q.weight", [8]),
            gc.tensor_info("blk.1.attn_q.weight", [8], offset=32),
        ],
        gc.f32_data(16),
    )
    return parse_gguf(data, len(data), Path("spec.gguf"))


@pytest.mark.parametrize(
    "kvs",
    [
        pytest.param(
            [gc.kv_array("llama.block_count", VT.FLOAT32, [float("nan")])], id="nan-block-count"
        ),
        pytest.param(
            [
                gc.kv_u32("llama.block_count", 1),
                gc.kv_array("llama.attention.head_count_kv", VT.FLOAT32, [float("inf")]),
            ],
            id="inf-head-count-kv",
        ),
        pytest.param(
            [
                gc.kv_u32("llama.block_count", 2),
                gc.kv_array("llama.attention.head_count_kv", VT.FLOAT64, [2.0, float("nan")]),
            ],
            id="nan-in-per-layer-head-count-kv",
        ),
    ],
)
def test_spec_rejects_non_finite_counts(kvs: list[bytes]) -> None:
    gf = _spec_input(*kvs)
    with pytest.raises(GGUFFormatError, match="integer"):
        spec_from_gguf(gf)
