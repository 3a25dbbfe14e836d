"""The multimodal projector in the plan: its memory, where its encoder runs, its time.

A projector (mmproj GGUF, `model/projector.py`) is loaded by llama.cpp's mtmd beside
the text model, on ONE backend (clip.cpp `clip_ctx`): the device named in
`mtmd_context_params.device` when `use_gpu`, else the CPU. It holds:
- its weights (the file's tensors, copied into a backend buffer);
- a compute buffer, reserved at init by a warm-up encode of one image_size² image
  (clip.cpp `warmup` → `reserve_compute_meta`, logged as "<dev> compute buffer size").

`encoder_compute_bytes` models that buffer as the peak of three phases of the ViT graph
(T patches, width h, FFN width f, image side S, patch P, heads n):
- patch embedding: the image (S²·3 f32) and its im2col (T·3P² f16);
- an encoder block: the FFN intermediates and the residual stream, 1.5·T·f + 2·T·h f32;
- without flash attention, the K·Q scores T²·n f32 (+ 4·T·h).
Fitted against llama.cpp's own log on seven generated CLIP projectors (T 16-1024,
h 32-512, f 64-2048; tests/tiny_vlm.py's writer): within -7 %..+9 % with flash attention
(mtmd's default "auto" resolves to on for the CPU and CUDA), -12 %..+4 % without. The
tiny test projector (32 px, T 16) logs 0.02 MiB; the model gives 0.018 MiB.

Placement (`place_projector`): after the text model is placed, the encoder goes to the
first accelerator (the text model's main one first) whose budget still holds its weights
and compute buffer; otherwise to the CPU. `plan/entry.py` re-plans the text model with
less RAM when a CPU projector would not fit beside it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from inferenceos.model.projector import ProjectorFacts
from inferenceos.plan.devices import GPU_RESERVE_FRACTION, Machine
from inferenceos.plan.memory import MemoryEstimate

if TYPE_CHECKING:  # perf imports placement; the projector's time is asked for lazily
    from inferenceos.plan.perf import Calibration

# per encode besides the graph's FLOPs (graph build, input copy): the tiny test projector
# encodes a 32 px image in ~0.13 ms here, nearly all of it this
ENCODE_OVERHEAD_S = 1e-4
# The CPU runs an encoder's matrix products at this fraction of the calibrated prefill
# rate (`Calibration.gemm_gflops_per_thread`, measured on quantized text weights):
# f32 projectors encoded here (1 thread, 64 px image) at 26-52 GFLOP/s against a
# calibrated 158; many small ops (norms, GELU, softmax) between the products add to it.
# Fitted on 576- and 196-patch projectors (predicted/measured 0.93 and 1.18; a 256-patch,
# width-128 one 0.35-0.6 between runs: small products run further below the rate).
# GPUs: not measured (no GPU here); their rated TFLOPS are used as is.
CPU_ENCODER_EFFICIENCY = 0.3
AUDIO_FRAMES = 3000  # whisper's 30 s window of mel frames: what the audio warm-up uses
# the fitted coefficients (see the module docstring)
_FFN_COPIES = 1.5
_RESIDUAL_COPIES = 2
_NO_FA_EXTRA_RESIDUALS = 4


def _vision_compute(pf: ProjectorFacts, flash_attn: bool) -> int:
    v = pf.vision
    if v is None:
        return 0
    side = pf.image_size or 448
    t = pf.n_patches() + (1 if pf.has_class_embedding else 0)
    patch = side * side * 3 * 4 + t * 3 * pf.patch_size**2 * 2
    h, f = v.embedding_length, v.feed_forward_length
    block = int(4 * t * (_FFN_COPIES * f + _RESIDUAL_COPIES * h))
    scores = 0
    if not flash_attn:
        scores = 4 * t * t * max(v.head_count, 1) + 4 * t * h * _NO_FA_EXTRA_RESIDUALS
    return max(patch, block, scores)


def _audio_compute(pf: ProjectorFacts, flash_attn: bool) -> int:
    """A Whisper-style audio tower over a 30 s window: the first conv's input (mel
    frames, f32) and its im2col (kernel 3, f16), or the block model over the frames
    its stride-2 conv leaves. The tiny Ultravox-type test projector (128 mel bins)
    logs 3.66 MiB, all of it the conv phase: the model says the same."""
    a = pf.audio
    if a is None:
        return 0
    t = AUDIO_FRAMES // 2
    n_mel = max(pf.n_mel_bins, 1)
    mel = n_mel * AUDIO_FRAMES * 4 + 3 * n_mel * AUDIO_FRAMES * 2
    h, f = a.embedding_length, a.feed_forward_length
    block = int(4 * t * (_FFN_COPIES * f + _RESIDUAL_COPIES * h))
    scores = 0 if flash_attn else 4 * t * t * max(a.head_count, 1)
    return max(mel, block, scores)


def encoder_compute_bytes(pf: ProjectorFacts, flash_attn: bool = True) -> int:
    """Predicted compute buffer of the projector's encoder(s) (see the module docstring).
    A file with both towers reserves both graphs on the same backend: their maximum."""
    return max(_vision_compute(pf, flash_attn), _audio_compute(pf, flash_attn))


@dataclass(frozen=True)
class ProjectorPlan:
    """Where the projector goes and what it costs there; the engine passes `device`
    (its `llama_name`) to mtmd as `mtmd_context_params.device` with `use_gpu`, or
    `use_gpu = False` for the CPU."""

    path: str
    kind: str
    device: str  # "CPU" or an accelerator's planner name
    llama_name: str  # the ggml backend device name ("CPU", "CUDA0", ...)
    weight_bytes: int
    compute_bytes: int
    tokens_per_image: int
    image_tokens: int  # the image tokens the context was sized for (the request's)
    has_vision: bool
    has_audio: bool
    why: str

    @property
    def bytes(self) -> int:
        return self.weight_bytes + self.compute_bytes

    @property
    def use_gpu(self) -> bool:
        return self.device != "CPU"

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "bytes": self.bytes, "use_gpu": self.use_gpu}


def place_projector(
    pf: ProjectorFacts,
    machine: Machine,
    memory: MemoryEstimate,
    prefer: tuple[str, ...] = (),
    image_tokens: int = 0,
    flash_attn: bool = True,
) -> ProjectorPlan:
    """The device for the encoder after the text model took `memory` (see the module
    docstring): an accelerator with room, `prefer` first, else the CPU."""
    weights, compute = pf.weight_bytes, encoder_compute_bytes(pf, flash_attn)
    need = weights + compute
    order = sorted(machine.accelerators, key=lambda d: (d.name not in prefer, d.is_remote))
    device, llama_name, why = "CPU", machine.cpu.llama_name or "CPU", "no accelerator"
    short = []
    for d in order:
        room = int(d.memory_bytes * (1 - GPU_RESERVE_FRACTION)) - memory.by_device.get(d.name, 0)
        if d.is_remote:
            short.append(f"{d.name} is remote")  # mtmd takes local backends only
            continue
        if room >= need:
            device, llama_name = d.name, d.llama_name or d.name
            why = "fits beside the text model's layers" if d.name in prefer else "has room"
            break
        short.append(f"{d.name} has {max(room, 0)} B left")
    if device == "CPU" and short:
        why = "no accelerator has room (" + "; ".join(short) + ")"
    return ProjectorPlan(
        path=str(pf.path), kind=pf.kind, device=device, llama_name=llama_name,
        weight_bytes=weights, compute_bytes=compute, tokens_per_image=pf.tokens_per_image,
        image_tokens=image_tokens, has_vision=pf.has_vision, has_audio=pf.has_audio, why=why,
    )


def with_projector(memory: MemoryEstimate, pp: ProjectorPlan) -> MemoryEstimate:
    """`memory` with the projector's bytes added on its device (and listed apart)."""
    by_device = dict(memory.by_device)
    by_device[pp.device] = by_device.get(pp.device, 0) + pp.bytes
    return replace(memory, by_device=by_device, projector={pp.device: pp.bytes})


# --- time -------------------------------------------------------------------------------


@dataclass(frozen=True)
class EncoderTime:
    """Predicted encoder time for the request's media: `images` encodes on `device`."""

    seconds: float
    images: int
    device: str
    bottleneck: str
    flops: float

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "seconds": round(self.seconds, 6)}


def encoder_time(
    pf: ProjectorFacts,
    pp: ProjectorPlan,
    machine: Machine,
    image_tokens: int,
    cal: Calibration,
    threads: int = 0,
) -> EncoderTime:
    """Seconds to encode the images behind `image_tokens` tokens: the encoder's FLOPs
    (`ProjectorFacts.encoder_flops`: its matrix products and attention for one image)
    at the device's matrix-matrix rate, as `perf.prefill_cost` rates a ubatch, its
    weights read once per image, plus `ENCODE_OVERHEAD_S` per image (the image's
    preprocessing happens at tokenization, before: not counted). Token counts that are
    not a whole number of images scale linearly."""
    from inferenceos.plan.perf import device_time

    per_image = pf.tokens_per_image
    if image_tokens <= 0 or per_image <= 0:
        return EncoderTime(0.0, 0, pp.device, "none", 0.0)
    images = -(-image_tokens // per_image)
    flops = pf.encoder_flops() * image_tokens / per_image
    dev = next((d for d in machine.devices if d.name == pp.device), machine.cpu)
    effective = flops / CPU_ENCODER_EFFICIENCY if dev.computes_like_cpu else flops
    name, t = device_time(dev, pf.weight_bytes * images, effective, cal, threads, gemm=True)
    return EncoderTime(t + ENCODE_OVERHEAD_S * images, images, pp.device, name, flops)
