"""The GGUF reader against hostile files: one crafted file per way a file can be broken.

Every malformed file must be rejected with a `GGUFFormatError` that names the problem,
quickly (well under a second: nothing is allocated or looped over before it is bounded by
the bytes left in the file), and through the CLI as exactly one `error:` line on stderr.
The valid files — the tiny models and a hand-built one — must parse exactly.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
from gguf import GGUFReader

import gguf_craft as gc
from gguf_craft import QT, U32_MAX, U64_MAX, VT
from inferenceos.errors import GGUFFormatError, ModelNotFoundError
from inferenceos.model.gguf_file import ArrayInfo, GGUFFile, parse_gguf, read_gguf

REJECT_WITHIN_S = 1.0
SRC = Path(__file__).resolve().parents[2] / "src"

A8 = gc.tensor_info("a", [8], QT.F32, 0)  # 32 bytes of data at offset 0
DATA64 = gc.f32_data(16)


class Case(NamedTuple):
    """A malformed file and a substring its error message must contain."""

    id: str
    data: bytes
    match: str


def _tensors(*infos: bytes, data: bytes = DATA64, pad: bool = True) -> bytes:
    return gc.build([gc.ARCH_KV], infos, data, pad=pad)


def _kvs(*kvs: bytes) -> bytes:
    """No tensors and no padding: the last entry ends the file."""
    return gc.build([gc.ARCH_KV, *kvs], pad=False)


_B41 = gc.tensor_info("b", [8, 1], QT.F32, 32)  # 41 bytes: name 9, n_dims 4, dims 16, ...

CASES: list[Case] = [
    # --- header ---
    Case("bad-magic", gc.build(magic=b"GGML"), "not a GGUF file (magic b'GGML'"),
    Case("text-file", b"this is a text file, not a model\n" * 4, "not a GGUF file"),
    Case("short-magic", b"GG", "not a GGUF file (only 2 bytes)"),
    Case("version-0", gc.build(version=0), "unsupported GGUF version 0"),
    Case("version-1", gc.build(version=1), "unsupported GGUF version 1"),
    Case("version-4", gc.build(version=4), "unsupported GGUF version 4"),
    Case("version-u32-max", gc.build(version=U32_MAX), f"unsupported GGUF version {U32_MAX}"),
    Case("big-endian", gc.build(version=3 << 24), "big-endian"),
    Case("truncated-version", b"GGUF\x03\x00", "truncated file: version"),
    Case("truncated-tensor-count", b"GGUF" + gc.u32(3) + b"\0" * 5, "tensor count"),
    Case("truncated-kv-count", gc.header(0, 1)[:-3], "truncated file: metadata count"),
    Case("kv-count-u64-max", gc.build(n_kv=U64_MAX), f"metadata count {U64_MAX} exceeds"),
    Case("kv-count-i64-min", gc.build(n_kv=2**63), f"metadata count {2**63} exceeds"),
    Case("kv-count-too-large", gc.build(n_kv=1000), "metadata count 1000 exceeds"),
    Case("tensor-count-u64-max", gc.build(n_tensors=U64_MAX), f"tensor count {U64_MAX} exceeds"),
    Case("tensor-count-too-large", gc.build(n_tensors=5), "tensor count 5 exceeds"),
    # --- metadata keys ---
    Case(
        "key-length-u64-max",
        gc.build([gc.u64(U64_MAX) + b"k" * 40]),
        f"key 0 of {U64_MAX} bytes",
    ),
    Case("key-truncated", gc.build([gc.gstr(b"k" * 20, length=100)]), "key 0 of 100 bytes"),
    Case("key-empty", gc.build([gc.kv_u32("", 1)]), "metadata key 0 is empty"),
    Case("key-not-utf8", gc.build([gc.kv_u32(b"bad\xff\xfekey", 1)]), "key 0 is not valid UTF-8"),
    Case(
        "duplicate-key",
        _kvs(gc.kv_str("general.architecture", "qwen2")),
        "duplicate metadata key 'general.architecture'",
    ),
    Case(
        "huge-key-shown-short",
        gc.build([gc.kv("k" * 100_000, 13, b"\0" * 8)]),
        f"key {'k' * 80!r}... has unknown value type 13",
    ),
    # --- metadata values ---
    Case(
        "value-type-unknown", _kvs(gc.kv("x.y", 13, b"\0" * 8)), "'x.y' has unknown value type 13"
    ),
    Case("value-type-u32-max", _kvs(gc.kv("x.y", U32_MAX, b"\0" * 8)), f"type {U32_MAX}"),
    Case("value-truncated", _kvs(gc.kv("x.y", VT.UINT64, b"\1\2\3")), "value of 'x.y'"),
    Case(
        "string-length-u64-max",
        _kvs(gc.kv("x.s", VT.STRING, gc.gstr(b"s" * 16, length=U64_MAX))),
        f"value of 'x.s' of {U64_MAX} bytes",
    ),
    Case(
        "string-truncated",
        _kvs(gc.kv("x.s", VT.STRING, gc.gstr(b"s" * 16, length=17))),
        "value of 'x.s' of 17 bytes",
    ),
    Case(
        "array-item-type-unknown",
        _kvs(gc.kv("x.a", VT.ARRAY, gc.array_payload(99, b"\0" * 8, 2))),
        "array 'x.a' has unknown value type 99",
    ),
    Case(
        "nested-array",
        _kvs(gc.kv("x.a", VT.ARRAY, gc.array_payload(VT.ARRAY, gc.array_payload(4, b"", 0), 1))),
        "nested arrays are not supported",
    ),
    Case(
        "array-length-u64-max",
        _kvs(gc.kv("x.a", VT.ARRAY, gc.array_payload(VT.UINT32, b"\0" * 16, U64_MAX))),
        f"array 'x.a' of {U64_MAX} items",
    ),
    Case(
        "array-truncated",
        _kvs(gc.kv("x.a", VT.ARRAY, gc.array_payload(VT.FLOAT64, b"\0" * 80, 11))),
        "array 'x.a' of 11 items",
    ),
    Case(
        "string-array-length-u64-max",
        _kvs(gc.kv("x.t", VT.ARRAY, gc.array_payload(VT.STRING, gc.gstr("a") * 4, U64_MAX))),
        f"array 'x.t' of {U64_MAX} strings",
    ),
    Case(
        "string-array-item-length-u64-max",
        _kvs(
            gc.kv(
                "x.t",
                VT.ARRAY,
                gc.array_payload(VT.STRING, gc.gstr("a") + gc.gstr(b"b" * 32, U64_MAX), 2),
            )
        ),
        f"string 1 of array 'x.t' of {U64_MAX} bytes",
    ),
    Case(
        "string-array-truncated",
        _kvs(gc.kv("x.t", VT.ARRAY, gc.array_payload(VT.STRING, gc.gstr(b"t" * 24) * 2, 3))),
        "string 2 of array 'x.t'",
    ),
    # --- alignment ---
    Case(
        "alignment-not-power-of-two",
        _kvs(gc.kv_u32("general.alignment", 48)),
        "general.alignment 48 is not a power of two",
    ),
    Case(
        "alignment-zero",
        _kvs(gc.kv_u32("general.alignment", 0)),
        "general.alignment 0 is not a power of two",
    ),
    Case(
        "alignment-u64",
        _kvs(gc.kv_scalar("general.alignment", VT.UINT64, 32)),
        "general.alignment must be of type UINT32, got UINT64",
    ),
    Case(
        "alignment-string",
        _kvs(gc.kv_str("general.alignment", "32")),
        "general.alignment must be of type UINT32, got STRING",
    ),
    Case(
        "alignment-array",
        _kvs(gc.kv_array("general.alignment", VT.UINT32, [32])),
        "general.alignment must be of type UINT32, got ARRAY",
    ),
    # --- tensor table ---
    Case(
        "tensor-name-length-u64-max",
        _tensors(gc.gstr(b"n" * 40, length=U64_MAX), pad=False, data=b""),
        f"name of tensor 0 of {U64_MAX} bytes",
    ),
    Case(
        "tensor-name-too-long",
        _tensors(gc.tensor_info("t" * 64, [8])),
        "tensor 0 name is too long (64 bytes, max 63)",
    ),
    Case(
        "tensor-name-not-utf8",
        _tensors(gc.tensor_info(b"\xc3\x28", [8])),
        "name of tensor 0 is not valid UTF-8",
    ),
    Case(
        "duplicate-tensor",
        _tensors(A8, gc.tensor_info("a", [8], QT.F32, 32)),
        "duplicate tensor name 'a'",
    ),
    Case("too-many-dims", _tensors(gc.tensor_info("a", [1] * 5)), "'a' has 5 dimensions (max 4)"),
    Case(
        "dims-u32-max",
        _tensors(gc.tensor_info("a", [8], n_dims=U32_MAX)),
        f"'a' has {U32_MAX} dimensions",
    ),
    Case(
        "dimension-negative",
        _tensors(gc.tensor_info("a", [8, 2**63])),
        f"'a' has invalid dimension {2**63}",
    ),
    Case(
        "dimension-negative-after-zero",
        _tensors(gc.tensor_info("a", [0, 2**63])),
        f"'a' has invalid dimension {2**63}",
    ),
    Case(
        "dimension-u64-max",
        _tensors(gc.tensor_info("a", [U64_MAX])),
        f"'a' has invalid dimension {U64_MAX}",
    ),
    Case(
        "dimension-overflow-2d",
        _tensors(gc.tensor_info("a", [2**32, 2**32])),
        "'a' dimensions [4294967296, 4294967296] overflow int64",
    ),
    Case(
        "dimension-overflow-4d",
        _tensors(gc.tensor_info("a", [2**16] * 4)),
        "overflow int64",
    ),
    Case("tensor-type-removed", _tensors(gc.tensor_info("a", [8], 4)), "'a' has unknown type 4"),
    Case(
        "tensor-type-u32-max",
        _tensors(gc.tensor_info("a", [8], U32_MAX)),
        f"'a' has unknown type {U32_MAX}",
    ),
    Case(
        "block-size-mismatch",
        _tensors(gc.tensor_info("a", [31, 2], QT.Q4_0)),
        "row of 31 values is not a multiple of the Q4_0 block size 32",
    ),
    Case(
        "block-size-scalar",
        _tensors(gc.tensor_info("a", [], QT.Q4_K)),
        "row of 1 values is not a multiple of the Q4_K block size 256",
    ),
    Case(
        "truncated-tensor-dimension",
        _tensors(A8, _B41[:25], pad=False, data=b""),
        "truncated file: dimension 1 of tensor 'b'",
    ),
    Case(
        "truncated-tensor-offset",
        _tensors(A8, _B41[:-3], pad=False, data=b""),
        "truncated file: offset of tensor 'b'",
    ),
    # --- tensor data ---
    Case(
        "data-section-missing",
        _tensors(A8, pad=False, data=b""),
        "tensor data section is missing",
    ),
    Case(
        "tensor-much-larger-than-file",
        _tensors(gc.tensor_info("a", [2**20, 2**20], QT.F32, 0)),
        f"'a' data [0, {2**42}) lies past the end of the data section (64 bytes)",
    ),
    Case(
        "offset-past-end",
        _tensors(gc.tensor_info("a", [8], QT.F32, U64_MAX - 31)),
        f"'a' data [{U64_MAX - 31}, {U64_MAX + 1}) lies past the end of the data section",
    ),
    Case(
        "tensor-past-end",
        _tensors(A8, gc.tensor_info("b", [16], QT.F32, 32)),
        "'b' data [32, 96) lies past the end of the data section (64 bytes)",
    ),
    Case(
        "tensor-bytes-overflow",
        _tensors(gc.tensor_info("a", [2**31, 2**31], QT.F32, 0)),
        f"'a' size of {2**64} bytes overflows int64",
    ),
    Case(
        "misaligned-offset",
        _tensors(gc.tensor_info("a", [8], QT.F32, 4)),
        "'a' offset 4 is not aligned to 32 bytes",
    ),
    Case(
        "misaligned-custom-alignment",
        gc.build(
            [gc.ARCH_KV, gc.kv_u32("general.alignment", 64)],
            [A8, gc.tensor_info("b", [8], QT.F32, 32)],
            gc.f32_data(32),
            alignment=64,
        ),
        "'b' offset 32 is not aligned to 64 bytes",
    ),
    Case(
        "overlap-same-offset",
        _tensors(A8, gc.tensor_info("b", [8], QT.F32, 0)),
        "tensors 'a' and 'b' overlap",
    ),
    Case(
        "overlap-partial",
        _tensors(gc.tensor_info("a", [16], QT.F32, 0), gc.tensor_info("b", [8], QT.F32, 32)),
        "tensors 'a' and 'b' overlap",
    ),
    Case(
        "overlap-listed-out-of-order",
        _tensors(gc.tensor_info("b", [8], QT.F32, 32), gc.tensor_info("a", [16], QT.F32, 0)),
        "tensors 'a' and 'b' overlap",
    ),
]

CLI_CASES = {  # a representative subset: each CLI run costs ~0.5 s of imports
    "bad-magic",
    "text-file",
    "kv-count-u64-max",
    "string-array-item-length-u64-max",
    "dimension-overflow-2d",
    "overlap-partial",
}

_BY_ID = {c.id: c for c in CASES}
assert len(_BY_ID) == len(CASES), "duplicate case id"


def _timed_reject(call: Callable[[], object]) -> tuple[BaseException, float]:
    start = time.perf_counter()
    with pytest.raises((GGUFFormatError, ModelNotFoundError)) as info:
        call()
    return info.value, time.perf_counter() - start


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_malformed_file_is_rejected(case: Case, tmp_path: Path) -> None:
    path = tmp_path / f"{case.id}.gguf"
    path.write_bytes(case.data)
    exc, elapsed = _timed_reject(lambda: read_gguf(path))
    assert type(exc) is GGUFFormatError
    message = str(exc)
    assert message.startswith(f"{path}: "), message
    assert case.match in message, message
    assert "\n" not in message
    assert len(message) < len(str(path)) + 300, "error messages stay short"
    assert elapsed < REJECT_WITHIN_S, f"took {elapsed:.3f} s"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_malformed_bytes_are_rejected_in_memory(case: Case) -> None:
    exc, elapsed = _timed_reject(lambda: parse_gguf(case.data, len(case.data), Path("x")))
    assert type(exc) is GGUFFormatError
    assert case.match in str(exc), str(exc)
    assert elapsed < REJECT_WITHIN_S


PREFIX_ERRORS = r"truncated|exceeds what the file|past the end|not a GGUF file \(only"


def test_every_strict_prefix_of_a_valid_file_is_rejected() -> None:
    """Truncation at every byte, hence at every structural point, is caught."""
    data = gc.valid_file()
    parse_gguf(data, len(data), Path("x"))  # the whole file is fine
    start = time.perf_counter()
    for n in range(len(data)):
        with pytest.raises(GGUFFormatError, match=PREFIX_ERRORS):
            parse_gguf(data, n, Path("x"))
    assert time.perf_counter() - start < REJECT_WITHIN_S


def test_every_strict_prefix_of_a_tiny_model_header_is_rejected(tiny_swa: Path) -> None:
    data = tiny_swa.read_bytes()
    end = parse_gguf(data, len(data), Path("x")).data_offset
    for n in range(0, end + 64, 7):
        with pytest.raises(GGUFFormatError):
            parse_gguf(data, n, Path("x"))


# --- files that are not GGUF at all -------------------------------------------------------


def test_missing_path() -> None:
    with pytest.raises(ModelNotFoundError, match=r"no-such\.gguf: model file not found"):
        read_gguf("/nonexistent/dir/no-such.gguf")


def test_directory(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="not a regular file"):
        read_gguf(tmp_path)


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.gguf"
    path.write_bytes(b"")
    with pytest.raises(GGUFFormatError, match=r"empty\.gguf: empty file"):
        read_gguf(path)


def test_text_file(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("# not a model\nhello\n")
    with pytest.raises(GGUFFormatError, match=r"notes\.txt: not a GGUF file \(magic b'# no'"):
        read_gguf(path)


def test_size_beyond_buffer_is_a_caller_bug() -> None:
    with pytest.raises(ValueError):
        parse_gguf(b"GGUF", 5, Path("x"))


# --- the CLI: one line on stderr, non-zero exit, no traceback -----------------------------


class CliResult(NamedTuple):
    path: Path
    returncode: int
    stderr: str


@pytest.fixture(scope="module")
def cli_results(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, CliResult]]:
    """Run `inferenceos inspect` on every CLI case at once (each run is ~0.5 s of imports)."""
    root = tmp_path_factory.mktemp("cli")
    paths = {cid: root / f"{cid}.gguf" for cid in sorted(CLI_CASES)}
    for cid, path in paths.items():
        path.write_bytes(_BY_ID[cid].data)
    (root / "empty.gguf").write_bytes(b"")
    paths["empty-file"] = root / "empty.gguf"
    paths["missing-path"] = root / "missing.gguf"
    paths["directory"] = root
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")])),
        "INFERENCEOS_HOME": str(root / "home"),
    }
    env.pop("INFERENCEOS_DEBUG", None)
    procs = {
        cid: subprocess.Popen(
            [sys.executable, "-m", "inferenceos", "inspect", str(path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for cid, path in paths.items()
    }
    results = {}
    for cid, proc in procs.items():
        _, err = proc.communicate(timeout=120)
        results[cid] = CliResult(paths[cid], proc.returncode, err)
    yield results


@pytest.mark.parametrize("cid", [*sorted(CLI_CASES), "empty-file", "missing-path", "directory"])
def test_cli_prints_one_error_line(cid: str, cli_results: dict[str, CliResult]) -> None:
    result = cli_results[cid]
    assert result.returncode not in (0, 70), result  # 70 = internal error (a bug)
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: {result.path}: "), lines[0]
    if cid in _BY_ID:
        assert _BY_ID[cid].match in lines[0]


# --- valid files parse exactly ------------------------------------------------------------


@pytest.fixture(params=["tiny_llama", "tiny_moe", "tiny_swa"])
def tiny_model(request: pytest.FixtureRequest) -> Path:
    path: Path = request.getfixturevalue(request.param)
    return path


def _check_layout(gf: GGUFFile) -> None:
    """Tensors tile the data section: each starts where the previous one's padding ends."""
    assert gf.data_offset % gf.alignment == 0
    ordered = sorted(gf.tensors, key=lambda t: t.offset)
    padding = 0
    cursor = gf.data_offset
    for t in ordered:
        assert t.offset == cursor + (-cursor % gf.alignment)
        padding += t.offset - cursor
        cursor = t.offset + t.n_bytes
    padding += gf.file_size - cursor
    assert padding < gf.alignment * max(1, len(ordered) + 1)
    assert sum(t.n_bytes for t in gf.tensors) == gf.tensor_data_size - padding


def test_tiny_models_parse(tiny_model: Path) -> None:
    start = time.perf_counter()
    gf = read_gguf(tiny_model)
    assert time.perf_counter() - start < REJECT_WITHIN_S
    assert gf.version == 3
    assert gf.alignment == 32
    assert gf.metadata["general.architecture"] in ("llama", "gemma3")
    tokens = gf.metadata["tokenizer.ggml.tokens"]
    assert isinstance(tokens, ArrayInfo) and tokens.length == 3 + 256 + 28
    assert tokens.values is None
    scores = gf.metadata["tokenizer.ggml.scores"]
    assert isinstance(scores, ArrayInfo) and scores.values is not None
    assert len(scores.values) == tokens.length
    _check_layout(gf)


def test_tiny_models_agree_with_gguf_reader(tiny_model: Path) -> None:
    gf = read_gguf(tiny_model)
    ref = GGUFReader(tiny_model)
    assert gf.data_offset == ref.data_offset
    assert [t.name for t in gf.tensors] == [t.name for t in ref.tensors]
    for ours, theirs in zip(gf.tensors, ref.tensors, strict=True):
        assert ours.shape == tuple(int(d) for d in theirs.shape)
        assert ours.ggml_type == theirs.tensor_type
        assert ours.offset == theirs.data_offset
        assert ours.n_bytes == theirs.n_bytes
    assert set(gf.metadata) == {k for k in ref.fields if not k.startswith("GGUF.")}


def test_crafted_valid_file() -> None:
    data = gc.valid_file()
    gf = parse_gguf(data, len(data), Path("crafted.gguf"))
    md = gf.metadata
    assert md["general.name"] == "crafted"
    assert md["llama.block_count"] == 1
    assert md["general.flag"] is True
    assert md["general.big"] == -(2**40)
    assert md["llama.attention.head_count_kv"] == ArrayInfo(VT.UINT32, 2, (2, 2))
    assert md["tokenizer.ggml.tokens"] == ArrayInfo(VT.STRING, 5, None)
    assert [(t.name, t.shape, t.n_bytes) for t in gf.tensors] == [
        ("a", (8,), 32),
        ("b", (4, 2), 32),
        ("c", (2, 2, 2, 1), 32),
    ]
    assert gf.tensors[2].offset == gf.data_offset + 64
    assert gf.tensor_data_size == 96
    _check_layout(gf)


@pytest.mark.parametrize(
    ("data", "n_tensors"),
    [
        pytest.param(gc.build(), 0, id="no-tensors"),
        pytest.param(gc.build(pad=False), 0, id="no-tensors-unpadded"),
        pytest.param(gc.build(version=2), 0, id="version-2"),
        pytest.param(
            _tensors(gc.tensor_info("b", [8], QT.F32, 32), A8), 2, id="listed-out-of-order"
        ),
        pytest.param(_tensors(gc.tensor_info("a", [8], QT.F32, 32)), 1, id="gap-before"),
        pytest.param(_tensors(gc.tensor_info("s", [], QT.F32, 0)), 1, id="zero-dims"),
        pytest.param(_tensors(A8, gc.tensor_info("z", [0, 7], QT.F32, 0)), 2, id="empty-tensor"),
        pytest.param(
            gc.build(
                [gc.ARCH_KV, gc.kv_u32("general.alignment", 64)],
                [gc.tensor_info("q", [32], QT.Q4_0, 0), gc.tensor_info("r", [64], QT.F16, 64)],
                b"\0" * 192,
                alignment=64,
            ),
            2,
            id="alignment-64-quantized",
        ),
    ],
)
def test_unusual_but_valid_files_parse(data: bytes, n_tensors: int) -> None:
    gf = parse_gguf(data, len(data), Path("x"))
    assert len(gf.tensors) == n_tensors
    assert 0 <= gf.data_offset <= gf.file_size
    for t in gf.tensors:
        assert gf.data_offset <= t.offset and t.offset + t.n_bytes <= gf.file_size


def test_large_vocabulary_parses_fast() -> None:
    """262 144 tokens (Gemma 3's vocabulary) are counted, not decoded, in well under 1 s."""
    tokens = [f"tok{i}".encode() for i in range(262_144)]
    data = gc.build([gc.ARCH_KV, gc.kv_str_array("tokenizer.ggml.tokens", tokens)])
    start = time.perf_counter()
    gf = parse_gguf(data, len(data), Path("x"))
    assert time.perf_counter() - start < REJECT_WITHIN_S
    assert gf.metadata["tokenizer.ggml.tokens"].length == 262_144


@pytest.mark.parametrize("keep", [0.6, 0.999])
def test_a_real_model_cut_short_says_truncated(gemma_path: Path, tmp_path: Path,
                                               keep: float) -> None:
    """A download or copy cut inside the tensor data: the error said "lies past the end
    of the data section", never that the file is truncated."""
    from cli_helpers import run_cli

    size = gemma_path.stat().st_size
    cut = tmp_path / "cut.gguf"
    with gemma_path.open("rb") as src, cut.open("wb") as dst:
        dst.write(src.read(int(size * keep)))
    with pytest.raises(GGUFFormatError) as info:
        read_gguf(cut)
    msg = str(info.value)
    assert "truncated file" in msg and f"{size:,} bytes" in msg, msg
    assert f"{cut.stat().st_size:,}" in msg, msg
    r = run_cli("run", str(cut), "-p", "hi")
    assert r.returncode != 0 and "truncated" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_an_unchanged_file_is_parsed_once_and_a_changed_one_again(
    tiny_llama: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from inferenceos.model import gguf_file

    parses: list[Path] = []
    real = gguf_file.parse_gguf
    monkeypatch.setattr(gguf_file, "parse_gguf",
                        lambda buf, size, path: parses.append(path) or real(buf, size, path))
    copy = tmp_path / "m.gguf"
    copy.write_bytes(tiny_llama.read_bytes())
    first = read_gguf(copy)
    assert read_gguf(copy) is first and len(parses) == 1  # the plan, the spec, telemetry
    with pytest.raises(TypeError):
        first.metadata["general.name"] = "changed"  # type: ignore[index]  # shared: read-only
    copy.write_bytes(copy.read_bytes() + b"\0" * 32)  # changed in place: size and mtime
    again = read_gguf(copy)
    assert len(parses) == 2 and again.file_size == first.file_size + 32
    copy.write_bytes(b"GGUF" + b"\0" * 8)  # now malformed: judged anew, never the old parse
    with pytest.raises(GGUFFormatError):
        read_gguf(copy)
