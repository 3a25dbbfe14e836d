"""`inferenceos update`: installed versions, and newer ones when the index answers.

Never hangs: each package is looked up in a daemon thread and the command waits at most
`update.timeout_s` seconds in all (DNS included, which socket timeouts do not cover);
whatever has not answered by then is reported as unreachable. It only reports: upgrading
is left to the user's pip command, printed when something is newer.

The distribution is `inferenceos-runtime` (`inferenceos` on PyPI is an unrelated
project); the import package and the command stay `inferenceos`.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import threading
import time
import urllib.error
import urllib.request
from typing import Annotated, Any

import typer

import inferenceos
from inferenceos.cli.console import out, print_json
from inferenceos.config import load_config

DIST_NAME = "inferenceos-runtime"  # pyproject's [project].name
PACKAGES = (DIST_NAME, "llama-cpp-python")


def installed_version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        if package == DIST_NAME:  # running from a source tree
            return inferenceos.__version__
        return None


def newer(latest: str | None, installed: str | None) -> bool:
    """Whether `latest` is a higher release than `installed` (numeric parts compared)."""
    def key(v: str) -> tuple[int, ...]:
        return tuple(int(n) for n in re.findall(r"\d+", v.split("+")[0])[:4])
    return bool(latest and installed and key(latest) > key(installed))


def fetch_latest(index_url: str, packages: tuple[str, ...], timeout: float) -> dict[str, Any]:
    """{package: latest version str, or an Exception}; missing keys = no answer in time."""
    results: dict[str, Any] = {}

    def ask(pkg: str) -> None:
        try:
            with urllib.request.urlopen(f"{index_url.rstrip('/')}/{pkg}/json",
                                        timeout=timeout) as resp:
                results[pkg] = str(json.load(resp)["info"]["version"])
        except (OSError, ValueError, KeyError) as exc:  # URLError, HTTPError, bad JSON
            results[pkg] = exc

    threads = [threading.Thread(target=ask, args=(p,), daemon=True) for p in packages]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    return dict(results)


def check_updates() -> dict[str, Any]:
    """Installed and latest versions per package, and whether the index was reachable."""
    cfg = load_config()
    url, timeout = str(cfg.get("update.index_url")), float(cfg.get("update.timeout_s"))
    answers = fetch_latest(url, PACKAGES, timeout)
    report: dict[str, Any] = {"index": url, "online": False, "packages": {}}
    for pkg in PACKAGES:
        inst, ans = installed_version(pkg), answers.get(pkg)
        entry: dict[str, Any] = {"installed": inst, "latest": None, "update_available": False}
        if isinstance(ans, str):
            report["online"] = True
            entry.update(latest=ans, update_available=newer(ans, inst))
        else:
            entry["error"] = _why(ans, timeout)
        report["packages"][pkg] = entry
    return report


def _why(answer: Any, timeout: float) -> str:
    if answer is None:
        return f"no answer within {timeout:g} s"
    if isinstance(answer, urllib.error.HTTPError):
        return f"HTTP {answer.code} (not published there?)"
    if isinstance(answer, urllib.error.URLError):
        return f"unreachable ({answer.reason})"
    return f"{type(answer).__name__}: {answer}"


def update(
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object")] = False,
) -> None:
    """Show installed versions and whether newer InferenceOS / llama-cpp-python exist."""
    report = check_updates()
    if as_json:
        print_json(report)
        return
    if not report["online"]:
        out.print(f"offline: could not reach {report['index']}; showing installed versions only",
                  markup=False)
    for pkg, e in report["packages"].items():
        line = f"{pkg} {e['installed'] or 'not installed'}"
        if e["update_available"]:
            line += f" -> {e['latest']} available: pip install -U {pkg}"
        elif e["latest"]:
            line += " (up to date)" if not newer(e["installed"], e["latest"]) else \
                f" (newer than the index's {e['latest']})"
        elif report["online"]:
            line += f" ({e.get('error')})"
        out.print(line, markup=False)
    llama = report["packages"]["llama-cpp-python"]
    if llama["update_available"]:
        out.print("note: llama-cpp-python builds from source; keep your CMAKE_ARGS "
                  "(e.g. -DGGML_CUDA=on) and add --no-cache-dir", markup=False)
