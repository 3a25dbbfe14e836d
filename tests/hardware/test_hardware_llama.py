"""What llama.cpp sees (real ctypes probe of the installed libraries), where it disagrees
with vendor tools (recorded outputs), and the backend recommendation."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from inferenceos.hardware.gpus.amd import parse_rocm_smi_json
from inferenceos.hardware.gpus.apple import parse_system_profiler_json
from inferenceos.hardware.gpus.intel import detect_intel
from inferenceos.hardware.gpus.nvidia import parse_compute_caps, parse_nvidia_smi_xml
from inferenceos.hardware.gpus.pci import scan_pci
from inferenceos.hardware.llama_devices import (
    disagreements,
    llama_lib_dir,
    parse_probe_output,
    probe_llama,
)
from inferenceos.hardware.profile import LlamaDevice, LlamaInfo, MemoryInfo
from inferenceos.hardware.recommend import fitting_quantizations, recommend

FIX = Path(__file__).parents[1] / "fixtures" / "hardware"
GIB = 1 << 30
needs_llama = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                                 reason="llama-cpp-python not installed")
CPU_ONLY = LlamaInfo(loaded=True, package_version="0.3.36", backends=["RPC", "CPU"],
                     devices=[LlamaDevice("CPU", "Xeon", "cpu", "CPU", 64 * GIB, 64 * GIB)])
MEM = MemoryInfo(total_bytes=64 * GIB, available_bytes=60 * GIB, usable_bytes=60 * GIB)


def nvidia_recording() -> list:
    gpus = parse_nvidia_smi_xml((FIX / "nvidia_smi_q_x_two_gpus.xml").read_text())
    assert parse_compute_caps((FIX / "nvidia_smi_compute_cap_two_gpus.csv").read_text())
    return gpus


@needs_llama
def test_llama_devices_list_llama_cpps_cpu_device() -> None:
    info = probe_llama()
    assert info.loaded, info.error
    assert "CPU" in info.backends
    cpu = [d for d in info.devices if d.type == "cpu"]
    assert cpu and cpu[0].backend == "CPU" and cpu[0].memory_total_bytes > 0
    assert info.ggml_version and info.system_info and "CPU" in info.system_info
    assert llama_lib_dir() is not None


def test_probe_without_libraries_is_an_error_not_a_crash(tmp_path: Path) -> None:
    info = probe_llama(lib_dir=tmp_path)
    assert not info.loaded and "ggml-base not found" in (info.error or "")


def test_probe_with_a_corrupt_library_is_an_error_not_a_crash(tmp_path: Path) -> None:
    (tmp_path / "libggml-base.so").write_bytes(b"\x7fELF not really")
    info = probe_llama(lib_dir=tmp_path)
    assert not info.loaded and "failed to load" in (info.error or "")


def test_probe_child_that_crashed_is_reported() -> None:
    info = parse_probe_output("", -11, "Segmentation fault\n", Path("/x"), "0.3.36")
    assert not info.loaded and "Segmentation fault" in (info.error or "")


def test_nvidia_smi_recording_with_cpu_only_llama_build_disagrees_and_recommends_rebuild() -> None:
    gpus = nvidia_recording()
    notes = disagreements(CPU_ONLY, gpus)
    assert len(notes) == 1 and "2 nvidia GPU(s) present but llama.cpp has no backend" in notes[0]
    rec = recommend(gpus, MEM, CPU_ONLY)
    assert rec.backend == "cuda" and not rec.compiled
    assert rec.reinstall_hint == ('CMAKE_ARGS="-DGGML_CUDA=on -DGGML_RPC=ON" pip install '
                                  "--force-reinstall --no-cache-dir llama-cpp-python==0.3.36")
    assert rec.memory_budget_bytes == (24214 + 23058) << 20
    assert "built without cuda" in rec.reason


def test_nvidia_smi_recording_with_cuda_build_flags_missing_gpu_and_memory_mismatch() -> None:
    gpus = nvidia_recording()
    cuda = LlamaInfo(loaded=True, backends=["CUDA", "CPU"], devices=[
        LlamaDevice("CUDA0", "NVIDIA GeForce RTX 4090", "gpu", "CUDA", 12 * GIB, 11 * GIB),
        CPU_ONLY.devices[0]])
    notes = disagreements(cuda, gpus)
    assert any("sees 1 of the 2 nvidia GPU(s)" in n for n in notes)
    assert any("CUDA0 reports 12288 MiB" in n for n in notes)
    assert recommend(gpus, MEM, cuda).compiled


def test_rocm_smi_recording_recommends_rocm() -> None:
    gpus = parse_rocm_smi_json((FIX / "rocm_smi_json_two_gpus.json").read_text())
    rec = recommend(gpus, MEM, CPU_ONLY)
    assert rec.backend == "rocm" and "-DGGML_HIP=on" in (rec.reinstall_hint or "")


def test_system_profiler_recording_recommends_metal() -> None:
    text = (FIX / "system_profiler_displays_m2_pro.json").read_text()
    gpus = parse_system_profiler_json(text, 32 * GIB, 20 * GIB)
    metal = LlamaInfo(loaded=True, backends=["Metal", "BLAS", "CPU"])
    rec = recommend(gpus, MEM, metal)
    assert rec.backend == "metal" and rec.compiled and rec.reinstall_hint is None


def test_intel_igpu_laptop_recording_recommends_cpu() -> None:
    pci = scan_pci(FIX / "intel_igpu_laptop" / "sys")
    gpus = detect_intel(pci, 16 * GIB, 10 * GIB, [], lambda a: _missing(a))
    rec = recommend(gpus, MEM, CPU_ONLY)
    assert rec.backend == "cpu" and "integrated Intel GPU" in rec.reason
    assert disagreements(CPU_ONLY, gpus) == []  # an iGPU llama.cpp ignores is expected


def test_quantization_table_is_monotonic() -> None:
    rows = fitting_quantizations(24 * GIB)
    sizes = [float(r["max_params_b"]) for r in rows]
    assert sizes == sorted(sizes, reverse=True)
    q4 = next(r for r in rows if r["quant"] == "Q4_K_M")
    assert float(q4["max_params_b"]) == 34  # 24 GiB * 0.8 / (4.89 / 8 bytes) = 33.7e9


def _missing(args: list[str]):  # type: ignore[no-untyped-def]
    from inferenceos.hardware.tools import ToolOutput

    return ToolOutput(None, f"{args[0]} not found on PATH", missing=True)
