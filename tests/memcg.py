"""Run a command inside a real memory cgroup, for tests and benchmarks.

`MemoryCgroup(limit)` makes a child of this process's own memory cgroup (cgroup v1:
`memory.limit_in_bytes`; v2: `memory.max`), runs commands in it and removes it after.
The command's process joins the cgroup before it execs (a preexec hook writes its pid
into `cgroup.procs`), so every byte it ever touches, anonymous memory and page cache
alike, is charged there; the kernel enforces the limit, and an over-commit ends in an
OOM kill (exit 137 / -9), not a warning. `writable_cgroup()` is None where no memory
cgroup can be made (no controller, not root): tests skip on it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

ROOT = Path("/sys/fs/cgroup")


def _own_dir() -> tuple[Path, int] | None:
    """(this process's memory cgroup directory, cgroup version) or None."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, ctrls, rel = line.split(":", 2)
        if "memory" in ctrls.split(","):
            d = ROOT / "memory" / rel.lstrip("/")
            if (d / "memory.limit_in_bytes").exists():
                return d, 1
    for line in lines:
        _, ctrls, rel = line.split(":", 2)
        if ctrls == "":
            d = ROOT / rel.lstrip("/")
            if "memory" in (d / "cgroup.controllers").read_text(errors="ignore").split():
                return d, 2
    return None


def writable_cgroup() -> Path | None:
    """A directory a child memory cgroup can be made in, or None (then skip)."""
    own = _own_dir()
    if own is None:
        return None
    probe = own[0] / f"ios-probe-{uuid.uuid4().hex[:8]}"
    try:
        probe.mkdir()
    except OSError:
        return None
    probe.rmdir()
    return own[0]


@dataclass(frozen=True)
class CgroupRun:
    """One command's outcome and what its cgroup saw (bytes)."""

    returncode: int
    stdout: str
    stderr: str
    limit: int
    max_usage: int  # the cgroup's peak charge (v1 max_usage_in_bytes, v2 memory.peak)
    failcnt: int  # times the charge hit the limit (reclaim ran); v2: memory.events max
    oom_kills: int  # processes the kernel's OOM killer ended in this cgroup

    @property
    def killed(self) -> bool:
        """OOM-killed: SIGKILL (-9 from subprocess, 137 from a shell) or an OOM event."""
        return self.returncode in (-9, 137) or self.oom_kills > 0


class MemoryCgroup:
    """A child memory cgroup limited to `limit` bytes; a context manager."""

    def __init__(self, limit: int, parent: Path | None = None) -> None:
        own = _own_dir()
        if own is None:
            raise RuntimeError("no memory cgroup here")
        base, self.version = own
        self.limit = int(limit)
        self.path = (parent or base) / f"ios-test-{uuid.uuid4().hex[:10]}"

    def __enter__(self) -> MemoryCgroup:
        self.path.mkdir()
        if self.version == 1:
            # no swap here, but where there is, memsw would let a process swap instead
            self._write("memory.limit_in_bytes", str(self.limit))
        else:
            self._write("memory.max", str(self.limit))
            self._write("memory.swap.max", "0", missing_ok=True)
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._kill_leftovers()
        # no memory.force_empty: it reclaims every page charged here, the library's and
        # the interpreter's too, which another test's process (in its own cgroup) may be
        # using uncharged: that process must then read them again, charged, over the
        # limit its test sized. rmdir leaves the charges to the parent
        for _ in range(50):  # a killed process leaves the cgroup as it exits
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)

    def run(
        self, argv: Sequence[str], timeout: float, env: dict[str, str] | None = None
    ) -> CgroupRun:
        """Run `argv` inside the cgroup to its end (or `timeout`: then killed, rc -9 and
        TimeoutExpired re-raised after cleanup)."""
        procs = str(self.path / "cgroup.procs")

        def join() -> None:  # in the child, before exec: everything it maps is charged
            with open(procs, "w") as f:
                f.write(str(os.getpid()))

        proc = subprocess.run(
            list(argv), preexec_fn=join, capture_output=True, text=True,
            timeout=timeout, env=env,
        )
        return CgroupRun(
            returncode=proc.returncode,
            stdout=proc.stdout,
            stderr=proc.stderr,
            limit=self.limit,
            max_usage=self.max_usage(),
            failcnt=self._failcnt(),
            oom_kills=self.oom_kills(),
        )

    def popen(self, argv: Sequence[str], **kw: object) -> subprocess.Popen[str]:
        """Start `argv` inside the cgroup (a server, say); the caller ends it."""
        procs = str(self.path / "cgroup.procs")

        def join() -> None:
            with open(procs, "w") as f:
                f.write(str(os.getpid()))

        return subprocess.Popen(list(argv), preexec_fn=join, text=True, **kw)  # type: ignore[call-overload]

    def max_usage(self) -> int:
        name = "memory.max_usage_in_bytes" if self.version == 1 else "memory.peak"
        return self._read_int(name)

    def reset_peak(self) -> None:
        """Start a new peak (v1 only; v2's memory.peak cannot be reset before 6.12)."""
        if self.version == 1:
            self._write("memory.max_usage_in_bytes", "0")

    def _failcnt(self) -> int:
        if self.version == 1:
            return self._read_int("memory.failcnt")
        return self._event("max")

    def oom_kills(self) -> int:
        """Processes the kernel's OOM killer ended in this cgroup so far."""
        if self.version == 1:
            return self._event("oom_kill", "memory.oom_control")
        return self._event("oom_kill")

    def _event(self, key: str, name: str = "memory.events") -> int:
        try:
            for line in (self.path / name).read_text().splitlines():
                k, _, v = line.partition(" ")
                if k == key:
                    return int(v)
        except (OSError, ValueError):
            pass
        return 0

    def _read_int(self, name: str) -> int:
        try:
            return int((self.path / name).read_text().strip())
        except (OSError, ValueError):
            return 0

    def _write(self, name: str, value: str, missing_ok: bool = False) -> None:
        try:
            (self.path / name).write_text(value)
        except FileNotFoundError:
            if not missing_ok:
                raise
        except OSError:
            if not missing_ok:
                raise

    def _kill_leftovers(self) -> None:
        """A cgroup with processes in it cannot be removed: end any the test left."""
        try:
            pids = (self.path / "cgroup.procs").read_text().split()
        except OSError:
            return
        for pid in pids:
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(pid), 9)


def cap_own_memory(above: int) -> int:
    """Limit this process's own memory cgroup to its charge now plus `above` bytes, and
    return that limit (a probe calls it after its start-up, before it plans).

    A limit sized in the test from another run's start-up charge is not this run's:
    file pages (the interpreter's, the library's) are charged to the cgroup that first
    read them, so a run that found them cached by another process was charged less than
    one that must read them again (seen in CI: a reference charged 31 MiB where this
    machine charges 42, and the run limited from it was OOM-killed)."""
    own = _own_dir()
    if own is None:
        raise RuntimeError("no memory cgroup here")
    d, version = own
    usage = int((d / ("memory.usage_in_bytes" if version == 1 else "memory.current"))
                .read_text().strip())
    limit = usage + int(above)
    (d / ("memory.limit_in_bytes" if version == 1 else "memory.max")).write_text(str(limit))
    return limit


def drop_cache(path: Path) -> None:
    """Ask the kernel to drop `path`'s clean pages from the page cache (pages another
    process still maps stay): the next read comes from disk and is charged to the
    cgroup that reads it."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def cold_copy(src: Path, dst: Path) -> Path:
    """A private copy of `src` with none of its pages cached. Page cache is charged to
    the cgroup that first read a page: a model other processes have read stays cached,
    charged elsewhere, and would never be read from disk under our limit."""
    # a rebuilt source of the same size (the upcycled MoE with another router) is
    # newer than its copy
    if (not dst.exists() or dst.stat().st_size != src.stat().st_size
            or dst.stat().st_mtime < src.stat().st_mtime):
        tmp = dst.with_suffix(".part")
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    drop_cache(dst)
    return dst
