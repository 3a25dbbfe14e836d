"""The analytical memory model: the bytes llama.cpp will allocate, per device, predicted
from metadata and settings alone.

Each function mirrors one allocation of llama.cpp (0.3.36's vendored tree; file names
cited so a reader can check them):
- context sizes (`llama-context.cpp`): n_ctx is padded to 256; per-sequence streams;
  n_batch ≤ n_ctx, n_ubatch ≤ n_batch;
- KV cache (`llama-kv-cache.cpp`, `llama-kv-cache-iswa.cpp`): per layer, cells ×
  (row(type_k, n_head_kv·d_k) + row(type_v, n_head_kv·d_v)); SWA layers keep
  pad256(min(n_ctx_seq, n_swa + n_ubatch)) cells unless `swa_full` (llama.cpp's default);
- output buffer (`output_reserve`): n_vocab logits per sequence, f32;
- compute buffer (`sched_reserve`): the peak of the prefill graph for one ubatch,
  modelled by phases (attention, FFN, output head) plus inputs live throughout; the
  per-phase coefficients were fitted against llama.cpp's `no_alloc` dry runs
  (benchmarks/simulate_accuracy.py re-checks them);
- weights (`llama-model.cpp` load_tensors): the file's tensors on the device holding
  them, plus the CPU_REPACK copies llama.cpp makes for some quant types on x86/ARM.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, fields, replace
from typing import Any

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from inferenceos.errors import UsageError
from inferenceos.plan.llama_params import KV_CACHE_TYPES, QUANTIZED_KV, LlamaParams
from inferenceos.plan.model_facts import ModelFacts, TensorFact

MIB = 1024 * 1024
KV_TYPES = tuple(KV_CACHE_TYPES)  # the one table lives with LlamaParams


def pad(n: int, multiple: int) -> int:
    return (n + multiple - 1) // multiple * multiple


def row_bytes(ggml_type: str, n: int) -> int:
    """Bytes of a row of `n` values of `ggml_type` (ggml_row_size): f16 2 B/value, q8_0
    34 B per 32 values, q4_0 18 B per 32."""
    try:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType[ggml_type.upper()]]
    except KeyError:
        raise UsageError(
            f"unknown cache type {ggml_type!r} (one of {', '.join(KV_TYPES)})"
        ) from None
    if n % block:
        raise UsageError(f"cache type {ggml_type} needs rows divisible by {block}, not {n}")
    return n // block * size


@dataclass(frozen=True)
class ContextSettings:
    """What the context is asked for (llama_context_params, the parts that cost memory).

    Contract: a quantized V cache requires `flash_attn` (llama.cpp refuses otherwise);
    `validate()` says so.
    """

    n_ctx: int = 4096
    n_batch: int = 512
    n_ubatch: int = 512
    n_seq: int = 1
    type_k: str = "f16"
    type_v: str = "f16"
    flash_attn: bool = False
    swa_full: bool = True  # llama.cpp's default; False keeps SWA layers at their window
    kv_unified: bool = False

    def validate(self) -> None:
        for t in (self.type_k, self.type_v):
            if t not in KV_TYPES:
                raise UsageError(f"unknown cache type {t!r} (one of {', '.join(KV_TYPES)})")
        if self.type_v in QUANTIZED_KV and not self.flash_attn:
            raise UsageError(
                f"a quantized V cache ({self.type_v}) requires flash attention (llama.cpp)"
            )
        if min(self.n_ctx, self.n_batch, self.n_ubatch, self.n_seq) < 1:
            raise UsageError("n_ctx, n_batch, n_ubatch and n_seq must be positive")

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def llama_params(self, **model: Any) -> LlamaParams:
        """The context part of the one llama-parameters record; `model` adds the
        load fields (threads, n_gpu_layers, use_mmap, placement)."""
        return LlamaParams(
            n_ctx=self.n_ctx,
            n_batch=self.n_batch,
            n_ubatch=self.n_ubatch,
            n_seq_max=self.n_seq,
            kv_unified=self.kv_unified,
            swa_full=self.swa_full,
            type_k=self.type_k,
            type_v=self.type_v,
            flash_attn=1 if self.flash_attn else 0,
            **model,
        )


@dataclass(frozen=True)
class EffectiveContext:
    """The sizes llama.cpp really uses after its padding and clamping."""

    n_ctx: int  # total cells over all sequences
    n_ctx_seq: int  # cells per stream
    n_stream: int
    n_batch: int
    n_ubatch: int


def effective_context(s: ContextSettings) -> EffectiveContext:
    """llama_context's constructor: pad n_ctx to 256, split it per sequence stream."""
    n_ctx = pad(s.n_ctx, 256)
    if s.kv_unified:
        n_ctx_seq, n_stream = n_ctx, 1
    else:
        n_ctx_seq = pad(n_ctx // s.n_seq, 256)
        n_ctx, n_stream = n_ctx_seq * s.n_seq, s.n_seq
    n_batch = min(n_ctx, s.n_batch)
    return EffectiveContext(n_ctx, n_ctx_seq, n_stream, n_batch, min(n_batch, s.n_ubatch))


def kv_cells(facts: ModelFacts, is_swa: bool, s: ContextSettings) -> int:
    """Cells per stream of the cache holding a (SWA or full) layer."""
    e = effective_context(s)
    if not is_swa or s.swa_full:
        return e.n_ctx_seq
    window = facts.spec.sliding_window * (s.n_seq if s.kv_unified else 1)
    return pad(min(e.n_ctx_seq, window + e.n_ubatch), 256)


def kv_layer_bytes(facts: ModelFacts, layer: int, s: ContextSettings) -> int:
    """KV bytes of one layer over all streams (0 for a layer without attention KV)."""
    spec = facts.spec
    ls = spec.layers[layer]
    if ls.head_count_kv <= 0:
        return 0
    cells = kv_cells(facts, ls.is_swa, s) * effective_context(s).n_stream
    k = row_bytes(s.type_k, ls.head_count_kv * spec.key_length)
    v = row_bytes(s.type_v, ls.head_count_kv * spec.value_length)
    return cells * (k + v)


def kv_bytes_per_token(facts: ModelFacts, s: ContextSettings, layers: range | None = None) -> int:
    """KV bytes one more token of context adds (full-size layers; SWA layers add while
    within their window) — what decode reads per cached token."""
    spec = facts.spec
    total = 0
    for i in layers if layers is not None else range(spec.block_count):
        n = spec.layers[i].head_count_kv
        if n > 0:
            total += row_bytes(s.type_k, n * spec.key_length)
            total += row_bytes(s.type_v, n * spec.value_length)
    return total


def output_buffer_bytes(facts: ModelFacts, s: ContextSettings) -> int:
    """llama_context::output_reserve(n_seq_max): f32 logits for one token per sequence."""
    return facts.spec.vocab_size * 4 * s.n_seq


# --- compute buffer ---------------------------------------------------------------------
# Fitted against llama.cpp's `no_alloc` dry runs (see docs/plan.md, "Calibration").
# Each phase is a sum of f32 activation tensors live at once; the allocator reuses
# memory between phases, so the buffer is inputs + the largest phase.


@dataclass(frozen=True)
class ComputeTerms:
    """The pieces of the compute buffer, in bytes, for one ubatch of T tokens.

    `inputs`, `attention`, `ffn` and `output` are the CPU backend's phases; a GPU's
    (`gpu_layer_peak`) differ where ggml-vulkan's measured buffers did (docs/gpu.md)."""

    inputs: int  # attention masks, positions, input embeddings (live through the layers)
    attention: int  # one layer's attention scratch (K·Q without flash attention)
    ffn: int  # one layer's feed-forward intermediates (routed experts for MoE)
    output: int  # logits for T outputs plus the final norm (the masks are freed by then)
    embd: int = 0  # one activation of T tokens (T × n_embd f32): the residual stream

    @property
    def total(self) -> int:
        return max(self.inputs + max(self.attention, self.ffn), self.output)

    def gpu_layer_peak(self, first: bool) -> int:
        """A GPU's layer phase: its FFN keeps _GPU_FFN_RESIDUAL_COPIES of the residual
        stream live at the peak, not the CPU's _FFN_RESIDUAL_COPIES, and it holds the
        input embeddings only if it runs the `first` layer (ggml-vulkan on lavapipe:
        3·ffn + 2·embd + masks with every layer, 3·ffn + embd + masks without the first,
        exact to the 0.01 MiB llama.cpp logs on the tiny models and Qwen2.5-Coder-0.5B)."""
        fewer = (_FFN_RESIDUAL_COPIES - _GPU_FFN_RESIDUAL_COPIES) * self.embd
        inputs = self.inputs - (0 if first else self.embd * _INPUT_EMBD_COPIES)
        return inputs + max(self.attention, self.ffn - fewer)


def compute_terms(facts: ModelFacts, s: ContextSettings) -> ComputeTerms:
    """The compute buffer's parts for the prefill graph llama.cpp reserves (T = n_ubatch
    tokens, every token an output, the KV cache at full size)."""
    spec, e = facts.spec, effective_context(s)
    t = e.n_ubatch
    n_embd, n_head = spec.embedding_length, max(spec.head_count, 1)
    d_k, d_v = spec.key_length, spec.value_length
    caches = [kv_cells(facts, False, s)]
    if any(layer.is_swa for layer in spec.layers):
        caches.append(kv_cells(facts, True, s))
        if all(layer.is_swa for layer in spec.layers):
            caches = caches[1:]
    mask_elem = 2 if s.flash_attn else 4
    inputs = sum(c * t * mask_elem for c in caches) + t * n_embd * 4 * _INPUT_EMBD_COPIES
    n_kv = max(caches)
    qkv = t * 4 * (n_head * d_k + 2 * spec.head_count_kv * d_k)
    if s.flash_attn:
        attention = qkv + t * 4 * n_head * d_v * _FA_OUT_COPIES + t * n_embd * 4
    else:
        attention = qkv + n_kv * t * n_head * 4 * _KQ_COPIES + t * n_embd * 4
    if spec.is_moe:
        n_ff = _expert_ff(facts)
        ffn = t * 4 * (n_ff * spec.expert_used_count * _FFN_COPIES + spec.expert_count * 2)
    else:
        ffn = t * 4 * spec.feed_forward_length * _FFN_COPIES
    ffn += t * n_embd * 4 * _FFN_RESIDUAL_COPIES
    output = t * 4 * (spec.vocab_size + 2 * n_embd)
    return ComputeTerms(inputs=inputs, attention=attention, ffn=ffn, output=output,
                        embd=t * n_embd * 4)


# Copies of each activation live at the phase peak (from the graph and the dry runs).
_KQ_COPIES = 1  # soft_max runs in place on K·Q
_FA_OUT_COPIES = 2
# gate, up and their GLU product live together: ggml's GLU op is not one ggml-alloc runs
# in place (ggml_op_can_inplace), so the peak holds three (the tiny f32 models, whose
# FFN is their largest phase: CPU 8.51 MiB measured at 512 tokens where two copies
# predicted 6.0; docs/gpu.md)
_FFN_COPIES = 3
_FFN_RESIDUAL_COPIES = 3  # the CPU's: the layer input, its norm and more (measured)
_GPU_FFN_RESIDUAL_COPIES = 1  # ggml-vulkan's (its graph_optimize reorders the nodes)
_INPUT_EMBD_COPIES = 1


def _expert_ff(facts: ModelFacts) -> int:
    """Expert FFN width: from ffn_up_exps rows (ne[1]) when the table has it."""
    for t in facts.tensors:
        if t.role == "expert" and "up_exps" in t.name:
            return t.rows
    return facts.spec.feed_forward_length


def compute_buffer_bytes(facts: ModelFacts, s: ContextSettings) -> int:
    """Predicted size of the CPU compute buffer for a CPU-only load."""
    return compute_terms(facts, s).total


# --- weights ----------------------------------------------------------------------------

# ggml-cpu/repack.cpp: ggml_repack_get_optimal_repack_type. A weight used by a matrix
# product is copied into CPU_REPACK when its type has an interleaved kernel for the
# CPU's ISA and ne[1] divides by the interleave. (type, required isa, row multiple)
_REPACK_RULES: tuple[tuple[str, tuple[str, ...], int], ...] = (
    ("q4_0", ("avx2",), 8),
    ("q4_0", ("neon", "i8mm"), 4),
    ("q4_0", ("neon", "dotprod"), 4),
    ("q4_k", ("avx2",), 8),
    ("q4_k", ("neon", "i8mm"), 8),
    ("q4_k", ("neon", "dotprod"), 8),
    ("q2_k", ("avx512f",), 8),
    ("q5_k", ("neon", "dotprod"), 8),
    ("q6_k", ("neon", "dotprod"), 8),
    ("iq4_nl", ("avx2",), 8),
    ("iq4_nl", ("neon", "dotprod"), 4),
    ("mxfp4", ("avx2",), 8),
    ("mxfp4", ("neon", "dotprod"), 4),
    ("q8_0", ("neon", "dotprod"), 4),
)
# Tensors read by get_rows (not a matrix product) are never repacked.
_NOT_MATMUL = ("token_embd", "per_layer_token_embd")


def repacked(ggml_type: str, rows: int, n_dims: int, isa: tuple[str, ...]) -> bool:
    """Whether llama.cpp's CPU backend keeps a repacked copy of this weight."""
    if n_dims not in (2, 3):
        return False
    have = set(isa)
    return any(
        t == ggml_type and set(need) <= have and rows % mult == 0 for t, need, mult in _REPACK_RULES
    )


@dataclass(frozen=True)
class WeightBuffers:
    """Weight bytes per device name; `repack` is the extra CPU_REPACK copy (RAM)."""

    per_device: dict[str, int]
    repack: int
    mapped: int  # bytes llama.cpp maps from the file for the CPU (RAM or page cache)


@dataclass(frozen=True)
class MemoryEstimate:
    """Predicted bytes per device and per purpose; the preflight compares these with
    each device's budget. `by_device[name]` sums weights, KV, compute and output there."""

    weights: dict[str, int]
    repack: int
    kv: dict[str, int]
    compute: dict[str, int]
    output: int
    overhead: int
    context: EffectiveContext
    by_device: dict[str, int] = field(default_factory=dict)
    # a multimodal projector's weights + encoder compute buffer, by device (plan/projector.py);
    # already included in by_device
    projector: dict[str, int] = field(default_factory=dict)
    # LoRA adapters' tensors, by device (plan/adapters.py); already included in by_device
    adapters: dict[str, int] = field(default_factory=dict)
    # llama.cpp's op_offload for the load: a prompt's products of CPU-resident weights
    # computed on the first GPU (footprint.estimate decides; its compute is in `compute`)
    op_offload: bool = True

    @property
    def total(self) -> int:
        return sum(self.by_device.values())

    @property
    def rss(self) -> int:
        """Predicted resident set right after a CPU load: the budgeted bytes plus the
        mmap'd source pages of repacked weights (read once, reclaimable)."""
        return self.by_device.get("CPU", 0) + self.repack

    @property
    def anonymous(self) -> int:
        """CPU bytes held as anonymous memory, which the kernel cannot reclaim without
        swap: the CPU_REPACK copies, the CPU's KV cache and compute buffer, the logits
        buffer and the process overhead. Under a memory limit this part must fit, or the
        process is OOM-killed."""
        return self.by_device.get("CPU", 0) - self.mapped

    @property
    def mapped(self) -> int:
        """CPU weight bytes llama.cpp reads through its mapping of the file (page cache:
        reclaimable, re-read from disk when evicted). A repacked weight's source pages
        are read once at load and then left alone, so they are not counted."""
        return max(0, self.weights.get("CPU", 0) - self.repack)

    def tiers(self, ram: int) -> dict[str, int]:
        """Where the CPU's bytes live with `ram` bytes of memory (a cgroup limit):
        "anonymous" (must fit), "page cache" (the mapped weights the rest of `ram` keeps)
        and "disk" (mapped weights that do not fit, re-read while decoding)."""
        room = max(0, ram - self.anonymous)
        cached = min(self.mapped, room)
        return {"anonymous": self.anonymous, "page cache": cached, "disk": self.mapped - cached}

    @property
    def llama_model_buffers(self) -> int:
        """What llama.cpp logs as model buffers on the CPU: the mapped file range plus
        the CPU_REPACK buffer."""
        return self.weights.get("CPU", 0) + self.repack

    def to_json(self) -> dict[str, Any]:
        """The fields (the context as its n_ctx and n_ubatch) and the derived totals."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "context"}
        return {**out, "total": self.total, "anonymous": self.anonymous,
                "mapped": self.mapped, "n_ctx": self.context.n_ctx,
                "n_ubatch": self.context.n_ubatch}


def with_adapters(memory: MemoryEstimate, by_device: dict[str, int]) -> MemoryEstimate:
    """`memory` with LoRA adapters' bytes added where they live (and listed apart);
    adapters already charged are replaced, not added twice."""
    total = dict(memory.by_device)
    for dev, n in memory.adapters.items():
        total[dev] = total.get(dev, 0) - n
    for dev, n in by_device.items():
        total[dev] = total.get(dev, 0) + n
    return replace(memory, by_device=total, adapters=dict(by_device))


def with_settings(s: ContextSettings, **changes: Any) -> ContextSettings:
    return replace(s, **changes)


# Resident memory a load adds beyond llama.cpp's buffers (mostly the vocabulary's C++
# tables), fitted to RSS growth across loads of the tiny models (287 tokens: +1.6 MiB)
# and Gemma 3 (262144 tokens: +43 MiB); see docs/plan.md "Calibration". The library's
# own one-time cost (~40 MiB on first import) is not per load and not counted.
OVERHEAD_FIXED = 3 * MIB // 2
OVERHEAD_PER_VOCAB_TOKEN = 168


def repack_bytes(cpu_tensors: Iterable[TensorFact], isa: tuple[str, ...]) -> int:
    """Bytes llama.cpp copies into CPU_REPACK for these CPU-resident weights (only those
    used by matrix products: never token_embd, read by get_rows)."""
    return sum(
        t.n_bytes
        for t in cpu_tensors
        if not t.name.startswith(_NOT_MATMUL) and repacked(t.ggml_type, t.rows, t.n_dims, isa)
    )


def process_overhead(facts: ModelFacts) -> int:
    return OVERHEAD_FIXED + OVERHEAD_PER_VOCAB_TOKEN * facts.spec.vocab_size
