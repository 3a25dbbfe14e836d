"""The one llama-parameters record: what the planner hands the engine.

`LlamaParams` holds every llama_model_params / llama_context_params field we set. The
planner builds it (`Plan.params()`), the engine consumes it (`engine.session` loads a
model and a context from it, `engine.memory_report` measures one), and the registry
charges the plan's memory figures for it. It is a leaf: it imports nothing of ours
except `errors`, so both `plan/` and `engine/` can depend on it without `plan/`
importing `engine/`.

`KV_CACHE_TYPES` is the one table of KV cache types: name → ggml type id (the values
of ggml.h's `enum ggml_type`), used for validation, the memory model's row sizes and the
context parameters.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from inferenceos.errors import UsageError

# ggml.h enum ggml_type ids of the types llama.cpp accepts for the K and V caches
KV_CACHE_TYPES: dict[str, int] = {
    "f32": 0,
    "f16": 1,
    "bf16": 30,
    "q8_0": 8,
    "q5_1": 7,
    "q5_0": 6,
    "q4_1": 3,
    "q4_0": 2,
}
QUANTIZED_KV = frozenset({"q8_0", "q5_1", "q5_0", "q4_1", "q4_0"})


def offloaded_blocks(n_gpu_layers: int, n_layer: int) -> int:
    """The repeating blocks llama.cpp puts on the devices for `n_gpu_layers`. It counts
    the output layer as one more and offloads it first, then the last blocks
    (llama_model's load_tensors: i_gpu_start = n_layer + 1 - n_gpu_layers; checked on
    an RPC worker: 1 moves only the head, 2 the head and the last block)."""
    return max(0, min(n_layer, n_gpu_layers - 1))


def gpu_layers_for(blocks: int, head_offloaded: bool) -> int:
    """The n_gpu_layers that offloads `blocks` blocks (`offloaded_blocks`' inverse). The
    output layer always goes with them: a head meant for the CPU then needs a tensor
    override (plan.Plan.tensor_overrides)."""
    return blocks + 1 if blocks or head_offloaded else 0


@dataclass(frozen=True)
class LlamaParams:
    """How to load a model and size its context.

    `n_ctx` counts all cells of the context (every sequence's); `n_seq_max` sequences
    share them. The engine's `Engine(path, params, n_parallel)` takes `n_ctx` per
    sequence for historical reasons: use `per_sequence()` to hand it a plan's params.
    """

    n_ctx: int = 4096
    n_batch: int = 512
    n_ubatch: int = 512
    n_threads: int = 0  # 0: every core this process may run on
    n_threads_batch: int = 0
    n_gpu_layers: int = 0
    flash_attn: int = -1  # llama_flash_attn_type: -1 auto, 0 off, 1 on
    use_mmap: bool = True  # False: read the weights into anonymous buffers (load mode none)
    # True: llama.cpp's CPU backend may copy weights into its extra buffer types
    # (CPU_REPACK: an anonymous, unreclaimable copy of each Q4_0/Q4_K/IQ4_NL... matmul
    # weight); False keeps every CPU weight in the mapped file, as reclaimable page cache,
    # which is what lets a disk-bound plan stream weights instead of being OOM-killed
    use_extra_bufts: bool = True
    # > 0: weights stream from disk (a disk-bound plan); the engine reads the next
    # layers ahead on a thread and keeps this many bytes of them resident
    # (engine/weights/prefetch.py); 0: the kernel pages them as it likes
    stream_resident_bytes: int = 0
    n_seq_max: int = 1  # parallel sequences sharing the context
    # True: the sequences share one pool of n_ctx cells (attention runs over every
    # sequence's cells, masked); False: each sequence has its own n_ctx / n_seq_max
    # cells and attends over those only, as llama-server --parallel N does
    kv_unified: bool = True
    swa_full: bool = True  # False: sliding-window layers keep only their window of KV
    type_k: str = "f16"
    type_v: str = "f16"
    # (regex on tensor names, llama.cpp device name): e.g. MoE experts kept on the CPU
    tensor_buft_overrides: tuple[tuple[str, str], ...] = ()
    tensor_split: tuple[float, ...] = ()  # share of layers per GPU
    main_gpu: int = 0
    devices: tuple[str, ...] = ()  # llama.cpp device names to use (empty: all)
    # False: llama.cpp computes the products of host-resident weights on the CPU. On
    # (its default), a prompt of 32+ tokens sends them to an accelerator, which a plan
    # that placed nothing there neither expects nor charges (a CPU-only plan on a GPU
    # build: its "CPU only" would not be true, and the device's compute buffer grows)
    op_offload: bool = True

    def validate(self) -> None:
        """Raise UsageError for settings llama.cpp would refuse or misbehave on."""
        for name, value in (("K", self.type_k), ("V", self.type_v)):
            if value not in KV_CACHE_TYPES:
                raise UsageError(
                    f"unknown {name} cache type {value!r} (use {', '.join(KV_CACHE_TYPES)})"
                )
        if self.type_v in QUANTIZED_KV and self.flash_attn == 0:
            raise UsageError("a quantized V cache requires flash attention (flash_attn on or auto)")
        if self.n_ctx < 16 or self.n_batch < 1 or self.n_seq_max < 1:
            raise UsageError("n_ctx must be >= 16 and n_batch, n_seq_max >= 1")
        if self.n_ubatch < 1 or self.n_threads < 0 or self.n_threads_batch < 0:
            raise UsageError("n_ubatch must be >= 1 and thread counts >= 0")

    def per_sequence(self) -> LlamaParams:
        """These params with `n_ctx` per sequence (what `Engine` multiplies back)."""
        return replace(self, n_ctx=max(16, self.n_ctx // max(1, self.n_seq_max)))
