"""What llama.cpp itself sees, and where that disagrees with the vendor tools.

`probe_llama()` runs `llama_probe.py` in a child process (with a timeout) against the
shared libraries that llama-cpp-python installed, and turns its JSON into a `LlamaInfo`.
Finding the libraries does not import `llama_cpp` (that would load them into this
process), so the cheap `lib_signature()` can feed the profile fingerprint.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from inferenceos.hardware.profile import GpuInfo, LlamaDevice, LlamaInfo
from inferenceos.hardware.vulkan import vulkan_environment

PROBE_TIMEOUT_S = 10.0
PROBE_SCRIPT = Path(__file__).with_name("llama_probe.py")  # run by path, stdlib only

# ggml backend registry name (lower case) → the GPU vendors it can drive.
BACKEND_VENDORS: dict[str, tuple[str, ...]] = {
    "cuda": ("nvidia",), "rocm": ("amd",), "hip": ("amd",), "metal": ("apple",),
    "mtl": ("apple",), "sycl": ("intel",), "vulkan": ("nvidia", "amd", "intel", "apple"),
    "opencl": ("intel", "amd", "nvidia"), "musa": ("moore_threads",),
}


def llama_lib_dir() -> Path | None:
    """The `lib` folder of the installed llama_cpp package, found without importing it."""
    try:
        spec = importlib.util.find_spec("llama_cpp")
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    lib = Path(spec.origin).parent / "lib"
    return lib if lib.is_dir() else None


def package_version() -> str | None:
    """Installed llama-cpp-python version, or None."""
    import importlib.metadata  # slow to import; only needed when probing

    try:
        return importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        return None


def lib_signature(lib_dir: Path | None) -> list[tuple[str, int, int]]:
    """(name, size, mtime_ns) of each library file: changes when llama.cpp is rebuilt."""
    if lib_dir is None:
        return []
    sig = []
    for p in sorted(lib_dir.iterdir()):
        if p.is_file() and not p.is_symlink():
            st = p.stat()
            sig.append((p.name, st.st_size, st.st_mtime_ns))
    return sig


def probe_llama(lib_dir: Path | None = None, timeout: float = PROBE_TIMEOUT_S) -> LlamaInfo:
    """Run the ctypes probe in a child; a `LlamaInfo` with `loaded=False` and `error` set
    when the package is missing, a library will not load, or the child crashes or hangs."""
    lib_dir = lib_dir or llama_lib_dir()
    version = package_version()
    if lib_dir is None:
        return LlamaInfo(error="llama-cpp-python is not installed (no llama_cpp/lib found)",
                         package_version=version)
    vulkan_environment(lib_dir)  # lavapipe, where it is the only Vulkan device (vulkan.py)
    cmd = [sys.executable, "-I", str(PROBE_SCRIPT), str(lib_dir)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return LlamaInfo(error=f"llama.cpp probe did not finish within {timeout:g} s",
                         package_version=version, lib_dir=str(lib_dir))
    return parse_probe_output(proc.stdout, proc.returncode, proc.stderr, lib_dir, version)


def parse_probe_output(stdout: str, returncode: int, stderr: str, lib_dir: Path,
                       version: str | None) -> LlamaInfo:
    """Turn the child's output into a LlamaInfo (never raises)."""
    try:
        data = json.loads(stdout.strip().splitlines()[-1]) if stdout.strip() else {}
    except json.JSONDecodeError:
        data = {}
    if returncode != 0 or "error" in data or "devices" not in data:
        why = data.get("error") or _last_line(stderr) or f"exit status {returncode}"
        return LlamaInfo(error=f"llama.cpp library failed to load: {why}",
                         package_version=version, lib_dir=str(lib_dir))
    return LlamaInfo(
        loaded=True, package_version=version, ggml_version=data.get("ggml_version"),
        ggml_commit=data.get("ggml_commit"), lib_dir=str(lib_dir),
        backends=[b for b in data.get("backends", []) if b],
        devices=[LlamaDevice(**d) for d in data["devices"]],
        system_info=(data.get("system_info") or "").strip(" |") or None,
    )


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def gpu_backends(llama: LlamaInfo) -> list[str]:
    """The compiled-in backends that can drive a GPU (lower case)."""
    return [b.lower() for b in llama.backends if b.lower() in BACKEND_VENDORS]


def disagreements(llama: LlamaInfo, gpus: list[GpuInfo]) -> list[str]:
    """Where llama.cpp's device list and the vendor tools tell different stories."""
    if not llama.loaded:
        return []
    notes: list[str] = []
    accel = [d for d in llama.devices if d.type in ("gpu", "igpu")]
    gpus = [g for g in gpus if not (g.vendor == "intel" and g.integrated)]  # CPU is as fast
    vendors = sorted({g.vendor for g in gpus if g.vendor in _VENDOR_BACKEND})
    for vendor in vendors:
        mine = [g for g in gpus if g.vendor == vendor]
        usable = [b for b in gpu_backends(llama) if vendor in BACKEND_VENDORS[b]]
        if not usable:
            notes.append(
                f"llama.cpp: {len(mine)} {vendor} GPU(s) present but llama.cpp has no "
                f"backend for them (compiled in: {', '.join(llama.backends) or 'none'}); "
                f"rebuild llama-cpp-python with the {_VENDOR_BACKEND[vendor]} backend")
            continue
        seen = [d for d in accel if d.backend.lower() in usable]
        if len(seen) < len(mine):
            notes.append(f"llama.cpp: sees {len(seen)} of the {len(mine)} {vendor} GPU(s) "
                         "the vendor tool reports (driver or runtime problem?)")
        notes += _memory_mismatch(mine, seen)
    return notes


def _memory_mismatch(gpus: list[GpuInfo], devices: list[LlamaDevice]) -> list[str]:
    notes = []
    for gpu, dev in zip(gpus, devices, strict=False):
        vendor_total = gpu.memory_total_bytes
        if vendor_total and dev.memory_total_bytes:
            ratio = dev.memory_total_bytes / vendor_total
            if abs(ratio - 1) > 0.05:
                notes.append(f"llama.cpp: {dev.name} reports {dev.memory_total_bytes >> 20} MiB "
                             f"total, {gpu.source} says {vendor_total >> 20} MiB for {gpu.name}")
    return notes


_VENDOR_BACKEND = {"nvidia": "CUDA", "amd": "ROCm/HIP", "apple": "Metal", "intel": "Vulkan"}
