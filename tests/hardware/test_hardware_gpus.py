"""GPU probes fed with recorded outputs of vendor tools this machine lacks.

Each `*_recording_*` test replays what the real tool printed on a real kind of machine
(fixture files under tests/fixtures/hardware); the `fake_tool` tests put a script of
that name on PATH that prints the recording, so the subprocess path runs for real.
Degraded cases: missing tools, broken output, failing and hanging tools.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from inferenceos.hardware.gpus import detect_gpus
from inferenceos.hardware.gpus.amd import parse_rocm_smi_json
from inferenceos.hardware.gpus.apple import detect_apple, parse_system_profiler_json
from inferenceos.hardware.gpus.intel import detect_intel, parse_xpu_smi_discovery
from inferenceos.hardware.gpus.nvidia import detect_nvidia, parse_nvidia_smi_xml
from inferenceos.hardware.gpus.pci import normalise_bus_id, pcie_gen_from_speed, scan_pci
from inferenceos.hardware.tools import ToolOutput, run_tool

FIX = Path(__file__).parents[1] / "fixtures" / "hardware"
GIB, MIB = 1 << 30, 1 << 20
NO_SYS = Path("/nonexistent-sys")


def replay(recordings: dict[str, str]) -> Callable[[list[str]], ToolOutput]:
    """A runner answering each command whose joined args start with a key with the
    content of that fixture file; any other command is 'not installed'."""
    def run(args: list[str]) -> ToolOutput:
        cmd = " ".join(args)
        for prefix, name in recordings.items():
            if cmd.startswith(prefix):
                return ToolOutput((FIX / name).read_text(), None)
        return ToolOutput(None, f"{args[0]} not found on PATH", missing=True)
    return run


def fake_tool(bindir: Path, name: str, script: str) -> None:
    """Install an executable `name` in `bindir` running the sh `script`."""
    bindir.mkdir(exist_ok=True)
    path = bindir / name
    path.write_text("#!/bin/sh\n" + script + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


NVIDIA = {"nvidia-smi -q -x": "nvidia_smi_q_x_two_gpus.xml",
          "nvidia-smi --query-gpu": "nvidia_smi_compute_cap_two_gpus.csv"}


def test_nvidia_smi_recording_two_gpus() -> None:
    warnings: list[str] = []
    gpus = detect_nvidia([], warnings, replay(NVIDIA), use_nvml=False)
    assert warnings == []
    assert [g.name for g in gpus] == ["NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 3090"]
    a, b = gpus
    assert (a.memory_total_bytes, a.memory_free_bytes) == (24564 * MIB, 24214 * MIB)
    assert (b.memory_total_bytes, b.memory_free_bytes) == (24576 * MIB, 23058 * MIB)
    assert (a.compute, b.compute) == ("8.9", "8.6")
    assert (a.pcie_gen, a.pcie_width, b.pcie_width) == (4, 16, 8)
    assert a.driver_version == "550.54.15" and a.pci_bus_id == "0000:01:00.0"
    assert {g.source for g in gpus} == {"nvidia-smi"} and [g.index for g in gpus] == [0, 1]


def test_nvidia_smi_recording_through_a_fake_tool_on_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_tool(tmp_path / "bin", "nvidia-smi",
              f'case "$1" in -q) cat "{FIX / NVIDIA["nvidia-smi -q -x"]}";; '
              f'*) cat "{FIX / NVIDIA["nvidia-smi --query-gpu"]}";; esac')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    warnings: list[str] = []
    gpus = detect_nvidia([], warnings, use_nvml=False)
    assert len(gpus) == 2 and gpus[1].compute == "8.6" and warnings == []


def test_rocm_smi_recording_two_gpus_with_leading_warning_line() -> None:
    gpus = parse_rocm_smi_json((FIX / "rocm_smi_json_two_gpus.json").read_text())
    assert [g.compute for g in gpus] == ["gfx1100", "gfx1100"]
    assert gpus[0].name.startswith("Navi31 [Radeon RX 7900")
    assert gpus[0].memory_total_bytes == 25753026560
    assert gpus[0].memory_free_bytes == 25753026560 - 1183293440
    assert gpus[1].pci_bus_id == "0000:83:00.0" and gpus[1].driver_version == "6.7.0"


def test_system_profiler_recording_m2_pro_unified_memory() -> None:
    text = (FIX / "system_profiler_displays_m2_pro.json").read_text()
    (gpu,) = parse_system_profiler_json(text, total_ram=32 * GIB, available_ram=20 * GIB)
    assert gpu.vendor == "apple" and gpu.name == "Apple M2 Pro (19-core GPU)"
    assert gpu.integrated and gpu.unified_memory and gpu.compute == "metal3"
    assert gpu.memory_total_bytes == int(32 * GIB * 2 / 3)
    assert gpu.memory_free_bytes == 20 * GIB
    big = parse_system_profiler_json(text, total_ram=64 * GIB, available_ram=60 * GIB)[0]
    assert big.memory_total_bytes == 48 * GIB


def test_system_profiler_recording_via_runner_and_broken_output() -> None:
    warnings: list[str] = []
    runner = replay({"system_profiler": "system_profiler_displays_m2_pro.json"})
    assert len(detect_apple(16 * GIB, 8 * GIB, warnings, runner)) == 1 and warnings == []
    broken = replay({"system_profiler": "nvidia_smi_q_x_two_gpus.xml"})
    assert detect_apple(16 * GIB, 8 * GIB, warnings, broken) == []
    assert "could not read system_profiler output" in warnings[0]


def test_xpu_smi_recording_flex170() -> None:
    runner = replay({"xpu-smi discovery -d 0": "xpu_smi_discovery_d0_flex170.json"})
    (gpu,) = parse_xpu_smi_discovery((FIX / "xpu_smi_discovery_flex170.json").read_text(),
                                     runner)
    assert gpu.name == "Intel(R) Data Center GPU Flex 170"
    assert gpu.memory_total_bytes == 14193102848 and gpu.memory_free_bytes == 14004088832
    assert (gpu.pcie_gen, gpu.pcie_width, gpu.pci_bus_id) == (4, 16, "0000:4d:00.0")
    assert not gpu.integrated and gpu.source == "xpu-smi"


def test_intel_igpu_laptop_sysfs_recording() -> None:
    pci = scan_pci(FIX / "intel_igpu_laptop" / "sys")
    assert [(d.slot, d.vendor, d.driver) for d in pci] == [("0000:00:02.0", "intel", "i915")]
    warnings: list[str] = []
    (gpu,) = detect_intel(pci, 16 * GIB, 10 * GIB, warnings, replay({}))
    assert warnings == []  # no xpu-smi is normal for an iGPU
    assert gpu.integrated and gpu.shared_memory_fraction == 0.5
    assert gpu.memory_total_bytes == 8 * GIB and gpu.memory_free_bytes == 8 * GIB
    assert "46a6" in gpu.name and "i915" in gpu.name


def test_pci_recording_gpus_without_tools_warn_and_use_sysfs() -> None:
    warnings: list[str] = []
    gpus = detect_gpus(64 * GIB, 60 * GIB, warnings, sys_root=FIX / "gpu_box_sysfs" / "sys",
                       runner=replay({}), platform="linux", use_nvml=False)
    by_vendor = {g.vendor: g for g in gpus}
    assert set(by_vendor) == {"nvidia", "amd"}  # the ASPEED BMC VGA is not a GPU
    assert "no driver bound" in by_vendor["nvidia"].name
    assert by_vendor["nvidia"].pcie_gen == 4 and by_vendor["nvidia"].pcie_width == 16
    assert by_vendor["amd"].memory_total_bytes == 25753026560
    assert any("nvidia-smi not found" in w and "0000:01:00.0" in w for w in warnings)
    assert any("rocm-smi not found" in w for w in warnings)


def test_missing_tools_on_a_machine_without_gpus_are_silent() -> None:
    warnings: list[str] = []
    gpus = detect_gpus(8 * GIB, 4 * GIB, warnings, sys_root=NO_SYS, runner=replay({}),
                       platform="linux", use_nvml=False)
    assert gpus == [] and warnings == []


@pytest.mark.parametrize("payload", ["<nvidia_smi_log><gpu>", "not xml at all", "<html/>", ""])
def test_broken_nvidia_smi_output_is_a_warning(payload: str) -> None:
    warnings: list[str] = []
    runner = lambda args: ToolOutput(payload, None)  # noqa: E731
    assert detect_nvidia([], warnings, runner, use_nvml=False) == []
    assert "could not read `nvidia-smi -q -x` output" in warnings[0]


def test_broken_rocm_and_xpu_output_is_a_warning() -> None:
    warnings: list[str] = []
    from inferenceos.hardware.gpus.amd import detect_amd

    truncated = (FIX / "rocm_smi_json_two_gpus.json").read_text()[:300]
    assert detect_amd([], warnings, lambda a: ToolOutput(truncated, None)) == []
    assert detect_intel([], 0, 0, warnings, lambda a: ToolOutput("[1, 2]", None)) == []
    assert "rocm-smi --json" in warnings[0] and "xpu-smi" in warnings[1]
    with pytest.raises(ValueError):
        parse_nvidia_smi_xml("<nvidia_smi_log")


def test_failing_and_hanging_tools_warn_within_the_timeout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_tool(tmp_path / "bin", "nvidia-smi",
              'echo "NVIDIA-SMI has failed because it could not communicate with the '
              'NVIDIA driver." >&2; exit 9')
    fake_tool(tmp_path / "bin", "rocm-smi", "sleep 30 & sleep 30; echo never")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    warnings: list[str] = []
    assert detect_nvidia([], warnings, use_nvml=False) == []
    assert "status 9" in warnings[0] and "could not communicate" in warnings[0]
    start = time.monotonic()
    out = run_tool(["rocm-smi", "--json"], timeout=0.5)
    assert time.monotonic() - start < 5
    assert out.stdout is None and "did not answer within 0.5 s" in (out.problem or "")


def test_bus_id_and_link_speed_helpers() -> None:
    assert normalise_bus_id("00000000:17:00.0") == "0000:17:00.0"
    assert normalise_bus_id("0000:C1:00.0") == "0000:c1:00.0"
    assert pcie_gen_from_speed("16.0 GT/s PCIe") == 4
    assert pcie_gen_from_speed("8.0 GT/s") == 3 and pcie_gen_from_speed("Unknown") is None
