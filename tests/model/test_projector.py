"""ProjectorFacts (model/projector.py) and `inspect` on projector files.

The facts are read with our bounded GGUF reader; the tiny pair's token count is checked
against llama.cpp's own mtmd on the same file, so the two cannot drift apart silently.
"""

from __future__ import annotations

import ctypes
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFWriter

from cli_helpers import run_cli
from inferenceos.errors import GGUFFormatError
from inferenceos.model.projector import image_tokens, load_projector
from tiny_vlm import TINY_AUDIO, TINY_PROJECTOR, tiny_audio, tiny_vlm


@pytest.fixture(scope="module")
def pair(tiny_dir: Path) -> tuple[Path, Path]:
    return tiny_vlm(tiny_dir)


def _clip_file(path: Path, keys: dict[str, object], tensors: tuple[str, ...] = ()) -> Path:
    """A small clip GGUF with the given keys (typed by Python type) and f32 tensors."""
    w = GGUFWriter(str(path), "clip")
    for k, v in keys.items():
        if isinstance(v, bool):
            w.add_bool(k, v)
        elif isinstance(v, int):
            w.add_uint32(k, v)
        elif isinstance(v, float):
            w.add_float32(k, v)
        else:
            w.add_string(k, str(v))
    for name in tensors or ("mm.a.mlp.2.weight",):
        w.add_tensor(name, np.zeros((8, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_tiny_projector_facts(pair: tuple[Path, Path]) -> None:
    _, mmproj = pair
    pf = load_projector(mmproj)
    p = TINY_PROJECTOR
    assert (pf.kind, pf.has_vision, pf.has_audio) == ("mlp", True, False)
    assert pf.vision is not None and pf.audio is None
    assert pf.vision.block_count == p.n_layer == 2
    assert pf.vision.layers_run == 1  # LLaVA: the second-to-last block's features
    assert (pf.vision.embedding_length, pf.vision.feed_forward_length) == (p.n_embd, p.n_ff)
    assert (pf.image_size, pf.patch_size, pf.n_merge) == (32, 8, 1)
    assert pf.tokens_per_image == image_tokens(pf, 640, 480) == 16
    assert pf.image_tokens_exact
    assert pf.output_embedding == p.n_embd_text
    assert pf.weight_bytes == pf.parameters * 4  # all f32
    assert 0 < pf.projector_bytes < pf.weight_bytes
    assert pf.vision.layer_bytes + pf.projector_bytes + pf.embedding_bytes == pf.weight_bytes
    assert pf.encoder_flops() > 2 * 16 * pf.vision.params_per_layer


def test_token_count_matches_mtmd(pair: tuple[Path, Path]) -> None:
    """image_tokens() against llama.cpp's own tokenizer of the same image."""
    from llama_cpp import llama_cpp as L
    from llama_cpp import mtmd_cpp as M

    model_path, mmproj = pair
    L.llama_backend_init()
    model = L.llama_model_load_from_file(str(model_path).encode(), L.llama_model_default_params())
    cp = M.mtmd_context_params_default()
    cp.use_gpu, cp.n_threads = False, 1
    ctx = M.mtmd_init_from_file(str(mmproj).encode(), model, cp)
    try:
        nx, ny = 50, 20
        data = bytes(range(256)) * (nx * ny * 3 // 256 + 1)
        bm = M.mtmd_bitmap_init(nx, ny, (ctypes.c_uint8 * (nx * ny * 3)).from_buffer_copy(
            data[: nx * ny * 3]))
        chunks = M.mtmd_input_chunks_init()
        text = b"<__media__>"
        inp = M.mtmd_input_text(text=text, text_len=len(text), add_special=False,
                                parse_special=True)
        assert M.mtmd_tokenize(ctx, chunks, ctypes.byref(inp),
                               (M.mtmd_bitmap_p_ctypes * 1)(bm), 1) == 0
        n = [M.mtmd_input_chunk_get_n_tokens(M.mtmd_input_chunks_get(chunks, i))
             for i in range(M.mtmd_input_chunks_size(chunks))
             if M.mtmd_input_chunk_get_type(M.mtmd_input_chunks_get(chunks, i))
             == M.MTMD_INPUT_CHUNK_TYPE_IMAGE]
        assert n == [image_tokens(load_projector(mmproj), nx, ny)]
        M.mtmd_input_chunks_free(chunks)
        M.mtmd_bitmap_free(bm)
    finally:
        M.mtmd_free(ctx)
        L.llama_model_free(model)


def test_token_rules_of_other_kinds(pair: tuple[Path, Path]) -> None:
    pf = load_projector(pair[1])
    gemma3 = replace(pf, projector_type="gemma3", image_size=896, patch_size=14, n_merge=4)
    assert image_tokens(gemma3) == 256 and gemma3.image_tokens_exact
    qwen = replace(pf, projector_type="qwen2vl_merger", image_size=0, patch_size=14)
    assert image_tokens(qwen, 448, 448) == 256 and not qwen.image_tokens_exact
    assert image_tokens(qwen, 896, 448) == 512  # dynamic: grows with the image
    ldp = replace(pf, projector_type="ldp", image_size=336, patch_size=14)
    assert image_tokens(ldp) == 144


def test_audio_projector(tmp_path: Path) -> None:
    path = _clip_file(tmp_path / "mmproj-audio.gguf", {
        "clip.has_audio_encoder": True, "clip.projector_type": "ultravox",
        "clip.audio.embedding_length": 32, "clip.audio.block_count": 2,
        "clip.audio.feed_forward_length": 64, "clip.audio.attention.head_count": 4,
        "clip.audio.num_mel_bins": 128,
    }, ("a.blk.0.attn_q.weight", "mm.a.mlp.2.weight"))
    pf = load_projector(path)
    assert (pf.has_audio, pf.has_vision, pf.kind) == (True, False, "ultravox")
    assert (pf.audio_sample_rate, pf.n_mel_bins, pf.tokens_per_image) == (16000, 128, 0)
    assert pf.output_embedding == 8  # mm.a.mlp.2.weight ne[1]
    r = run_cli("inspect", str(path), "--no-digest", COLUMNS="160")
    assert r.returncode == 0, r.stderr
    assert "ultravox" in r.stdout and "128 mel bins" in r.stdout and "16000 Hz" in r.stdout


def test_tiny_audio_projector_facts(tiny_dir: Path) -> None:
    pf = load_projector(tiny_audio(tiny_dir)[1])
    assert (pf.kind, pf.has_audio, pf.has_vision) == ("ultravox", True, False)
    assert pf.audio is not None and pf.audio.block_count == TINY_AUDIO.n_layer
    assert (pf.n_mel_bins, pf.audio_sample_rate) == (128, 16000)
    assert pf.output_embedding == TINY_AUDIO.n_embd_text
    assert pf.tokens_per_image == 0 and image_tokens(pf, 32, 32) == 0


def test_not_a_projector_is_a_clear_error(pair: tuple[Path, Path], tmp_path: Path) -> None:
    model, _ = pair
    with pytest.raises(GGUFFormatError, match=r"not a multimodal projector.*'llama'"):
        load_projector(model)
    empty = _clip_file(tmp_path / "empty.gguf", {"clip.projector_type": "mlp"})
    with pytest.raises(GGUFFormatError, match="neither a vision nor an audio encoder"):
        load_projector(empty)
    no_patch = _clip_file(tmp_path / "nopatch.gguf", {
        "clip.has_vision_encoder": True, "clip.projector_type": "mlp",
        "clip.vision.embedding_length": 32, "clip.vision.image_size": 32,
    })
    with pytest.raises(GGUFFormatError, match="patch_size"):
        load_projector(no_patch)
    huge = _clip_file(tmp_path / "huge.gguf", {
        "clip.has_vision_encoder": True, "clip.projector_type": "mlp",
        "clip.vision.embedding_length": 32, "clip.vision.image_size": 100000,
        "clip.vision.patch_size": 8,
    })
    with pytest.raises(GGUFFormatError, match="image_size 100000 exceeds"):
        load_projector(huge)
    wrong = _clip_file(tmp_path / "wrong.gguf", {
        "clip.has_vision_encoder": True, "clip.projector_type": "mlp",
        "clip.vision.embedding_length": "wide", "clip.vision.patch_size": 8,
    })
    with pytest.raises(GGUFFormatError, match=r"wrong\.gguf: clip.vision.embedding_length must"):
        load_projector(wrong)
    r = run_cli("inspect", str(wrong), "--no-digest")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "embedding_length must be an integer" in r.stderr + r.stdout


def test_inspect_shows_a_projector(pair: tuple[Path, Path]) -> None:
    _, mmproj = pair
    r = run_cli("inspect", str(mmproj), "--no-digest", COLUMNS="160")
    assert r.returncode == 0, r.stderr
    for text in ("multimodal projector", "mlp", "32 px / 8 px", "tokens per image",
                 "2 blocks, 1 run", "width 32"):
        assert text in r.stdout, text
    r = run_cli("inspect", str(mmproj), "--json", "--no-digest")
    data = json.loads(r.stdout)
    assert data["architecture"] == "clip"
    pj = data["projector"]
    assert (pj["kind"], pj["image_size"], pj["patch_size"], pj["tokens_per_image"]) == (
        "mlp", 32, 8, 16)
    assert pj["has_audio"] is False and pj["vision"]["block_count"] == 2


def test_inspect_names_the_projector_beside_a_model(
    pair: tuple[Path, Path], tiny_llama: Path
) -> None:
    model, mmproj = pair
    r = run_cli("inspect", str(model), "--json", "--no-digest")
    data = json.loads(r.stdout)
    assert data["architecture"] == "llama"
    assert data["projector"]["path"] == str(mmproj) and data["projector"]["kind"] == "mlp"
    r = run_cli("inspect", str(model), "--no-digest", COLUMNS="160")
    assert "mmproj.gguf (mlp)" in r.stdout
    alone = json.loads(run_cli("inspect", str(tiny_llama), "--json", "--no-digest").stdout)
    assert alone["projector"] is None
