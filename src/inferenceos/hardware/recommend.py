"""Which llama.cpp backend suits this machine, and which quantizations fit its memory.

Advisory only: the planner makes the real per-model decision. The rules:
  * the GPU vendor with the most memory wins: NVIDIA → cuda, AMD → rocm, Apple → metal,
    discrete Intel → vulkan; an Intel iGPU shares the CPU's memory bandwidth, so decode
    gains nothing from it: cpu;
  * no GPU → cpu;
  * if the llama.cpp build lacks the backend, say so with the exact reinstall line.
The memory budget is the GPU memory of that vendor (or usable RAM for cpu); a model fits
when its weights take at most `WEIGHT_SHARE` of it (the rest is KV cache and buffers).
"""

from __future__ import annotations

from inferenceos.hardware.profile import GpuInfo, LlamaInfo, MemoryInfo, Recommendation
from inferenceos.hardware.vulkan import describe_llama_gpus

WEIGHT_SHARE = 0.8

# Average bits per weight of common GGUF quantizations on llama-style models.
QUANT_BPW: dict[str, float] = {
    "Q3_K_M": 3.91, "Q4_K_M": 4.89, "Q5_K_M": 5.70, "Q6_K": 6.56, "Q8_0": 8.50, "F16": 16.0,
}

BACKEND_CMAKE = {
    "cuda": "-DGGML_CUDA=on", "rocm": "-DGGML_HIP=on", "metal": "-DGGML_METAL=on",
    "vulkan": "-DGGML_VULKAN=on", "sycl": "-DGGML_SYCL=on",
}
# ggml registry names (lower case) that provide each backend.
BACKEND_REGISTRIES = {
    "cuda": {"cuda"}, "rocm": {"rocm", "hip"}, "metal": {"metal", "mtl"},
    "vulkan": {"vulkan"}, "sycl": {"sycl"}, "cpu": {"cpu"},
}
_VENDOR_BACKEND = {"nvidia": "cuda", "amd": "rocm", "apple": "metal", "intel": "vulkan"}


def reinstall_line(backend: str, version: str | None) -> str:
    """The pip command that rebuilds llama-cpp-python with `backend` (and RPC)."""
    pin = f"=={version}" if version else ""
    return (f'CMAKE_ARGS="{BACKEND_CMAKE[backend]} -DGGML_RPC=ON" pip install '
            f"--force-reinstall --no-cache-dir llama-cpp-python{pin}")


def has_backend(llama: LlamaInfo, backend: str) -> bool:
    """Whether the loaded llama.cpp build contains `backend`."""
    names = {b.lower() for b in llama.backends}
    return bool(names & BACKEND_REGISTRIES.get(backend, {backend}))


def recommend(gpus: list[GpuInfo], memory: MemoryInfo, llama: LlamaInfo) -> Recommendation:
    """Pick a backend and list what fits, with the reason in one sentence."""
    backend, vendor_gpus = _pick_backend(gpus)
    if backend == "cpu":
        budget = memory.usable_bytes
        where = "no discrete GPU usable by llama.cpp" if not gpus else \
            "only an integrated Intel GPU, which shares the CPU's memory bandwidth"
        reason = f"{where}; {_gib(budget)} of RAM usable"
        if (seen := describe_llama_gpus(llama)) is not None:  # e.g. lavapipe (vulkan.py)
            reason += f"; {seen}"
    else:
        budget = sum(g.memory_free_bytes or g.memory_total_bytes or 0 for g in vendor_gpus)
        reason = f"{len(vendor_gpus)} {vendor_gpus[0].vendor} GPU(s) with {_gib(budget)} free"
    compiled = has_backend(llama, backend) if llama.loaded else False
    hint = None
    if backend != "cpu" and not compiled:
        hint = reinstall_line(backend, llama.package_version)
        reason += f"; llama.cpp was built without {backend}, so it runs on the CPU until rebuilt"
    quants = fitting_quantizations(budget)
    fits = {str(q["quant"]): q["max_params_b"] for q in quants}
    reason += (f"; Q4_K_M fits models up to ~{fits['Q4_K_M']:g}B parameters, "
               f"Q8_0 up to ~{fits['Q8_0']:g}B")
    return Recommendation(backend=backend, reason=reason, compiled=compiled,
                          reinstall_hint=hint, memory_budget_bytes=budget,
                          quantizations=quants)


def _pick_backend(gpus: list[GpuInfo]) -> tuple[str, list[GpuInfo]]:
    by_vendor: dict[str, list[GpuInfo]] = {}
    for g in gpus:
        if g.vendor in _VENDOR_BACKEND and not (g.vendor == "intel" and g.integrated):
            by_vendor.setdefault(g.vendor, []).append(g)
    if not by_vendor:
        return "cpu", []
    vendor = max(by_vendor, key=lambda v: sum(g.memory_total_bytes or 0 for g in by_vendor[v]))
    return _VENDOR_BACKEND[vendor], by_vendor[vendor]


def fitting_quantizations(budget_bytes: int) -> list[dict[str, float | str]]:
    """For each quantization, the largest model (billions of parameters) that fits."""
    rows: list[dict[str, float | str]] = []
    for quant, bpw in QUANT_BPW.items():
        max_params = budget_bytes * WEIGHT_SHARE / (bpw / 8) / 1e9
        rows.append({"quant": quant, "bits_per_weight": bpw,
                     "max_params_b": round(max_params, 1 if max_params < 10 else 0)})
    return rows


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"
