"""A tiny vision-language pair that llama.cpp's mtmd really loads and runs.

- `model.gguf`: the 2-layer llama of tests/tiny_models.py (n_embd 64, byte-fallback SPM
  vocabulary, so ordinary text tokenizes);
- `mmproj.gguf`: a LLaVA-1.5-style projector (`clip.projector_type = "mlp"`): a CLIP ViT
  (conv patch embedding, learned 1-D position embeddings, pre-LN, 2 encoder blocks of
  LayerNorm + MHA + GELU-quick FFN) and the 2-layer MLP `mm.0` / GELU / `mm.2` that maps
  the vision width (32) to the text model's n_embd (64).

Why "mlp": its positions are ordinary causal 1-D text positions (no M-RoPE), its token count
is exactly (image_size / patch_size)^2 with no pooling, merge or special wrapper tokens
(mtmd.cpp adds none for it), and its loader (clip.cpp `load_tensors`, PROJECTOR_TYPE_MLP)
needs only the generic ViT tensors plus `mm.0` / `mm.2` - the smallest faithful real type.
mtmd resizes any image to image_size x image_size (fixed-size preprocessor), so every image
gives the same number of tokens: (32 / 8)^2 = 16.

Note on layers: LLaVA takes the features of the second-to-last encoder block (clip.cpp
`clip_graph_llava::build`: `il_last = n_layer - 1`), so with 2 blocks only block 0 runs;
block 1's weights are loaded but unused, as in real LLaVA-1.5 files.

`write_tiny_audio_mmproj` writes an audio projector of the Ultravox type (clip.cpp
`clip_graph_whisper_enc`: Whisper's two 1-D convolutions over 128 mel bins, 1 encoder
block, frames stacked by 10, an RMS-normed SwiGLU adapter to n_embd 64): mtmd computes
the mel spectrogram itself (30 s windows of 3000 frames -> 150 tokens per window). It is
kept apart from `mmproj.gguf` (`tiny_audio`: its own folder) so that a lookup of "the
projector beside the model" stays unambiguous.

Weights are seeded random numbers (f32), so two different images give different embeddings.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFWriter
from PIL import Image

from tiny_models import SHAPES, write_tiny_model

MODEL_NAME = "model.gguf"
MMPROJ_NAME = "mmproj.gguf"


@dataclass(frozen=True)
class TinyProjector:
    """Dimensions of the tiny CLIP + MLP projector (encodes one image in milliseconds)."""

    image_size: int = 32
    patch_size: int = 8
    n_embd: int = 32  # vision width
    n_head: int = 4
    n_ff: int = 64  # must differ from n_embd (clip.cpp's up/down swap heuristic)
    n_layer: int = 2
    proj_hidden: int = 64  # mm.0 output width
    n_embd_text: int = SHAPES["llama"].n_embd  # mm.2 output width = text model n_embd

    @property
    def n_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def image_tokens(self) -> int:
        """Tokens per image: one per patch (no CLS token, no pooling)."""
        return self.n_patches


TINY_PROJECTOR = TinyProjector()


def write_tiny_mmproj(path: Path, p: TinyProjector = TINY_PROJECTOR, seed: int = 1) -> Path:
    """Write the tiny LLaVA "mlp" projector to `path` and return it.

    Tensor names and keys follow clip.cpp (clip-impl.h `TN_*` / `KEY_*`); numpy shapes are
    ggml `ne` reversed (a matrix mapping A -> B is ne {A, B}, numpy (B, A))."""
    rng = np.random.default_rng(seed)
    w = GGUFWriter(str(path), "clip")
    w.add_name("tiny-llava-mlp")
    w.add_uint32("general.file_type", 0)  # ALL_F32
    w.add_bool("clip.has_vision_encoder", True)
    w.add_bool("clip.has_audio_encoder", False)
    w.add_string("clip.projector_type", "mlp")
    w.add_uint32("clip.vision.image_size", p.image_size)
    w.add_uint32("clip.vision.patch_size", p.patch_size)
    w.add_uint32("clip.vision.embedding_length", p.n_embd)
    w.add_uint32("clip.vision.feed_forward_length", p.n_ff)
    w.add_uint32("clip.vision.block_count", p.n_layer)
    w.add_uint32("clip.vision.projection_dim", p.n_embd_text)
    w.add_uint32("clip.vision.attention.head_count", p.n_head)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-5)
    w.add_array("clip.vision.image_mean", [0.48145466, 0.4578275, 0.40821073])
    w.add_array("clip.vision.image_std", [0.26862954, 0.26130258, 0.27577711])

    def rand(name: str, *shape: int, scale: float = 0.1) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    def norm(name: str, n: int) -> None:
        w.add_tensor(f"{name}.weight", np.ones(n, dtype=np.float32))
        w.add_tensor(f"{name}.bias", np.zeros(n, dtype=np.float32))

    h = p.n_embd
    # conv kernel ne {P, P, 3, H}: one H-vector per (P x P x RGB) patch
    rand("v.patch_embd.weight", h, 3, p.patch_size, p.patch_size, scale=0.05)
    rand("v.patch_embd.bias", h)
    rand("v.position_embd.weight", p.n_patches, h)
    norm("v.pre_ln", h)
    for i in range(p.n_layer):
        b = f"v.blk.{i}"
        norm(f"{b}.ln1", h)
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            rand(f"{b}.{name}.weight", h, h)
            rand(f"{b}.{name}.bias", h)
        norm(f"{b}.ln2", h)
        rand(f"{b}.ffn_up.weight", p.n_ff, h)
        rand(f"{b}.ffn_up.bias", p.n_ff)
        rand(f"{b}.ffn_down.weight", h, p.n_ff)
        rand(f"{b}.ffn_down.bias", h)
    rand("mm.0.weight", p.proj_hidden, h)
    rand("mm.0.bias", p.proj_hidden)
    rand("mm.2.weight", p.n_embd_text, p.proj_hidden)
    rand("mm.2.bias", p.n_embd_text)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@dataclass(frozen=True)
class TinyAudioProjector:
    """Dimensions of the tiny Ultravox-style audio projector."""

    n_mel: int = 128
    n_embd: int = 32
    n_head: int = 4
    n_ff: int = 64
    n_layer: int = 1
    # frames stacked into one token after the encoder. Not Ultravox's 8: with 8, clip.cpp
    # counts 3000/8/2 = 187 tokens but its graph pads 1500 rows to 188, and
    # clip_image_batch_encode aborts the process ("Invalid number of output tokens")
    stack: int = 10
    n_pos: int = 1500  # 3000 mel frames / 2 (the second conv's stride)
    proj_hidden: int = 64  # SwiGLU width (mm.a.mlp.1 gives twice this)
    n_embd_text: int = SHAPES["llama"].n_embd

    @property
    def tokens_per_window(self) -> int:
        """Tokens of one 30 s window: clip.cpp's count (3000 frames, stacked, halved)."""
        return -(-3000 // self.stack) // 2


TINY_AUDIO = TinyAudioProjector()


def write_tiny_audio_mmproj(path: Path, p: TinyAudioProjector = TINY_AUDIO, seed: int = 2) -> Path:
    """Write the tiny Ultravox-type audio projector to `path` and return it (tensor
    names from clip.cpp `load_tensors`, PROJECTOR_TYPE_ULTRAVOX and the common blocks)."""
    rng = np.random.default_rng(seed)
    w = GGUFWriter(str(path), "clip")
    w.add_name("tiny-ultravox")
    w.add_uint32("general.file_type", 0)
    w.add_bool("clip.has_vision_encoder", False)
    w.add_bool("clip.has_audio_encoder", True)
    w.add_string("clip.projector_type", "ultravox")
    w.add_uint32("clip.audio.num_mel_bins", p.n_mel)
    w.add_uint32("clip.audio.embedding_length", p.n_embd)
    w.add_uint32("clip.audio.feed_forward_length", p.n_ff)
    w.add_uint32("clip.audio.block_count", p.n_layer)
    w.add_uint32("clip.audio.projection_dim", p.n_embd_text)
    w.add_uint32("clip.audio.attention.head_count", p.n_head)
    w.add_float32("clip.audio.attention.layer_norm_epsilon", 1e-5)
    w.add_uint32("clip.audio.projector.stack_factor", p.stack)

    def rand(name: str, *shape: int, scale: float = 0.1, dtype: type = np.float32) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * scale).astype(dtype))

    def norm(name: str, n: int, bias: bool = True) -> None:
        w.add_tensor(f"{name}.weight", np.ones(n, dtype=np.float32))
        if bias:
            w.add_tensor(f"{name}.bias", np.zeros(n, dtype=np.float32))

    h = p.n_embd
    # conv kernels ne {K=3, in, out}, f16 as Whisper conversions store them
    rand("a.conv1d.1.weight", h, p.n_mel, 3, scale=0.05, dtype=np.float16)
    # conv output is ne {length, channels}: a bias of ne {1, channels} broadcasts over it
    rand("a.conv1d.1.bias", h, 1)
    rand("a.conv1d.2.weight", h, h, 3, scale=0.05, dtype=np.float16)
    rand("a.conv1d.2.bias", h, 1)
    rand("a.position_embd.weight", p.n_pos, h)
    for i in range(p.n_layer):
        b = f"a.blk.{i}"
        norm(f"{b}.ln1", h)
        rand(f"{b}.attn_q.weight", h, h)
        rand(f"{b}.attn_q.bias", h)
        rand(f"{b}.attn_k.weight", h, h)  # Whisper's K has no bias
        rand(f"{b}.attn_v.weight", h, h)
        rand(f"{b}.attn_v.bias", h)
        rand(f"{b}.attn_out.weight", h, h)
        rand(f"{b}.attn_out.bias", h)
        norm(f"{b}.ln2", h)
        rand(f"{b}.ffn_up.weight", p.n_ff, h)
        rand(f"{b}.ffn_up.bias", p.n_ff)
        rand(f"{b}.ffn_down.weight", h, p.n_ff)
        rand(f"{b}.ffn_down.bias", h)
    norm("mm.a.norm_pre", h * p.stack, bias=False)
    rand("mm.a.mlp.1.weight", 2 * p.proj_hidden, h * p.stack)
    norm("mm.a.norm_mid", p.proj_hidden, bias=False)
    rand("mm.a.mlp.2.weight", p.n_embd_text, p.proj_hidden)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _atomic(target: Path, write: object) -> None:
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    write(tmp)  # type: ignore[operator]
    os.replace(tmp, target)


def write_tiny_vlm(directory: Path) -> tuple[Path, Path]:
    """Write `model.gguf` and `mmproj.gguf` into `directory` (created) and return both."""
    directory.mkdir(parents=True, exist_ok=True)
    model, mmproj = directory / MODEL_NAME, directory / MMPROJ_NAME
    _atomic(model, lambda t: write_tiny_model(t, "llama"))
    _atomic(mmproj, write_tiny_mmproj)
    return model, mmproj


def write_tiny_audio(directory: Path) -> Path:
    """Write `mmproj-audio.gguf` (the tiny Ultravox projector) into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / "mmproj-audio.gguf"
    _atomic(target, write_tiny_audio_mmproj)
    return target


_BUILT: dict[Path, tuple[Path, Path]] = {}


def tiny_vlm(tmp_dir: Path) -> tuple[Path, Path]:
    """(model_path, mmproj_path) of the tiny pair under `tmp_dir`/tiny-vlm, built once per
    process (the session-scoped `tiny_vlm_pair` fixture passes the session's tiny dir)."""
    directory = Path(tmp_dir) / "tiny-vlm"
    if directory not in _BUILT:
        model, mmproj = directory / MODEL_NAME, directory / MMPROJ_NAME
        if not (model.is_file() and mmproj.is_file()):
            model, mmproj = write_tiny_vlm(directory)
        _BUILT[directory] = (model, mmproj)
    return _BUILT[directory]


def tiny_audio(tmp_dir: Path) -> tuple[Path, Path]:
    """(model_path, audio mmproj_path) under `tmp_dir`/tiny-audio: the same text model
    with the Ultravox-type projector, in a folder of their own; built once per process."""
    directory = Path(tmp_dir) / "tiny-audio"
    if directory not in _BUILT:
        model, mmproj = directory / MODEL_NAME, directory / "mmproj-audio.gguf"
        if not (model.is_file() and mmproj.is_file()):
            directory.mkdir(parents=True, exist_ok=True)
            _atomic(model, lambda t: write_tiny_model(t, "llama"))
            write_tiny_audio(directory)
        _BUILT[directory] = (model, mmproj)
    return _BUILT[directory]


# -- images for the pair's tests ------------------------------------------------------

IMAGE_TOKENS = 16  # (32 / 8)^2: every image gives this many tokens (mtmd resizes it)


def png(color: tuple[int, int, int], size: tuple[int, int] = (40, 30)) -> bytes:
    """A small PNG of one colour with one odd pixel (so it is not trivially uniform)."""
    im = Image.new("RGB", size, color)
    im.putpixel((3, 3), (255 - color[0], 0, 0))
    buf = io.BytesIO()
    im.save(buf, "PNG")
    return buf.getvalue()


RED, BLUE = png((220, 10, 10)), png((10, 10, 220))
