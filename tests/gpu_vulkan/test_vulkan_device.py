"""The Vulkan device as llama.cpp enumerates it, the planner's offload to it under a
memory cap, the plan's memory against what llama.cpp allocates there, and greedy output
with layers on the device against the CPU's (docs/gpu.md, "Vulkan on lavapipe").

The CPU reference runs the same binary with every Vulkan device hidden
(GGML_VK_VISIBLE_DEVICES=""): `--backend cpu` keeps the layers on the CPU, but llama.cpp
still offloads a prompt's large matrix products (32 tokens and more) to a GPU it sees.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tiny_models import write_tiny_model
from vulkan_cli import (
    DEVICE,
    MIB,
    NO_VULKAN,
    VulkanCli,
    assert_planned_as_allocated,
    buffers,
    greedy_run,
    offloaded,
    on_device,
    planned_on_device,
)

pytestmark = pytest.mark.gpu_vulkan

@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """f32 tiny models: the CPU's f32 kernels and the device's agree to the token."""
    d = tmp_path_factory.mktemp("vk-tiny")
    return {k: write_tiny_model(d / f"{k}.gguf", k) for k in ("llama", "deep", "wide", "moe")}


def test_hardware_and_doctor_report_the_device(vk: VulkanCli) -> None:
    dev = next(d for d in vk.profile["llama_devices"] if d["name"] == DEVICE)
    assert dev["type"] == "gpu" and dev["backend"] == "Vulkan", dev
    assert dev["memory_total_bytes"] >= 1 << 30 and dev["memory_free_bytes"] > 0, dev
    if "llvmpipe" in dev["description"]:  # lavapipe's maxStorageBufferRange
        assert dev["max_tensor_bytes"] == 128 * MIB, dev
    assert "Vulkan" in vk.profile["llama"]["backends"]
    assert DEVICE in vk.profile["recommendation"]["reason"]
    # the run's measured profile, as `hardware` cached it: the command prints it (a
    # fresh home measured it again, ~40 s on lavapipe beside the suite)
    vk.seed_home(measured=True)
    text = vk("hardware").stdout
    assert DEVICE in text and dev["description"].split(" (")[0] in text
    checks = {c["name"]: c for c in json.loads(vk("doctor", "--json", check=False).stdout)
              ["checks"]}
    assert checks["GPU backend"]["status"] == "pass"
    assert DEVICE in checks["GPU backend"]["detail"], checks["GPU backend"]
    assert "Vulkan" in checks["llama.cpp"]["detail"]


@pytest.mark.parametrize("kind", ["llama", "wide"])
def test_greedy_output_on_the_device_equals_the_cpus(vk: VulkanCli, tiny: dict[str, Path],
                                                   kind: str) -> None:
    cpu, cpu_log = greedy_run(vk, tiny[kind], env=NO_VULKAN)
    assert on_device(buffers(cpu_log)) == 0
    gpu, gpu_log = greedy_run(vk, tiny[kind], "--gpu-layers", "-1")
    done, total = offloaded(gpu_log)
    assert done == total, (done, total)
    buf = buffers(gpu_log)
    # the weights and the KV cache on the device
    assert buf.get(f"model:{DEVICE}", 0) > 0 and buf.get(f"KV:{DEVICE}", 0) > 0, buf
    assert gpu == cpu
    half, half_log = greedy_run(vk, tiny[kind], "--gpu-layers", "1")
    assert offloaded(half_log)[0] == 1 and half == cpu
    # the head on the device, the layers' products offloaded to it (op_offload): its
    # compute buffer sized for them (docs/gpu.md), as planned
    assert_planned_as_allocated(planned_on_device(half_log), on_device(buffers(half_log)))


def test_a_gpu_memory_cap_offloads_part_of_the_model(vk: VulkanCli,
                                                      tiny: dict[str, Path]) -> None:
    """The planner keeps some layers (and the FFN of one: llama.cpp's -ot) in RAM; the
    output is the CPU's."""
    cpu, _ = greedy_run(vk, tiny["wide"], env=NO_VULKAN)
    text, log = greedy_run(vk, tiny["wide"], "--gpu-memory", "12MiB")
    done, total = offloaded(log)
    assert 0 < done < total, (done, total)
    assert "buffer type overridden to Vulkan_Host" in log  # an FFN group kept in RAM
    assert text == cpu


MEMORY = r"""
import json, os, sys
from pathlib import Path
from inferenceos.plan.entry import LoadRequest
from inferenceos.registry.catalog import Catalog
from inferenceos.registry.manager import ModelManager
from inferenceos.registry.store import ModelStore
if __name__ == "__main__":
    cat = Catalog(ModelStore(Path(os.environ["INFERENCEOS_HOME"]) / "mm-models"))
    name = cat.add_file(Path(sys.argv[1])).name
    cap = int(sys.argv[2])
    base = LoadRequest(n_ctx=512, draft=None, **({"gpu_memory": (cap,)} if cap else {}))
    mgr = ModelManager(cat.resolve, base=base, slots=1, context_hint=None)
    plan = mgr.plan_for(name)
    with mgr.acquire(name) as lease:
        buffers = lease.engine.memory_buffers
    mgr.close()
    print(json.dumps({"charge": plan.charge(), "buffers": buffers}))
"""


def _memory(vk: VulkanCli, model: Path, cap: int = 0) -> tuple[float, float]:
    """(MiB the plan charges the device, MiB llama.cpp allocated on it)."""
    d = json.loads(vk.python(MEMORY, str(model), str(cap)).stdout.strip().splitlines()[-1])
    held = sum(v for k, v in d["buffers"].items() if k.split(":", 1)[1] == DEVICE)
    return d["charge"].get(DEVICE, 0) / MIB, held / MIB


def test_the_plans_device_memory_is_what_llama_cpp_allocates(vk: VulkanCli,
                                                             tiny: dict[str, Path]) -> None:
    assert_planned_as_allocated(*_memory(vk, tiny["wide"]))


@pytest.mark.parametrize(("kind", "cap_mib"), [("wide", 12), ("deep", 4)])
def test_a_capped_plan_stays_within_the_cap_and_matches_the_allocation(
        vk: VulkanCli, tiny: dict[str, Path], kind: str, cap_mib: int) -> None:
    """llama.cpp's op_offload would size the device's compute buffer for the CPU
    layers' products (9.25 MiB at 512 tokens for wide): the planner keeps it on only
    where that fits beside the placement, so the cap holds (docs/gpu.md)."""
    planned, allocated = _memory(vk, tiny[kind], cap_mib * MIB)
    assert allocated <= cap_mib, (planned, allocated)
    assert_planned_as_allocated(planned, allocated)


def test_a_multimodal_projector_on_the_device(vk: VulkanCli, tiny_vlm_pair: tuple[Path, Path],
                                              tmp_path: Path) -> None:
    import numpy as np
    from PIL import Image

    model, mmproj = tiny_vlm_pair
    image = tmp_path / "image.png"
    Image.fromarray((np.arange(32 * 32 * 3) % 251).astype("uint8").reshape(32, 32, 3)).save(
        image)
    args = ["--mmproj", str(mmproj), "--image", str(image), "--gpu-layers", "-1"]
    # the chat-templated prompt: with --raw (the image's tokens first) lavapipe 22.3.6
    # crashed in its queue thread (SIGSEGV in libvulkan_lvp.so; docs/gpu.md)
    cpu, cpu_log = greedy_run(vk, model, *args, n=8, raw=False, env=NO_VULKAN)
    gpu, gpu_log = greedy_run(vk, model, *args, n=8, raw=False)
    plan = next(ln for ln in gpu_log.splitlines() if ln.startswith("plan:"))
    assert f"projector mlp on {DEVICE}" in plan, plan
    assert f"CLIP using {DEVICE} backend" in gpu_log
    assert "CLIP using CPU backend" in cpu_log
    assert gpu == cpu
