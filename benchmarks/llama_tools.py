"""Build llama.cpp's own tools (llama-bench, llama-server) as a same-run baseline.

They are compiled once from the llama.cpp source vendored in the llama-cpp-python sdist
of the installed version, with the same CPU flags as scripts/install.sh, into
`<cache>/llama-tools/<version>/`. Building takes a few minutes on 2 cores.
"""

from __future__ import annotations

import fcntl
import os
import platform
import subprocess
import sys
import tarfile
from importlib.metadata import version
from pathlib import Path
from typing import TextIO

from inferenceos.paths import cache_dir

NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


def _sdist(workdir: Path, ver: str) -> Path:
    """Download and unpack the llama-cpp-python sdist; return its vendored llama.cpp."""
    src = workdir / f"llama_cpp_python-{ver}" / "vendor" / "llama.cpp"
    if src.is_dir():
        return src
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--no-binary",
            ":all:",
            f"llama-cpp-python=={ver}",
            "-d",
            str(workdir),
        ],
        check=True,
    )
    with tarfile.open(workdir / f"llama_cpp_python-{ver}.tar.gz") as tar:
        tar.extractall(workdir, filter="data")
    return src


def llama_tool(name: str) -> Path:
    """Path of the llama.cpp tool `name` (e.g. 'llama-bench'), building it if needed."""
    ver = version("llama-cpp-python")
    workdir = cache_dir() / "llama-tools" / ver
    binary = workdir / "build" / "bin" / name
    if binary.is_file():
        return binary
    workdir.mkdir(parents=True, exist_ok=True)
    # one build at a time: two processes building into one tree remove each other's
    # object files and both fail at the link step (seen with parallel benchmarks)
    with (workdir / "build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if binary.is_file():  # built by whoever held the lock before us
            return binary
        return _build(workdir, ver, name, binary)


def _build(workdir: Path, ver: str, name: str, binary: Path) -> Path:
    """Fetch the source and build `name` into `binary` (the caller holds the lock)."""
    src = _sdist(workdir, ver)
    env = dict(os.environ)
    if platform.machine() == "x86_64" and not env.get("INFERENCEOS_KEEP_AMX"):
        env["CFLAGS"] = f"{env.get('CFLAGS', '')} {NO_AMX}"
        env["CXXFLAGS"] = f"{env.get('CXXFLAGS', '')} {NO_AMX}"
    build = workdir / "build"
    log_path = workdir / "build.log"
    print(f"building {name} from llama.cpp {ver} (a few minutes, once; log: {log_path})",
          file=sys.stderr)
    with log_path.open("a") as log:
        _cmake(src, build, name, env, log)
    return binary


def _cmake(src: Path, build: Path, name: str, env: dict[str, str], log: TextIO) -> None:
    """Configure and build one target; compiler chatter goes to `log`, not the terminal."""
    subprocess.run(
        [
            "cmake",
            "-S",
            str(src),
            "-B",
            str(build),
            "-DCMAKE_BUILD_TYPE=Release",
            "-DLLAMA_CURL=OFF",
            "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF",
            "-DLLAMA_BUILD_TOOLS=ON",
            "-DLLAMA_BUILD_SERVER=ON",
        ],
        check=True,
        env=env,
        stdout=log,
        stderr=log,
    )
    subprocess.run(
        ["cmake", "--build", str(build), "--target", name, "-j", str(os.cpu_count() or 2)],
        check=True,
        env=env,
        stdout=log,
        stderr=log,
    )


def quantize_q8(src: Path, dst: Path) -> Path:
    """`src` requantized to Q8_0 at `dst` (once): a second model with the same weights
    and vocabulary, for benchmarks that need two."""
    import llama_cpp.llama_cpp as ll

    if dst.exists():
        return dst
    params = ll.llama_model_quantize_default_params()
    params.ftype = 7  # LLAMA_FTYPE_MOSTLY_Q8_0
    params.allow_requantize = True
    params.nthread = 2
    tmp = dst.with_suffix(".partial")
    if ll.llama_model_quantize(str(src).encode(), str(tmp).encode(), params) != 0:
        raise RuntimeError("llama_model_quantize failed")
    tmp.replace(dst)
    return dst
