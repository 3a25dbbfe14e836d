"""The tiny vision-language pair (tests/tiny_vlm.py) through llama.cpp's own mtmd.

Straight on the bindings (`llama_cpp.mtmd_cpp`), no engine code: the pair must load, the
prompt must tokenize into text / image / text chunks, the image must encode into
n_tokens x n_embd floats that depend on the image, and the chunks must enter a llama
context (positions advance by the token counts).
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from llama_cpp import llama_cpp as L
from llama_cpp import mtmd_cpp as M

from tiny_vlm import TINY_AUDIO, TINY_PROJECTOR, tiny_audio, tiny_vlm

PROMPT = b"describe <__media__> please"


@pytest.fixture(scope="module")
def mtmd(tiny_dir: Path) -> Iterator[tuple[Any, Any]]:
    """(mtmd context, llama model) for the tiny pair, freed at the end of the module."""
    model_path, mmproj_path = tiny_vlm(tiny_dir)  # same as the tiny_vlm_pair fixture
    L.llama_backend_init()
    params = L.llama_model_default_params()
    model = L.llama_model_load_from_file(str(model_path).encode(), params)
    assert model
    cparams = M.mtmd_context_params_default()
    cparams.use_gpu = False
    cparams.n_threads = 1
    ctx = M.mtmd_init_from_file(str(mmproj_path).encode(), model, cparams)
    assert ctx, "mtmd_init_from_file failed on the tiny pair"
    yield ctx, model
    M.mtmd_free(ctx)
    L.llama_model_free(model)


def _bitmap(seed: int, nx: int = 40, ny: int = 30) -> Any:
    data = np.random.default_rng(seed).integers(0, 256, nx * ny * 3, dtype=np.uint8).tobytes()
    bm = M.mtmd_bitmap_init(nx, ny, (ctypes.c_uint8 * len(data)).from_buffer_copy(data))
    assert bm
    return bm


def _tokenize(ctx: Any, bitmap: Any, text: bytes = PROMPT) -> Any:
    chunks = M.mtmd_input_chunks_init()
    inp = M.mtmd_input_text(text=text, text_len=len(text), add_special=True, parse_special=True)
    bitmaps = (M.mtmd_bitmap_p_ctypes * 1)(bitmap)
    rc = M.mtmd_tokenize(ctx, chunks, ctypes.byref(inp), bitmaps, 1)
    assert rc == 0, f"mtmd_tokenize returned {rc}"
    return chunks


def _chunk_kinds(chunks: Any) -> list[tuple[int, int]]:
    out = []
    for i in range(M.mtmd_input_chunks_size(chunks)):
        c = M.mtmd_input_chunks_get(chunks, i)
        out.append((M.mtmd_input_chunk_get_type(c), M.mtmd_input_chunk_get_n_tokens(c)))
    return out


def _encode(ctx: Any, seed: int) -> np.ndarray:
    bm = _bitmap(seed)
    chunks = _tokenize(ctx, bm)
    try:
        image = M.mtmd_input_chunks_get(chunks, 1)
        assert M.mtmd_encode_chunk(ctx, image) == 0
        n_tokens = M.mtmd_input_chunk_get_n_tokens(image)
        n_embd = TINY_PROJECTOR.n_embd_text
        out = M.mtmd_get_output_embd(ctx)
        return np.ctypeslib.as_array(out, shape=(n_tokens * n_embd,)).copy()
    finally:
        M.mtmd_input_chunks_free(chunks)
        M.mtmd_bitmap_free(bm)


def test_pair_loads_with_vision_and_no_audio(mtmd: tuple[Any, Any]) -> None:
    ctx, model = mtmd
    assert M.mtmd_support_vision(ctx)
    assert not M.mtmd_support_audio(ctx)
    assert not M.mtmd_decode_use_mrope(ctx)
    assert L.llama_model_n_embd(model) == TINY_PROJECTOR.n_embd_text


def test_prompt_tokenizes_into_text_image_text(mtmd: tuple[Any, Any]) -> None:
    ctx, _ = mtmd
    bm = _bitmap(1)
    chunks = _tokenize(ctx, bm)
    kinds = _chunk_kinds(chunks)
    M.mtmd_input_chunks_free(chunks)
    M.mtmd_bitmap_free(bm)
    text, image = M.MTMD_INPUT_CHUNK_TYPE_TEXT, M.MTMD_INPUT_CHUNK_TYPE_IMAGE
    assert [k for k, _ in kinds] == [text, image, text]
    assert kinds[1][1] == TINY_PROJECTOR.image_tokens == 16
    assert kinds[0][1] > 1 and kinds[2][1] > 1  # "<s>describe " and " please" as tokens


def test_image_encodes_to_n_tokens_by_n_embd_and_depends_on_the_image(
    mtmd: tuple[Any, Any],
) -> None:
    ctx, _ = mtmd
    a, a_again, b = _encode(ctx, 1), _encode(ctx, 1), _encode(ctx, 2)
    assert a.shape == (TINY_PROJECTOR.image_tokens * TINY_PROJECTOR.n_embd_text,)
    assert np.isfinite(a).all() and np.abs(a).max() > 0
    np.testing.assert_array_equal(a, a_again)  # deterministic
    assert np.abs(a - b).max() > 1e-3  # a different image, different embeddings


def test_chunks_enter_a_llama_context(mtmd: tuple[Any, Any]) -> None:
    ctx, model = mtmd
    cparams = L.llama_context_default_params()
    cparams.n_ctx = 128
    cparams.n_batch = 64
    cparams.n_threads = 1
    cparams.n_threads_batch = 1
    lctx = L.llama_init_from_model(model, cparams)
    assert lctx
    bm = _bitmap(3)
    chunks = _tokenize(ctx, bm)
    try:
        expected = sum(n for _, n in _chunk_kinds(chunks))
        new_n_past = L.llama_pos(0)
        rc = M.mtmd_helper_eval_chunks(ctx, lctx, chunks, 0, 0, 64, True, ctypes.byref(new_n_past))
        assert rc == 0
        assert new_n_past.value == expected == M.mtmd_helper_get_n_pos(chunks)
        logits = L.llama_get_logits_ith(lctx, -1)
        n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
        row = np.ctypeslib.as_array(logits, shape=(n_vocab,))
        assert np.isfinite(row).all()
    finally:
        M.mtmd_input_chunks_free(chunks)
        M.mtmd_bitmap_free(bm)
        L.llama_free(lctx)


def test_make_tiny_vlm_script_writes_the_pair(tmp_path: Path) -> None:
    script = Path(__file__).resolve().parents[2] / "scripts" / "make_tiny_vlm.py"
    out = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "vlm"), "--audio"],
        capture_output=True, text=True, timeout=60, check=True,
    )
    assert "16 tokens per image" in out.stdout and "150 tokens per 30 s" in out.stdout
    for name in ("model.gguf", "mmproj.gguf", "mmproj-audio.gguf"):
        assert (tmp_path / "vlm" / name).stat().st_size > 10_000


@pytest.fixture(scope="module")
def mtmd_audio(tiny_dir: Path) -> Iterator[Any]:
    """The mtmd context of the tiny Ultravox-type audio projector."""
    model_path, mmproj_path = tiny_audio(tiny_dir)
    L.llama_backend_init()
    model = L.llama_model_load_from_file(str(model_path).encode(), L.llama_model_default_params())
    cparams = M.mtmd_context_params_default()
    cparams.use_gpu = False
    cparams.n_threads = 1
    ctx = M.mtmd_init_from_file(str(mmproj_path).encode(), model, cparams)
    assert ctx, "mtmd_init_from_file failed on the tiny audio projector"
    yield ctx
    M.mtmd_free(ctx)
    L.llama_model_free(model)


def _encode_tone(ctx: Any, hz: float) -> tuple[list[tuple[int, int]], np.ndarray]:
    t = np.arange(16000) / 16000  # one second at 16 kHz
    pcm = (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32)
    bm = M.mtmd_bitmap_init_from_audio(len(pcm), pcm.ctypes.data_as(ctypes.POINTER(ctypes.c_float)))
    assert bm and M.mtmd_bitmap_is_audio(bm)
    chunks = _tokenize(ctx, bm, b"hear <__media__> now")
    try:
        kinds = _chunk_kinds(chunks)
        audio = M.mtmd_input_chunks_get(chunks, 1)
        assert M.mtmd_encode_chunk(ctx, audio) == 0
        n = M.mtmd_input_chunk_get_n_tokens(audio) * TINY_AUDIO.n_embd_text
        out = np.ctypeslib.as_array(M.mtmd_get_output_embd(ctx), shape=(n,)).copy()
        return kinds, out
    finally:
        M.mtmd_input_chunks_free(chunks)
        M.mtmd_bitmap_free(bm)


def test_audio_projector_hears(mtmd_audio: Any) -> None:
    ctx = mtmd_audio
    assert M.mtmd_support_audio(ctx) and not M.mtmd_support_vision(ctx)
    assert M.mtmd_get_audio_sample_rate(ctx) == 16000
    kinds, a = _encode_tone(ctx, 440.0)
    text, audio = M.MTMD_INPUT_CHUNK_TYPE_TEXT, M.MTMD_INPUT_CHUNK_TYPE_AUDIO
    assert [k for k, _ in kinds] == [text, audio, text]
    assert kinds[1][1] == TINY_AUDIO.tokens_per_window == 150  # one 30 s window
    _, b = _encode_tone(ctx, 880.0)
    assert np.isfinite(a).all() and np.abs(a - b).max() > 1e-3
