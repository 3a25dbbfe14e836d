"""Which Vulkan device llama.cpp uses: set in the environment before the library loads.

ggml-vulkan (llama.cpp as vendored in llama-cpp-python 0.3.36, `ggml_vk_instance_init`)
takes every dedicated GPU, else the first non-CPU device, and never a device whose
`deviceType` is `PHYSICAL_DEVICE_TYPE_CPU` unless `GGML_VK_VISIBLE_DEVICES` names it.
On a machine with no GPU the only Vulkan device is Mesa's lavapipe (llvmpipe): a
conformant Vulkan 1.3 device that computes on the CPU. To llama.cpp it is then a GPU
like any other ("Vulkan0", its own buffers, its own memory figure, copies across the
"bus"), which is what lets the GPU path run for real on any machine (docs/gpu.md).

`vulkan_environment` chooses, for a llama.cpp build with the Vulkan backend on a machine
with no GPU device node (/dev/dri/renderD*, /dev/nvidia*, /dev/kfd):
  - `VK_ICD_FILENAMES` = lavapipe's ICD manifest, so device 0 is lavapipe whatever other
    Mesa drivers are installed (their ICDs fail or enumerate nothing without a device);
  - `GGML_VK_VISIBLE_DEVICES=0`, without which ggml-vulkan skips the CPU-type device;
  - `GGML_VK_DISABLE_F16=1`, as llama.cpp's own CI runs lavapipe: llvmpipe's float16 is
    emulated (no faster than f32) and rounds differently from the CPU backend's kernels.
The user's own setting of any of these (or of `VK_DRIVER_FILES`, the newer name of the
ICD list) wins: nothing is set then. `GGML_VK_VISIBLE_DEVICES=""` hides every Vulkan
device. Where a GPU is present nothing is set: ggml-vulkan's own choice stands.
"""

from __future__ import annotations

import glob
import os
from collections.abc import MutableMapping
from pathlib import Path

from inferenceos.hardware.profile import LlamaInfo

USER_KNOBS = ("GGML_VK_VISIBLE_DEVICES", "VK_ICD_FILENAMES", "VK_DRIVER_FILES")
ICD_DIRS = ("/usr/share/vulkan/icd.d", "/usr/local/share/vulkan/icd.d", "/etc/vulkan/icd.d")
GPU_NODES = ("/dev/dri/renderD*", "/dev/nvidia[0-9]*", "/dev/kfd")


def has_vulkan_backend(lib_dir: Path | None) -> bool:
    """Whether the llama.cpp libraries in `lib_dir` include ggml's Vulkan backend."""
    return lib_dir is not None and any(lib_dir.glob("*ggml-vulkan*"))


def lavapipe_icd(dirs: tuple[str, ...] = ICD_DIRS) -> str | None:
    """Path of lavapipe's ICD manifest (lvp_icd.<arch>.json), or None."""
    for d in dirs:
        found = sorted(glob.glob(os.path.join(d, "lvp_icd*.json")))
        if found:
            return found[0]
    return None


def gpu_device_nodes(patterns: tuple[str, ...] = GPU_NODES) -> list[str]:
    """Device nodes a hardware GPU driver creates (DRM render nodes, NVIDIA, AMD KFD)."""
    return sorted(p for pat in patterns for p in glob.glob(pat))


def vulkan_environment(lib_dir: Path | None, environ: MutableMapping[str, str] | None = None,
                       icd: str | None = None, gpu_nodes: list[str] | None = None,
                       ) -> dict[str, str]:
    """Set in `environ` (default: this process's) what lets llama.cpp use lavapipe, when
    the build in `lib_dir` has the Vulkan backend, the machine has no GPU, lavapipe is
    installed and the user set none of USER_KNOBS; returns what was set ({} otherwise).
    Has effect only before ggml-vulkan initialises in the process (or for children
    started with that environment)."""
    env = os.environ if environ is None else environ
    if any(k in env for k in USER_KNOBS) or not has_vulkan_backend(lib_dir):
        return {}
    if gpu_device_nodes() if gpu_nodes is None else gpu_nodes:
        return {}
    icd = icd or lavapipe_icd()
    if icd is None:
        return {}
    chosen = {"VK_ICD_FILENAMES": icd, "GGML_VK_VISIBLE_DEVICES": "0"}
    if "GGML_VK_DISABLE_F16" not in env:
        chosen["GGML_VK_DISABLE_F16"] = "1"
    env.update(chosen)
    return chosen


def is_lavapipe(description: str) -> bool:
    """Whether a Vulkan device's description names Mesa's CPU driver (llvmpipe)."""
    return "llvmpipe" in description.lower() or "lavapipe" in description.lower()


def describe_llama_gpus(llama: LlamaInfo) -> str | None:
    """One sentence naming the GPU devices llama.cpp enumerates (as the planner will
    place layers on them), marking lavapipe as computed by the CPU; None when none."""
    gpus = [d for d in llama.devices if d.type in ("gpu", "igpu")] if llama.loaded else []
    if not gpus:
        return None
    parts = []
    for d in gpus:
        what = f"{d.name} ({d.description}, {d.memory_total_bytes / (1 << 30):.1f} GiB)"
        if is_lavapipe(d.description):
            what += (": Mesa's lavapipe, a Vulkan device computed by this CPU (checks the "
                     "GPU path; no faster than the CPU backend)")
        parts.append(what)
    return "llama.cpp's GPU devices: " + "; ".join(parts)
