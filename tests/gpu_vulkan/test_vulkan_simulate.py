"""`simulate` once `hardware` has measured the Vulkan device (hardware/device_speed.py:
its decode read rate and its copy rate from the host, on the built-in model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vulkan_cli import DEVICE, VulkanCli

pytestmark = pytest.mark.gpu_vulkan

N = 32
PREDICT = r"""
import json, sys
from inferenceos.plan.calibration_load import load_calibration
from inferenceos.plan.devices import local_machine
from inferenceos.plan.entry import LoadRequest, plan_load
from inferenceos.plan.model_facts import load_model_facts
from inferenceos.plan.simulate import Workload, predict
machine, facts = local_machine(), load_model_facts(sys.argv[1])
cal = load_calibration(machine, facts, 0)
plan = plan_load(facts, machine, LoadRequest(n_ctx=512, gpu_layers=-1, draft=None), cal)
p = predict(facts, machine, plan, Workload(prompt_tokens=6, output_tokens=int(sys.argv[2]),
                                           n_ctx=512), cal)
print(json.dumps({"decode_tps": p.decode_tps, "plan": plan.summary()}))
"""


def test_simulate_predicts_decode_on_the_measured_device(vk: VulkanCli,
                                                         gemma_path: Path) -> None:
    dev = next(d for d in vk.profile["llama_devices"] if d["name"] == DEVICE)
    assert dev["read_gbps"] > 0 and dev["host_copy_gbps"] > 0, dev
    vk.seed_home(measured=True)
    # measured, lavapipe is slower than the CPU backend: simulate keeps Gemma off it
    sim = json.loads(vk("simulate", str(gemma_path), "--json", "--prompt-tokens", "6",
                        "--output-tokens", str(N), "--ctx", "512").stdout)
    assert not sim["peak_memory_bytes"].get(DEVICE), sim["peak_memory_bytes"]
    # the prediction for every layer on the device, against `run` placed so
    pred = json.loads(vk.python(PREDICT, str(gemma_path), str(N)).stdout.splitlines()[-1])
    assert f"on {DEVICE}" in pred["plan"], pred
    r = vk("run", str(gemma_path), "-p", "The three primary colors are", "-n", str(N),
           "-t", "0", "--json", "--ctx", "512", "--draft", "none", "--ignore-eos",
           "--gpu-layers", "-1")
    measured = json.loads(r.stdout[r.stdout.find("{"):])["metrics"]["decode_tps"]
    ratio = pred["decode_tps"] / measured
    # the 25 % is a speed target, measured on a quiet machine (docs/gpu.md: +15 %
    # here); a test shares the machine with the suite's other processes, and lavapipe's
    # decode beside them ran at half the rate `hardware` had measured (ratio 1.97 in a
    # busy census): what a test can hold is the model's order of magnitude
    assert 1 / 3 <= ratio <= 3, (pred["decode_tps"], measured, dev)
