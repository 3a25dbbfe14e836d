"""The projector in the planner (plan/projector.py, plan/entry.py) and in `simulate`.

The compute-buffer model is checked against llama.cpp's own figure: mtmd logs
"<dev> compute buffer size = X MiB" when it reserves the encoder's graph at init.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from cli_helpers import run_cli
from inferenceos.model.projector import ProjectorFacts, load_projector
from inferenceos.plan.entry import LoadRequest, plan_load
from inferenceos.plan.model_facts import load_model_facts
from inferenceos.plan.perf import Calibration
from inferenceos.plan.preflight import PlanRefused
from inferenceos.plan.projector import encoder_compute_bytes, encoder_time
from inferenceos.plan.simulate import Workload, predict
from plan_factories import GiB, machine, make_facts
from tiny_vlm import TinyProjector, tiny_audio, tiny_vlm, write_tiny_mmproj

MiB = 1024 * 1024
CAL = Calibration.default()

_LOAD = r"""
import sys, llama_cpp as L
from llama_cpp import mtmd_cpp as M
L.llama_backend_init()
m = L.llama_model_load_from_file(sys.argv[1].encode(), L.llama_model_default_params())
cp = M.mtmd_context_params_default(); cp.use_gpu = False; cp.n_threads = 1
assert M.mtmd_init_from_file(sys.argv[2].encode(), m, cp)
"""


@pytest.fixture(scope="module")
def pair(tiny_dir: Path) -> tuple[Path, Path]:
    return tiny_vlm(tiny_dir)


def _llama_compute_mib(model: Path, mmproj: Path) -> float:
    r = subprocess.run(
        [sys.executable, "-c", _LOAD, str(model), str(mmproj)],
        capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    found = re.findall(r"CPU compute buffer size = +([\d.]+) MiB", r.stdout + r.stderr)
    assert found, "mtmd logged no compute buffer size"
    return float(found[-1])


@pytest.mark.parametrize(
    "shape",
    [
        TinyProjector(),  # 32 px, 16 patches
        TinyProjector(image_size=224, patch_size=14, n_embd=128, n_ff=512),  # 256 patches
        TinyProjector(image_size=336, patch_size=14, n_embd=64, n_ff=1024),  # 576, wide FFN
    ],
    ids=["tiny", "224px", "336px"],
)
def test_compute_buffer_estimate_matches_llama_cpp(
    shape: TinyProjector, pair: tuple[Path, Path], tmp_path: Path
) -> None:
    path = write_tiny_mmproj(tmp_path / "mmproj.gguf", shape)
    measured = _llama_compute_mib(pair[0], path)
    predicted = encoder_compute_bytes(load_projector(path)) / MiB
    # llama.cpp prints two decimals: allow that rounding on the tiny one
    assert abs(predicted - measured) <= max(0.12 * measured, 0.006), (predicted, measured)


def test_audio_compute_buffer_estimate_matches_llama_cpp(tiny_dir: Path) -> None:
    model, mmproj = tiny_audio(tiny_dir)
    measured = _llama_compute_mib(model, mmproj)
    predicted = encoder_compute_bytes(load_projector(mmproj)) / MiB
    assert abs(predicted - measured) <= 0.12 * measured, (predicted, measured)


def _big(pf: ProjectorFacts) -> ProjectorFacts:
    """The tiny facts scaled to a LLaVA-1.5-sized projector (CLIP ViT-L/14 at 336 px)."""
    assert pf.vision is not None
    vision = replace(pf.vision, block_count=24, layers_run=23, embedding_length=1024,
                     feed_forward_length=4096, head_count=16,
                     layer_parameters=24 * 12_600_000, layer_bytes=24 * 25_200_000)
    return replace(pf, vision=vision, image_size=336, patch_size=14, weight_bytes=600 * MiB,
                   projector_parameters=21_000_000, patch_parameters=602_112)


def test_cpu_only_projector_adds_its_bytes_to_the_cpu(pair: tuple[Path, Path]) -> None:
    model, mmproj = pair
    facts = load_model_facts(model)
    m = machine(ram=8 * GiB)
    text = plan_load(facts, m, LoadRequest())
    vlm = plan_load(facts, m, LoadRequest(mmproj=mmproj))
    pp = vlm.projector
    assert pp is not None and pp.device == "CPU" and not pp.use_gpu
    assert pp.weight_bytes == load_projector(mmproj).weight_bytes
    assert pp.compute_bytes == encoder_compute_bytes(load_projector(mmproj)) > 0
    assert vlm.memory.by_device["CPU"] == text.memory.by_device["CPU"] + pp.bytes
    assert vlm.memory.projector == {"CPU": pp.bytes}
    assert vlm.to_json()["projector"]["device"] == "CPU"
    assert "projector mlp on CPU" in vlm.summary()


def test_plan_for_run_takes_the_projector(pair: tuple[Path, Path]) -> None:
    from inferenceos.plan.simulate import plan_for_run

    model, mmproj = pair
    plan = plan_for_run(load_model_facts(model), machine(), mmproj=mmproj)
    assert plan.projector is not None and plan.projector.path == str(mmproj)
    assert plan_for_run(load_model_facts(model), machine()).projector is None


def test_encoder_goes_to_a_gpu_with_room_else_the_cpu(pair: tuple[Path, Path]) -> None:
    facts = make_facts(n_layer=8, n_embd=1024, n_ff=4096, n_head=16, n_head_kv=4)
    pf = _big(load_projector(pair[1]))
    roomy = plan_load(facts, machine(ram=32 * GiB, gpus=(24 * GiB,)), LoadRequest(mmproj=pf))
    pp = roomy.projector
    assert pp is not None and pp.device == "GPU0" and pp.llama_name == "GPU0" and pp.use_gpu
    text = plan_load(facts, machine(ram=32 * GiB, gpus=(24 * GiB,)), LoadRequest())
    assert roomy.memory.by_device["GPU0"] == text.memory.by_device["GPU0"] + pp.bytes
    assert roomy.memory.by_device["CPU"] == text.memory.by_device["CPU"]
    # a GPU just big enough for the text model: the encoder sits on the CPU instead
    need = text.memory.by_device["GPU0"]
    tight = plan_load(facts, machine(ram=32 * GiB, gpus=(need / 0.95 + MiB,)),
                      LoadRequest(mmproj=pf))
    assert tight.projector is not None and tight.projector.device == "CPU"
    assert tight.placement.gpu_layers == text.placement.gpu_layers  # the text stays on GPU
    assert "no accelerator has room" in tight.projector.why


def test_a_cpu_projector_that_does_not_fit_shrinks_the_text_plan(pair: tuple[Path, Path]) -> None:
    facts = make_facts(n_layer=32, n_embd=1024, n_ff=4096, n_head=16, n_head_kv=4)
    pf = _big(load_projector(pair[1]))
    req = LoadRequest(need_tokens=32768)  # 1 GiB of f16 KV: q8_0 frees ~470 MiB
    text = plan_load(facts, machine(ram=8 * GiB), req)
    budget = text.memory.by_device["CPU"] + 300 * MiB  # not enough for 600 MiB of weights
    m = machine(ram=budget)
    assert plan_load(facts, m, req).ctx.n_ctx == text.ctx.n_ctx
    vlm = plan_load(facts, m, replace(req, mmproj=pf))
    assert vlm.projector is not None and vlm.projector.device == "CPU"
    assert vlm.memory.by_device["CPU"] <= budget
    # the request needs 32768 tokens: the KV cache's precision gives, never the context
    assert vlm.ctx.n_ctx == text.ctx.n_ctx and vlm.ctx.type_k != text.ctx.type_k
    assert any("RAM kept for the projector" in ch.what for ch in vlm.changes)
    assert vlm.budgets["CPU"] == budget
    with pytest.raises(PlanRefused, match=r"projector .* needs"):
        plan_load(facts, machine(ram=200 * MiB), LoadRequest(mmproj=pf))


def test_image_tokens_count_against_the_context(pair: tuple[Path, Path]) -> None:
    model, mmproj = pair
    facts = load_model_facts(model)  # trained on 512 tokens
    ok = plan_load(facts, machine(), LoadRequest(prompt_tokens=100, image_tokens=400,
                                                 mmproj=mmproj))
    assert ok.projector is not None and ok.projector.image_tokens == 400
    with pytest.raises(PlanRefused, match=r"100 text tokens and 420 image tokens .* 512"):
        plan_load(facts, machine(), LoadRequest(prompt_tokens=100, image_tokens=420))


def test_more_image_tokens_take_longer(pair: tuple[Path, Path]) -> None:
    model, mmproj = pair
    facts = load_model_facts(model)
    m = machine()
    plan = plan_load(facts, m, LoadRequest(mmproj=mmproj))
    pf = load_projector(mmproj)
    assert plan.projector is not None
    times = [encoder_time(pf, plan.projector, m, n, CAL) for n in (16, 32, 160)]
    assert [t.images for t in times] == [1, 2, 10]
    assert times[0].seconds < times[1].seconds < times[2].seconds
    ttft = [predict(facts, m, plan, Workload(prompt_tokens=20, output_tokens=4,
                                              image_tokens=n), CAL).ttft_s
            for n in (0, 16, 160)]
    assert ttft[0] < ttft[1] < ttft[2]
    big = _big(pf)
    assert encoder_time(big, plan.projector, m, 576, CAL).seconds > times[2].seconds


def test_simulate_cli_image_tokens(pair: tuple[Path, Path], tiny_llama: Path) -> None:
    model, mmproj = pair
    base = ["simulate", str(model), "--prompt-tokens", "20", "--output-tokens", "8", "--json",
            "--threads", "1"]
    runs = {n: json.loads(run_cli(*base, "--image-tokens", str(n)).stdout) for n in (16, 64)}
    for data in runs.values():  # found beside the model
        assert data["plan"]["projector"]["kind"] == "mlp"
        assert data["workload"]["image_tokens"] in (16, 64)
    assert runs[16]["encoder"]["images"] == 1 and runs[64]["encoder"]["images"] == 4
    assert runs[64]["encoder"]["seconds"] > runs[16]["encoder"]["seconds"]
    # each run's TTFT is the prefill of text and image tokens, the encoder and a step's
    # overhead; comparing the two runs' TTFTs would compare two machine loads (the
    # prediction follows the free cores: a parallel suite once gave 0.0045 < 0.0048)
    for n, data in runs.items():
        prefill_s = (20 + n) / data["prefill_tps"]
        parts = prefill_s + data["encoder"]["seconds"] + data["calibration"]["token_overhead_s"]
        assert data["ttft_s"] == pytest.approx(parts, rel=0.02, abs=1e-4), (n, data["ttft_s"])
    none = json.loads(run_cli(*base, "--image-tokens", "16", "--mmproj", "none").stdout)
    assert none["plan"]["projector"] is None and none["encoder"] is None
    named = json.loads(run_cli("simulate", str(tiny_llama), "--json", "--mmproj", str(mmproj),
                               "--image-tokens", "16", "--prompt-tokens", "20").stdout)
    assert named["plan"]["projector"]["path"] == str(mmproj)
    r = run_cli("simulate", str(model), "--ctx", "256", "--prompt-tokens", "100",
                "--image-tokens", "200")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "200 image tokens does not fit a context of 256" in " ".join(r.stderr.split())
    r = run_cli("simulate", str(model), "--image-tokens", "16", "--mmproj", str(model))
    assert r.returncode != 0 and "not a multimodal projector" in r.stderr
    table = run_cli("simulate", str(model), "--image-tokens", "32", "--prompt-tokens", "20",
                    COLUMNS="200")
    assert table.returncode == 0, table.stderr
    assert "+ 32 image tokens" in table.stdout and "for 2 images" in table.stdout
