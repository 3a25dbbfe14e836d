"""A bad telemetry database never fails a run or a request.

Each fault (a writer SIGKILLed mid-write, a database locked by another connection, a
read-only file, a truncated file, a garbage file, a full disk) is applied to a real
database, then a real `inferenceos run` (subprocess, tiny model) and a real server
request must succeed with at most one telemetry warning line, losing at most the record
in flight; once the fault is gone, recording resumes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cli_helpers import cli_env, run_cli
from inferenceos import telemetry
from inferenceos.telemetry import db as dbmod
from server_harness import serving

FAULTS = ("locked", "readonly", "truncated", "garbage", "full")
WARNING = "warning: telemetry:"


def _db(home: Path) -> Path:
    return home / "data" / "telemetry.db"


def _count(db: Path) -> int:
    conn = sqlite3.connect(db)
    try:
        return int(conn.execute("SELECT COUNT(*) FROM generations").fetchone()[0])
    finally:
        conn.close()


def _warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if WARNING in line]


def _small_files() -> None:
    """In the child: files may not grow past 1 KiB (writes beyond fail with EFBIG), the
    injected stand-in for a full disk where no tmpfs can be mounted."""
    import resource

    resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))


def _run(model: Path, home: Path, inject_full: bool = False
         ) -> subprocess.CompletedProcess[str]:
    if inject_full:
        args = [sys.executable, "-m", "inferenceos", "run", str(model), "-p", "hi", "-n", "4",
                "--temperature", "0", "--json"]
        r = subprocess.run(args, capture_output=True, text=True, timeout=120,
                           env=cli_env(INFERENCEOS_HOME=str(home)), preexec_fn=_small_files)
    else:
        r = run_cli("run", str(model), "-p", "hi", "-n", "4", "--temperature", "0", "--json",
                    INFERENCEOS_HOME=str(home))
    assert r.returncode == 0, r.stderr
    assert '"completion_tokens"' in r.stdout
    return r


def _mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                       capture_output=True)
    return r.returncode == 0


def _is_mount(path: Path) -> bool:
    return os.path.ismount(path)


def _umount(where: Path) -> None:
    subprocess.run(["umount", "-l", str(where)], capture_output=True)


@contextlib.contextmanager
def _disk(home: Path, kind: str, inject: bool = False) -> Iterator[bool]:
    """For the full-disk fault, the data dir is a small tmpfs for the whole test. Where
    none can be mounted: with `inject`, yields True (the caller limits file sizes
    instead), else skips."""
    if kind != "full":
        yield False
        return
    data = home / "data"
    if not _mount_tmpfs(data, "2m"):
        if not inject:
            pytest.skip("mounting a tmpfs needs root here")
        yield True
        return
    try:
        yield False
    finally:
        _umount(data)


def _immutable(path: Path, on: bool) -> bool:
    """chattr +i / -i (root ignores file modes, not the immutable flag)."""
    if not shutil.which("chattr"):
        return False
    r = subprocess.run(["chattr", "+i" if on else "-i", str(path)], capture_output=True)
    return r.returncode == 0


@contextlib.contextmanager
def fault(kind: str, home: Path) -> Iterator[None]:
    """Apply `kind` to the (existing, closed) database under `home` while inside."""
    db = _db(home)
    assert db.exists() and not db.with_name(db.name + "-wal").exists()
    if kind == "locked":
        conn = sqlite3.connect(db, isolation_level=None)
        conn.execute("PRAGMA locking_mode = EXCLUSIVE")
        conn.execute("BEGIN EXCLUSIVE")
        conn.execute("DELETE FROM events WHERE 0")  # take the write lock now
        try:
            yield
        finally:
            conn.execute("ROLLBACK")
            conn.close()
    elif kind == "readonly":
        if os.geteuid() == 0:
            if not _immutable(db, True):
                pytest.skip("chattr +i is not supported on this file system")
        else:
            db.chmod(0o444)
            db.parent.chmod(0o555)
        try:
            yield
        finally:
            if os.geteuid() == 0:
                _immutable(db, False)
            else:
                db.parent.chmod(0o755)
                db.chmod(0o644)
    elif kind == "truncated":
        conn = sqlite3.connect(db)
        with conn:  # make the file big enough that half of it loses real pages
            conn.executemany("INSERT INTO events (uid, ts, machine_id, kind, detail) "
                             "VALUES (?, 0, 1, 'padding', ?)",
                             [(f"pad{i}", "x" * 500) for i in range(300)])
        conn.close()
        os.truncate(db, db.stat().st_size // 2)
        yield
    elif kind == "garbage":
        db.write_bytes(os.urandom(64 * 1024))
        yield
    elif kind == "full" and not _is_mount(db.parent):
        yield  # injected: the run itself cannot grow files (see _small_files)
    elif kind == "full":
        filler = db.parent / "filler"
        with open(filler, "wb") as fh:
            chunk = b"\0" * 65536
            with contextlib.suppress(OSError):
                while True:
                    fh.write(chunk)
                    fh.flush()
        try:
            yield
        finally:
            filler.unlink()
    else:  # pragma: no cover
        raise AssertionError(kind)


def _expected_after(kind: str, before: int) -> int:
    """Generations in the database after the run under the fault and one more run."""
    if kind in ("truncated", "garbage"):
        return 2  # a fresh database: the faulted run's record and the next one
    return before + 1  # the record in flight was lost, the next one is kept


@pytest.mark.parametrize("kind", FAULTS)
def test_run_survives(kind: str, tiny_llama: Path, isolated_home: Path) -> None:
    home = isolated_home
    with _disk(home, kind, inject=True) as inject:
        assert _warnings(_run(tiny_llama, home).stderr) == []
        before = _count(_db(home))
        assert before == 1
        with fault(kind, home):
            r = _run(tiny_llama, home, inject_full=inject)
        warnings = _warnings(r.stderr)
        assert len(warnings) == 1, r.stderr
        if kind in ("truncated", "garbage"):
            assert "moved it to" in warnings[0] and "fresh database" in warnings[0]
            assert list(_db(home).parent.glob("telemetry.db.corrupt-*"))
        if kind == "full" and not inject:
            assert "disk is full" in warnings[0]
        r = _run(tiny_llama, home)
        assert _warnings(r.stderr) == []
        assert _count(_db(home)) == _expected_after(kind, before)


def _seed(home: Path, model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One recorded generation under `home`, written and closed by this process."""
    monkeypatch.setenv("INFERENCEOS_HOME", str(home))
    rec = telemetry.recorder()
    rec.generation(model, source="test", prompt_tokens=1, output_tokens=1)
    rec.flush(30)
    telemetry.set_recorder(None)  # closes its connection: the file is left alone
    dbmod.reset_warnings()


def _one_request(home_root: Path, model: Path) -> None:
    with serving({"tiny": model}, home_root) as h:
        r = httpx.post(h.v1 + "/completions", timeout=60,
                       json={"model": "tiny", "prompt": "hi", "max_tokens": 4})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] >= 1
        telemetry.recorder().flush(30)
    telemetry.set_recorder(None)


@pytest.mark.parametrize("kind", FAULTS)
def test_server_survives(kind: str, tiny_llama: Path, tmp_path: Path,
                         monkeypatch: pytest.MonkeyPatch,
                         capfd: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "home"  # what serving() uses as INFERENCEOS_HOME
    with _disk(home, kind):
        _seed(home, tiny_llama, monkeypatch)
        before = _count(_db(home))
        capfd.readouterr()
        with fault(kind, home):
            _one_request(tmp_path, tiny_llama)
        warnings = _warnings(capfd.readouterr().err)
        assert len(warnings) == 1, warnings
        dbmod.reset_warnings()
        _one_request(tmp_path, tiny_llama)
        assert _warnings(capfd.readouterr().err) == []
        assert _count(_db(home)) == _expected_after(kind, before)


_WRITER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from inferenceos import telemetry
    rec = telemetry.recorder()
    i = 0
    while True:
        rec.generation(Path(sys.argv[1]), source="killed", prompt_tokens=i,
                       output_tokens=1, decode_tps=1.0, extra={"pad": "x" * 2000})
        rec.flush(30)
        i += 1
        print(i, flush=True)
""")


def _killed_writer(home: Path, model: Path) -> int:
    """Start a process that records in a loop, SIGKILL it mid-stream; how many records
    it had confirmed (flushed) before it died."""
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(model)], text=True,
                            stdout=subprocess.PIPE, env=cli_env(INFERENCEOS_HOME=str(home)))
    assert proc.stdout is not None
    confirmed = 0
    for line in proc.stdout:
        confirmed = int(line)
        if confirmed >= 40:
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    return confirmed


def test_killed_writer_leaves_a_good_database(tiny_llama: Path, isolated_home: Path,
                                              tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    confirmed = _killed_writer(isolated_home, tiny_llama)
    db = _db(isolated_home)
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()
    written = _count(db)
    assert written >= confirmed  # only records in flight after the last flush may be lost
    r = _run(tiny_llama, isolated_home)
    assert _warnings(r.stderr) == []
    assert _count(db) == written + 1
    # the server too, on a database whose writer was killed
    home = tmp_path / "home"
    confirmed = _killed_writer(home, tiny_llama)
    written = _count(_db(home))
    assert written >= confirmed
    monkeypatch.setenv("INFERENCEOS_HOME", str(home))
    _one_request(tmp_path, tiny_llama)
    assert _count(_db(home)) == written + 1
