"""The Vulkan device beside an RPC worker and the CPU in one plan, and MoE experts kept
in RAM while their layers run on the device (llama.cpp's -ot)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from inferenceos.cluster.spawn import free_port, spawn_worker, stop_worker
from tiny_models import write_tiny_model
from vulkan_cli import DEVICE, NO_VULKAN, VulkanCli, buffers, offloaded

pytestmark = pytest.mark.gpu_vulkan


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("vk-cluster")
    return {k: write_tiny_model(d / f"{k}.gguf", k) for k in ("deeper", "moe")}


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[str]:
    """A loopback worker (the CPU build's) offering 3 MiB."""
    port = free_port()
    proc = spawn_worker(port, mem="3MiB", threads=1, log=tmp_path / "worker.log")
    yield f"127.0.0.1:{port}"
    stop_worker(proc)


def _text(r: str) -> str:
    return str(json.loads(r[r.find("{"):])["text"])


def test_one_plan_over_the_device_a_worker_and_the_cpu(vk: VulkanCli, models: dict[str, Path],
                                                       worker: str) -> None:
    """12 layers of ~1 MiB: 4 MiB on the device, 3 on the worker, 10.5 MiB of RAM here
    (tests/cluster_harness.py's sizes): the plan needs all three."""
    args = [str(models["deeper"]), "--raw", "-p", "abc ab", "-n", "8", "-t", "0", "--json",
            "--ctx", "512", "--draft", "none", "--ignore-eos"]
    cpu = _text(vk("run", *args, env=NO_VULKAN).stdout)
    r = vk("run", *args, "-v", "--rpc", worker, "--gpu-memory", "4MiB", "--ram", "10.5MiB")
    plan = next(ln for ln in r.stderr.splitlines() if ln.startswith("plan:"))
    assert f"RPC[{worker}]" in plan and DEVICE in plan, plan
    buf = buffers(r.stderr)
    held = {k.split(":", 1)[1] for k, v in buf.items() if k.startswith("model:") and v > 0}
    assert {"CPU_Mapped", DEVICE, f"RPC0[{worker}]"} <= held, buf
    done, total = offloaded(r.stderr)
    assert 0 < done < total
    assert _text(r.stdout) == cpu


EXPERTS = r"blk\.\d+\.ffn_(gate|up|down)_exps"
MOE = r"""
import json, sys
from pathlib import Path
from inferenceos.engine.llama.lib import log
from inferenceos.engine.sampling import SamplingParams
from inferenceos.engine.scheduler import generate_one
from inferenceos.engine.session import LoadedModel
from inferenceos.plan.llama_params import LlamaParams
mark = log().mark()
over = ((sys.argv[2], "CPU"),) if sys.argv[2] else ()
settings = LlamaParams(n_ctx=256, n_threads=1, n_gpu_layers=99, tensor_buft_overrides=over)
with LoadedModel(Path(sys.argv[1]), settings) as lm:
    out = [e.token for e in generate_one(lm, lm.tokenize("abc"),
                                         SamplingParams(temperature=0, max_tokens=8))]
print(json.dumps({"tokens": out, "log": log().since(mark)}))
"""


def test_experts_kept_in_ram_while_their_layers_run_on_the_device(
        vk: VulkanCli, models: dict[str, Path]) -> None:
    cpu = json.loads(vk.python(MOE, str(models["moe"]), "", env=NO_VULKAN).stdout)
    gpu = json.loads(vk.python(MOE, str(models["moe"]), EXPERTS).stdout)
    log = "\n".join(gpu["log"])
    moved = [ln for ln in gpu["log"] if "buffer type overridden to Vulkan_Host" in ln]
    assert len(moved) == 2 * 3, log  # 2 layers x gate/up/down experts, in host memory
    assert buffers(log).get(f"model:{DEVICE}", 0) > 0
    assert gpu["tokens"] == cpu["tokens"]
