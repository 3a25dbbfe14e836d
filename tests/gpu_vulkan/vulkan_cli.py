"""What tests/gpu_vulkan/ shares: the Vulkan venv's CLI in a home holding this process's
hardware profile, and readers of llama.cpp's load log (buffers, offloaded layers)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv-vulkan"
CLI = VENV / "bin" / "inferenceos"
PYTHON = VENV / "bin" / "python"
DEVICE = "Vulkan0"
MIB = 1 << 20
# what hides every Vulkan device from llama.cpp (hardware/vulkan.py): the CPU reference
NO_VULKAN = {"GGML_VK_VISIBLE_DEVICES": ""}


def _lib_dir() -> Path | None:
    found = sorted(VENV.glob("lib/python3*/site-packages/llama_cpp/lib"))
    return found[0] if found else None


def vulkan_missing() -> str | None:
    """Why the group cannot run here, or None."""
    if not CLI.is_file():
        return (f"{VENV.name} is absent: `make install-vulkan` builds llama.cpp with its "
                "Vulkan backend there (docs/gpu.md)")
    lib = _lib_dir()
    if lib is None or not any(lib.glob("libggml-vulkan*")):
        return f"{VENV.name}'s llama.cpp has no Vulkan backend: rerun `make install-vulkan`"
    return None


@dataclass
class VulkanCli:
    """Runs the Vulkan build's CLI in a home holding this process's hardware profile."""

    profile: dict[str, Any]
    profile_file: Path

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return {**os.environ, "NO_COLOR": "1", "COLUMNS": "200", **(extra or {})}

    def __call__(self, *args: str, timeout: float = 600, check: bool = True,
                 env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        self.seed_home()
        r = subprocess.run([str(CLI), *args], env=self.env(env), capture_output=True,
                           text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        if check:
            assert r.returncode == 0, f"{args}: exit {r.returncode}\n{r.stdout[-3000:]}" \
                                      f"\n{r.stderr[-4000:]}"
        return r

    def python(self, code: str, *args: str, timeout: float = 600,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """`code` in the Vulkan venv's interpreter (our package, the Vulkan llama.cpp)."""
        self.seed_home()
        r = subprocess.run([str(PYTHON), "-c", code, *args], env=self.env(env),
                           capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-4000:]
        return r

    def seed_home(self, measured: bool = False) -> None:
        """The profile into the current test's home (where its CLI runs look). By
        default without the device's measured rates: on lavapipe they are slower than
        the CPU's, and a planner that knows it rightly keeps models off the device,
        while these tests drive models onto it (as the planner does with a GPU whose
        rates are assumed). `measured`: the profile as `hardware` wrote it."""
        home = Path(os.environ["INFERENCEOS_HOME"])
        target = home / "data" / "hardware" / "profile.json"
        if target.exists() and not measured:
            return
        data = json.loads(self.profile_file.read_text())
        if not measured:
            for dev in [*data["llama"]["devices"], *data.get("llama_devices", [])]:
                dev.pop("read_gbps", None)
                dev.pop("host_copy_gbps", None)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(data))


def buffers(log: str) -> dict[str, float]:
    """llama.cpp's logged buffer sizes, MiB by "kind:device" ("model:Vulkan0",
    "KV:Vulkan0", "compute:Vulkan_Host", "output:CPU"...), summed."""
    out: dict[str, float] = {}
    pat = re.compile(r"^\S+:\s+(\S+) (model|KV|compute|output|RS) buffer size =\s+([\d.]+) MiB",
                     re.M)
    for dev, kind, mib in pat.findall(log):
        out[f"{kind}:{dev}"] = out.get(f"{kind}:{dev}", 0.0) + float(mib)
    return out


def on_device(buf: dict[str, float], device: str = DEVICE) -> float:
    """MiB llama.cpp allocated on `device` itself (not its host-visible staging)."""
    return sum(v for k, v in buf.items() if k.split(":", 1)[1] == device)


def offloaded(log: str) -> tuple[int, int]:
    """llama.cpp's "offloaded N/M layers to GPU"."""
    m = re.search(r"offloaded (\d+)/(\d+) layers to GPU", log)
    assert m, "no 'offloaded N/M layers' line in llama.cpp's log"
    return int(m[1]), int(m[2])


_UNITS = {"KiB": 1 / 1024, "MiB": 1.0, "GiB": 1024.0}


def planned_on_device(log: str, device: str = DEVICE) -> float:
    """MiB the `plan:` line of a verbose run gives `device`."""
    plan = next(ln for ln in log.splitlines() if ln.startswith("plan:"))
    m = re.search(rf"{device} ([\d.]+) (KiB|MiB|GiB)", plan)
    assert m, plan
    return float(m[1]) * _UNITS[m[2]]


def assert_planned_as_allocated(planned: float, allocated: float) -> None:
    """The plan's MiB on a device within 5 % of what llama.cpp allocated there."""
    assert allocated > 0 and abs(planned / allocated - 1) <= 0.05, (planned, allocated)


PROMPT = "The three primary colors are"


def greedy_run(vk: VulkanCli, model: Path, *extra: str, n: int = 16, raw: bool = True,
               env: dict[str, str] | None = None) -> tuple[str, str]:
    """(the text, llama.cpp's log) of a greedy `run`."""
    r = vk("run", str(model), "-p", "abc ab" if raw else PROMPT, "-n", str(n), "-t", "0",
           "--json", "-v", "--ctx", "512", "--draft", "none", "--ignore-eos",
           *(["--raw"] if raw else []), *extra, env=env)
    return json.loads(r.stdout[r.stdout.find("{"):])["text"], r.stderr



@contextlib.contextmanager
def serving(vk: VulkanCli, model: Path, *args: str, log: Path,
            env: dict[str, str] | None = None) -> Iterator[str]:
    """`serve MODEL ARGS` from the Vulkan venv on a free loopback port; its base URL."""
    import httpx

    from inferenceos.cluster.spawn import free_port

    vk.seed_home()
    port = free_port()
    with log.open("w") as f:
        proc = subprocess.Popen([str(CLI), "serve", str(model), "--port", str(port), *args],
                                env=vk.env(env), stdout=f, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, f"serve exited: {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"serve did not start: {log.read_text()[-3000:]}"
            time.sleep(0.3)
        yield base
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
