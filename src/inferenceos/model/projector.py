"""mmproj GGUF → ProjectorFacts: what the planner and `inspect` need to know about a
multimodal projector (llama.cpp's `clip` files, loaded by mtmd), from metadata alone.

A projector file has `general.architecture = "clip"` and `clip.has_vision_encoder` /
`clip.has_audio_encoder`; each encoder's shape lives under `clip.vision.*` /
`clip.audio.*` and its projector type under `clip.projector_type` (or, for a file with
both, `clip.vision.projector_type` / `clip.audio.projector_type`). Key and tensor names
follow the vendored llama.cpp (`tools/mtmd/clip-impl.h`, `clip.cpp` `load_hparams`,
`load_tensors`, `clip_n_output_tokens`, `clip_n_mmproj_embd`).

Image tokens (`image_tokens`) are what `clip_n_output_tokens` gives for the image the
preprocessor hands the encoder: exact for fixed-size projectors (LLaVA "mlp", gemma3,
idefics3 without slices, internvl/llama4 single tile, ...), where every image is resized
to image_size²; approximate for dynamic-resolution types (qwen2vl family, pixtral, kimivl,
lfm2, ...), where the preprocessor first rescales the image within pixel limits we do not
model exactly; and for tiling (llava-uhd "pinpoints", minicpmv slices, internvl tiles) the
count is per tile (the overview), not the whole image.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from inferenceos.errors import GGUFFormatError
from inferenceos.model.gguf_file import ArrayInfo, GGUFFile, TensorInfo, read_gguf

CLIP_ARCH = "clip"
MAX_IMAGE_SIZE = 8192  # clip.cpp refuses larger (int32 overflow of n_patches)

# Projector types whose graph merges n×n patches into one token, with the loader's
# default per-side merge (clip.cpp load_hparams) when the file has no scale factor.
_MERGE_DEFAULTS: dict[str, int] = {
    "gemma3": 4,
    "gemma4v": 3,
    "idefics3": 1,
    "internvl": 1,
    "nemotron_v2_vl": 1,
    "llama4": 1,
    "minicpmv4_6": 1,
}
# Dynamic-resolution types that merge 2×2 patches (two convs / spatial merge).
_DOUBLE_PATCH = {
    "qwen2vl_merger", "qwen2.5vl_merger", "qwen3vl_merger", "ling3vl", "exaone4_5", "mimovl",
    "minimax_m3", "glm4v", "glm5v", "youtuvl", "muse_glimmer",
}
_ALIGNED_MERGE = {"lfm2", "kimivl", "kimik25"}  # patch*merge, sizes rounded up
_PER_PATCH = {"mlp", "mlp_norm", "janus_pro", "phi4"}
_QUARTER = {"ldp", "ldpv2"}
_DYNAMIC = _DOUBLE_PATCH | _ALIGNED_MERGE | {"pixtral", "lightonocr", "phi4", "paddleocr",
                                             "dots_ocr", "hunyuanvl", "step3vl"}
# Whisper-style audio encoders (clip.cpp sets 16 kHz for them).
_WHISPER_AUDIO = {"ultravox", "qwen2a", "voxtral", "glma", "meralion", "musicflamingo",
                  "qwen2.5o"}
# Which tensor gives the output (text) embedding size, and which of its dims
# (clip_n_mmproj_embd). First match wins.
_OUTPUT_TENSORS: tuple[tuple[str, int], ...] = (
    ("mm.2.weight", 1),
    ("mm.3.bias", 0),
    ("mm.1.bias", 0),
    ("mm.input_projection.weight", 0),
    ("mm.model.fc.weight", 1),
    ("mm.a.fc.weight", 1),
    ("mm.a.mlp.2.weight", 1),
    ("mm.model.proj.weight", 1),
)
_LAYER = re.compile(r"^(v|a)\.blk\.(\d+)\.")


@dataclass(frozen=True)
class EncoderFacts:
    """One encoder tower (vision or audio) of a projector file.

    `layers_run` is how many blocks the graph evaluates: LLaVA-style projectors take the
    second-to-last block's features (clip.cpp `clip_graph_llava`), so one block fewer
    than `block_count` unless the file names its feature layers.
    """

    modality: str  # "vision" or "audio"
    projector_type: str
    block_count: int
    layers_run: int
    embedding_length: int
    feed_forward_length: int
    head_count: int
    layer_parameters: int  # all blocks' weights (elements)
    layer_bytes: int

    @property
    def params_per_layer(self) -> int:
        return self.layer_parameters // self.block_count if self.block_count else 0


@dataclass(frozen=True)
class ProjectorFacts:
    """Everything about an mmproj file that can be known without loading it."""

    path: Path
    name: str
    projector_type: str  # the vision type when the file has vision, else the audio type
    has_vision: bool
    has_audio: bool
    vision: EncoderFacts | None
    audio: EncoderFacts | None
    image_size: int  # 0: dynamic, or no vision
    patch_size: int
    n_merge: int  # patches merged per side into one token (1: none)
    has_class_embedding: bool
    output_embedding: int  # n_embd of the text model this projector feeds (0: unknown)
    audio_sample_rate: int  # 0 when no audio or not known for the type
    n_mel_bins: int
    parameters: int
    weight_bytes: int  # every tensor's data
    projector_bytes: int  # the `mm.*` adapter alone
    projector_parameters: int
    embedding_bytes: int  # vision patch/position embeddings, pre/post norms (outside blocks)
    patch_parameters: int  # the patch embedding kernel(s): a matrix product per patch
    size_bytes: int  # the file
    file_type: str
    feature_layers: tuple[int, ...] = ()

    @property
    def kind(self) -> str:
        """`mlp`, `gemma3`, `ultravox`, ... (vision + audio files: `vision+audio`)."""
        if self.vision and self.audio and self.vision.projector_type != self.audio.projector_type:
            return f"{self.vision.projector_type}+{self.audio.projector_type}"
        return self.projector_type

    @property
    def image_tokens_exact(self) -> bool:
        """Whether `image_tokens` is the loader's own count for every image."""
        return self.has_vision and self.image_size > 0 and self.projector_type not in _DYNAMIC

    @property
    def tokens_per_image(self) -> int:
        """Tokens of a typical image (one image_size² tile); 0 without vision."""
        return image_tokens(self) if self.has_vision else 0

    def encoder_flops(self, n_patches: int | None = None) -> int:
        """Floating-point operations to encode one image (vision) of `n_patches` patches
        (default: one image_size² tile): 2 per weight per patch through the blocks that
        run, the patch embedding and the adapter, plus the attention products
        (4 · T² · width per block). The shape of `clip_graph_llava` / `build_vit`."""
        v = self.vision
        if v is None:
            return 0
        t = n_patches if n_patches is not None else self.n_patches()
        t += 1 if self.has_class_embedding else 0
        per_layer = v.params_per_layer
        dense = 2 * t * (per_layer * v.layers_run + self.patch_parameters)
        attention = 4 * t * t * v.embedding_length * v.layers_run
        adapter = 2 * (t // max(self.n_merge, 1) ** 2) * self.projector_parameters
        return dense + attention + adapter

    def n_patches(self, nx: int = 0, ny: int = 0) -> int:
        """Patches the encoder sees for an nx × ny image (fixed-size types: image_size²)."""
        if not self.has_vision or self.patch_size <= 0:
            return 0
        nx, ny = _encoder_input(self, nx, ny)
        return (nx // self.patch_size) * (ny // self.patch_size)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["path"] = str(self.path)
        d["kind"] = self.kind
        d["feature_layers"] = list(self.feature_layers)
        d["tokens_per_image"] = self.tokens_per_image
        d["image_tokens_exact"] = self.image_tokens_exact
        d["encoder_flops_per_image"] = self.encoder_flops()
        return d


def is_projector(gf: GGUFFile) -> bool:
    """Whether a parsed GGUF file is a clip/mtmd projector rather than a text model."""
    return gf.metadata.get("general.architecture") == CLIP_ARCH


def _encoder_input(facts: ProjectorFacts, nx: int, ny: int) -> tuple[int, int]:
    """The size the preprocessor hands the encoder: image_size² for fixed-size types;
    for dynamic ones the image itself (default: image_size², or 448² when 0)."""
    side = facts.image_size or 448
    if facts.image_tokens_exact or nx <= 0 or ny <= 0:
        return side, side
    return min(nx, MAX_IMAGE_SIZE), min(ny, MAX_IMAGE_SIZE)


def image_tokens(facts: ProjectorFacts, nx: int = 0, ny: int = 0) -> int:
    """Tokens one nx × ny image becomes in the context (`clip_n_output_tokens`).

    Exact when `facts.image_tokens_exact` (the image is resized to image_size² first, so
    nx and ny do not matter); otherwise an estimate from the image's own size without
    the preprocessor's min/max-pixel rescaling (see the module docstring). 0 without
    vision."""
    if not facts.has_vision or facts.patch_size <= 0:
        return 0
    kind, p, m = facts.projector_type, facts.patch_size, max(facts.n_merge, 1)
    w, h = _encoder_input(facts, nx, ny)
    n = (w // p) * (h // p)
    if kind in _PER_PATCH:
        return n
    if kind in _QUARTER:
        return n // 4
    if kind in _DOUBLE_PATCH:
        return (w // (2 * p)) * (h // (2 * p))
    if kind in _ALIGNED_MERGE:
        out = p * m
        return math.ceil(w / out) * math.ceil(h / out)
    if kind in ("pixtral", "lightonocr"):
        return (w // p // m) * (h // p // m)
    if kind in ("paddleocr", "dots_ocr"):
        return math.ceil(n / (m * m))
    if kind == "cogvlm":
        return n + 2
    if kind == "glm_edge":
        return n // 4 + 2
    if kind == "minicpmv":
        return 64
    return n // (m * m)


# --- reading ----------------------------------------------------------------------------


class _Keys:
    """Typed access to `clip.*` keys: wrong types are a GGUFFormatError naming the key."""

    def __init__(self, md: Mapping[str, Any]) -> None:
        self.md = md

    def integer(self, key: str, default: int = 0) -> int:
        v = self.md.get(key)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, int):
            raise GGUFFormatError(f"{key} must be an integer, got {v!r}")
        if v < 0 or v > 2**31 - 1:
            raise GGUFFormatError(f"{key} is out of range ({v})")
        return v

    def flag(self, key: str) -> bool:
        v = self.md.get(key, False)
        if not isinstance(v, bool):
            raise GGUFFormatError(f"{key} must be a boolean, got {v!r}")
        return v

    def text(self, key: str) -> str:
        v = self.md.get(key)
        if v is None:
            return ""
        if not isinstance(v, str):
            raise GGUFFormatError(f"{key} must be a string, got {v!r}")
        return v.strip().lower()

    def integers(self, key: str) -> tuple[int, ...]:
        v = self.md.get(key)
        if isinstance(v, ArrayInfo) and v.values is not None:
            return tuple(int(x) for x in v.values if isinstance(x, int))
        return ()


def _encoder(
    keys: _Keys, modality: str, kind: str, tensors: tuple[TensorInfo, ...], feature: tuple[int, ...]
) -> EncoderFacts:
    pre = f"clip.{modality}"
    n_layer = keys.integer(f"{pre}.block_count")
    n_embd = keys.integer(f"{pre}.embedding_length")
    if n_embd <= 0:
        raise GGUFFormatError(f"{pre}.embedding_length is missing or zero")
    prefix = "v" if modality == "vision" else "a"
    blocks = [t for t in tensors if (m := _LAYER.match(t.name)) and m.group(1) == prefix]
    run = n_layer
    if modality == "vision" and kind in ("mlp", "mlp_norm", "ldp", "ldpv2") and n_layer:
        run = max(feature) if feature else n_layer - 1
    return EncoderFacts(
        modality=modality,
        projector_type=kind,
        block_count=n_layer,
        layers_run=max(run, 0),
        embedding_length=n_embd,
        feed_forward_length=keys.integer(f"{pre}.feed_forward_length"),
        head_count=keys.integer(f"{pre}.attention.head_count"),
        layer_parameters=sum(t.n_elements for t in blocks),
        layer_bytes=sum(t.n_bytes for t in blocks),
    )


def _output_embedding(tensors: tuple[TensorInfo, ...]) -> int:
    by_name = {t.name: t for t in tensors}
    for name, dim in _OUTPUT_TENSORS:
        t = by_name.get(name)
        if t is not None and len(t.shape) > dim:
            return t.shape[dim]
    return 0


def _types(keys: _Keys) -> tuple[str, str]:
    """(vision type, audio type) as clip.cpp resolves them (load_hparams)."""
    common = keys.text("clip.projector_type")
    vision = common or keys.text("clip.vision.projector_type")
    audio = common or keys.text("clip.audio.projector_type")
    if common == "qwen2.5o":  # legacy mixed file: clip.cpp splits it per modality
        vision, audio = "qwen2.5vl_merger", "qwen2a"
    return vision, audio


def projector_from_gguf(gf: GGUFFile) -> ProjectorFacts:
    """Build ProjectorFacts from a parsed GGUF file; GGUFFormatError when it is not a
    projector (a text model, another architecture) or lacks what the loader needs."""
    arch = gf.metadata.get("general.architecture")
    if arch != CLIP_ARCH:
        raise GGUFFormatError(
            f"not a multimodal projector: general.architecture is {arch!r}, "
            f"expected 'clip' (an mmproj-*.gguf file)"
        )
    keys = _Keys(gf.metadata)
    has_v, has_a = keys.flag("clip.has_vision_encoder"), keys.flag("clip.has_audio_encoder")
    if not (has_v or has_a):
        raise GGUFFormatError(
            "projector has neither a vision nor an audio encoder "
            "(clip.has_vision_encoder / clip.has_audio_encoder)"
        )
    v_kind, a_kind = _types(keys)
    if (has_v and not v_kind) or (has_a and not a_kind):
        raise GGUFFormatError("clip.projector_type is missing")
    feature = keys.integers("clip.vision.feature_layer")
    vision = _encoder(keys, "vision", v_kind, gf.tensors, feature) if has_v else None
    audio = _encoder(keys, "audio", a_kind, gf.tensors, ()) if has_a else None
    image_size = keys.integer("clip.vision.image_size") if has_v else 0
    patch = keys.integer("clip.vision.patch_size") if has_v else 0
    if has_v and patch <= 0:
        raise GGUFFormatError("clip.vision.patch_size is missing or zero")
    if image_size > MAX_IMAGE_SIZE:
        raise GGUFFormatError(f"clip.vision.image_size {image_size} exceeds {MAX_IMAGE_SIZE}")
    merge_key = "clip.vision.projector.scale_factor"
    if v_kind in ("pixtral", "lightonocr", "qwen2vl_merger", "qwen2.5vl_merger"):
        merge_key = "clip.vision.spatial_merge_size"
    n_merge = keys.integer(merge_key, _MERGE_DEFAULTS.get(v_kind, 1)) or 1
    mm = [t for t in gf.tensors if t.name.startswith("mm.")]
    embed = [
        t for t in gf.tensors
        if not t.name.startswith("mm.") and not _LAYER.match(t.name)
    ]
    ft = gf.metadata.get("general.file_type")
    return ProjectorFacts(
        path=gf.path,
        name=str(gf.metadata.get("general.name") or gf.path.stem),
        projector_type=v_kind if has_v else a_kind,
        has_vision=has_v,
        has_audio=has_a,
        vision=vision,
        audio=audio,
        image_size=image_size,
        patch_size=patch,
        n_merge=n_merge,
        has_class_embedding=any(t.name == "v.class_embd" for t in gf.tensors),
        output_embedding=_output_embedding(gf.tensors),
        audio_sample_rate=16000 if has_a and a_kind in _WHISPER_AUDIO else 0,
        n_mel_bins=keys.integer("clip.audio.num_mel_bins") if has_a else 0,
        parameters=sum(t.n_elements for t in gf.tensors),
        weight_bytes=sum(t.n_bytes for t in gf.tensors),
        projector_bytes=sum(t.n_bytes for t in mm),
        projector_parameters=sum(t.n_elements for t in mm),
        embedding_bytes=sum(t.n_bytes for t in embed if t.name.startswith("v.")),
        patch_parameters=sum(
            t.n_elements for t in embed if t.name.startswith("v.patch_embd.weight")
        ),
        size_bytes=gf.file_size,
        file_type=_file_type(ft),
        feature_layers=feature,
    )


def _file_type(code: Any) -> str:
    from inferenceos.model.spec import _file_type_name

    return _file_type_name(code)


def load_projector(path: str | Path) -> ProjectorFacts:
    """Read the mmproj GGUF at `path` (metadata only); errors start with the path."""
    gf = read_gguf(path)
    try:
        return projector_from_gguf(gf)
    except GGUFFormatError as exc:
        raise GGUFFormatError(f"{gf.path}: {exc}") from None
