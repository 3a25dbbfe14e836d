"""Several models in one memory budget with the Vulkan device (docs/registry.md, the
tiers): the real manager and engines, three tiny models of ~32 MiB, a total cap that
holds one hot and one warm. A model going warm keeps its weights on the device (its
context freed); a warm one wakes without a reload; the least recently used goes cold.
With the device capped to one model and that model in use, the next goes beside it in
RAM: one on the device, one in RAM, in one budget."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tiny_models import write_tiny_model
from vulkan_cli import DEVICE, MIB, NO_VULKAN, VulkanCli

pytestmark = pytest.mark.gpu_vulkan

POOL = r"""
import json, os, sys
from pathlib import Path
from inferenceos.engine.sampling import SamplingParams
from inferenceos.plan.entry import LoadRequest
from inferenceos.registry.budget import MemoryBudget
from inferenceos.registry.catalog import Catalog
from inferenceos.registry.manager import ModelManager
from inferenceos.registry.store import ModelStore
if __name__ == "__main__":
    cat = Catalog(ModelStore(Path(os.environ["INFERENCEOS_HOME"]) / "pool-models"))
    a, b, c = [cat.add_file(Path(p)).name for p in sys.argv[1:4]]
    mgr = ModelManager(cat.resolve, budget=MemoryBudget(total_cap=int(sys.argv[4])),
                       base=LoadRequest(n_ctx=512, draft=None), context_hint=None)
    steps = []
    for n in (a, b, a, c):
        with mgr.acquire(n) as lease:
            toks = [e.token for e in lease.engine.generate("abc ab", SamplingParams(
                temperature=0, max_tokens=6, ignore_eos=True))]
            steps.append({"model": n, "woke": lease.woke, "fresh": lease.fresh,
                          "tokens": toks, "loaded": {lm.model.name: [lm.tier, lm.charge]
                                                     for lm in mgr.loaded()}})
    mgr.close()
    print(json.dumps(steps))
"""
CAP = 60 * MIB  # one hot wide model (~32 MiB) and one warm (~25 MiB)


def _pool(vk: VulkanCli, models: list[Path], env: dict[str, str] | None = None
          ) -> list[dict[str, Any]]:
    r = vk.python(POOL, *map(str, models), str(CAP), env=env)
    return list(json.loads(r.stdout.strip().splitlines()[-1]))


def test_hot_warm_and_cold_models_on_the_device_in_one_budget(
        vk: VulkanCli, tmp_path: Path) -> None:
    models = [write_tiny_model(tmp_path / f"{n}.gguf", "wide", seed=i)
              for i, n in enumerate("abc")]
    steps = _pool(vk, models)
    tiers = [{n.split(":")[0]: t for n, (t, _) in s["loaded"].items()} for s in steps]
    assert tiers == [{"a": "hot"}, {"a": "warm", "b": "hot"}, {"a": "hot", "b": "warm"},
                     {"a": "warm", "c": "hot"}], tiers
    assert steps[2]["woke"] and not steps[2]["fresh"]  # a woke from warm: no reload
    for s in steps:
        charges = [c for _, c in s["loaded"].values()]
        assert sum(sum(c.values()) for c in charges) <= CAP
        # hot and warm alike hold their weights on the device
        assert all(c.get(DEVICE, 0) > 0 for c in charges), s
    cpu = _pool(vk, models, env=NO_VULKAN)
    assert [s["tokens"] for s in steps] == [s["tokens"] for s in cpu]


BESIDE = r"""
import json, os, sys
from pathlib import Path
from inferenceos.engine.sampling import SamplingParams
from inferenceos.plan.entry import LoadRequest
from inferenceos.registry.budget import MemoryBudget
from inferenceos.registry.catalog import Catalog
from inferenceos.registry.manager import ModelManager
from inferenceos.registry.store import ModelStore
if __name__ == "__main__":
    cat = Catalog(ModelStore(Path(os.environ["INFERENCEOS_HOME"]) / "beside-models"))
    a, b = [cat.add_file(Path(p)).name for p in sys.argv[1:3]]
    budget = MemoryBudget()
    budget.set_cap(sys.argv[3], int(sys.argv[4]))
    mgr = ModelManager(cat.resolve, budget=budget, base=LoadRequest(n_ctx=512, draft=None),
                       context_hint=None)
    sampling = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    with mgr.acquire(a) as first, mgr.acquire(b) as second:  # a in use while b loads
        out = {n: [e.token for e in lease.engine.generate("abc ab", sampling)]
               for n, lease in ((a, first), (b, second))}
        charges = {lm.model.name: lm.charge for lm in mgr.loaded()}
    mgr.close()
    print(json.dumps({"tokens": list(out.values()), "charges": list(charges.values())}))
"""
DEVICE_CAP = 40 * MIB  # one wide model on the device (31.8 MiB), not two


def test_a_model_in_use_keeps_the_device_and_the_next_goes_beside_it_in_ram(
        vk: VulkanCli, tmp_path: Path) -> None:
    models = [str(write_tiny_model(tmp_path / f"{n}.gguf", "wide", seed=i))
              for i, n in enumerate("ab")]
    got = json.loads(vk.python(BESIDE, *models, DEVICE, str(DEVICE_CAP)).stdout
                     .strip().splitlines()[-1])
    first, second = got["charges"]
    assert first.get(DEVICE, 0) > 0, got  # the first on the device
    assert first.get(DEVICE, 0) + second.get(DEVICE, 0) <= DEVICE_CAP, got
    assert second.get("CPU", 0) > first.get("CPU", 0), got  # the second's layers in RAM
    cpu = json.loads(vk.python(BESIDE, *models, DEVICE, str(DEVICE_CAP), env=NO_VULKAN)
                     .stdout.strip().splitlines()[-1])
    assert got["tokens"] == cpu["tokens"]
