"""llama.cpp's own server tests against llama-server and against us, same Gemma, same run.

The suite is `tools/server/tests/unit/` of the llama.cpp vendored in the installed
llama-cpp-python's sdist (pytest + requests + the openai client). With
`DEBUG_EXTERNAL=1 PORT=...` it talks to a server already running instead of starting
llama-server itself, so each test file runs twice: against llama-server (built by
`llama_tools.py` from the same source) and against `inferenceos serve`, both serving the
built-in Gemma 3 270M under the alias the suite expects, with the settings of the
file's server preset (context 512 over 2 slots, seed 42, ...). The suite's requirements
live in a venv of their own (`<cache>/peer-venv`); every test has a time limit
(pytest-timeout) and every file a budget, so a hang costs minutes, not the run.

Prints, per test file, passed / failed / skipped for each server, the totals, then every
test llama-server passes and we fail, with the first line of our failure.

    .venv/bin/python benchmarks/peer_suite.py [--files test_completion.py,...]
        [--test-timeout 120] [--file-budget 900] [--json results.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from inferenceos.model.default_model import ensure_default_model
from inferenceos.paths import cache_dir
from llama_tools import llama_tool

ALIAS = "tinyllama-2"  # the name the suite's default preset gives its model
API_KEY = "sk-this-is-the-secret-key"  # test_security.py's TEST_API_KEY
PRESET_SEED = 42  # every preset's --seed
# file → preset settings (tools/server/tests/utils.py ServerPreset and the file's fixture)
BASE: dict[str, object] = {"n_ctx": 512, "n_slots": 2, "n_predict": 64, "n_batch": 32}
FILES: dict[str, dict[str, object]] = {
    "test_basic.py": BASE,
    "test_completion.py": BASE,
    "test_chat_completion.py": BASE,
    "test_tokenize.py": BASE,
    "test_security.py": {**BASE, "api_key": API_KEY},
    "test_embedding.py": {"n_ctx": 512, "n_slots": 2, "n_batch": 128, "embedding": True},
    "test_ctx_shift.py": {**BASE, "n_predict": 128},
    "test_ignore_eos.py": BASE,
}


@dataclass
class FileResult:
    passed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # test → first line of the failure
    skipped: list[str] = field(default_factory=list)
    note: str = ""  # the run itself failed (server did not start, budget spent)


# -- the suite and its venv -------------------------------------------------------------


def suite_dir() -> Path:
    """tools/server/tests of the vendored llama.cpp (unpacked when llama-server is built)."""
    llama_tool("llama-server")
    ver = version("llama-cpp-python")
    tests = (cache_dir() / "llama-tools" / ver / f"llama_cpp_python-{ver}" / "vendor"
             / "llama.cpp" / "tools" / "server" / "tests")
    if not (tests / "unit").is_dir():
        raise SystemExit(f"llama.cpp's server tests are not in the sdist ({tests} missing)")
    return tests


def suite_python(tests: Path) -> Path:
    """A venv with the suite's requirements (and pytest-timeout), made once."""
    venv = cache_dir() / "peer-venv"
    python = venv / "bin" / "python"
    marker = venv / f".installed-{version('llama-cpp-python')}"
    if marker.is_file():
        return python
    print(f"creating {venv} with the suite's requirements", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "-r",
                    str(tests / "requirements.txt"), "pytest-timeout"], check=True)
    marker.touch()
    return python


# -- servers ----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def llama_server_cmd(model: Path, port: int, cfg: dict[str, object], threads: int
                     ) -> list[str]:
    cmd = [str(llama_tool("llama-server")), "--host", "127.0.0.1", "--port", str(port),
           "--model", str(model), "--alias", ALIAS, "--temp", "0.8", "--seed", str(PRESET_SEED),
           "--ctx-size", str(cfg["n_ctx"]), "--parallel", str(cfg["n_slots"]),
           "--batch-size", str(cfg["n_batch"]), "--threads", str(threads), "--slots",
           "--metrics", "--no-webui"]
    if "n_predict" in cfg:
        cmd += ["--n-predict", str(cfg["n_predict"])]
    if cfg.get("api_key"):
        cmd += ["--api-key", str(cfg["api_key"])]
    if cfg.get("embedding"):
        cmd += ["--embedding", "--pooling", "mean"]  # ours: mean-pooled, normalised
    return cmd


def ours_cmd(model: Path, port: int, cfg: dict[str, object], threads: int) -> list[str]:
    """`inferenceos serve` with the same model file, context per slot, slots, key and
    default n_predict and seed, and `--any-model` (its default temperature is the
    preset's, 0.8)."""
    exe = Path(sys.executable).with_name("inferenceos")
    n_slots = int(str(cfg["n_slots"]))
    cmd = [str(exe), "serve", str(model), "--host", "127.0.0.1", "--port", str(port),
           "--ctx", str(int(str(cfg["n_ctx"])) // n_slots), "--parallel", str(n_slots),
           "--threads", str(threads)]
    if cfg.get("api_key"):
        cmd += ["--api-key", str(cfg["api_key"])]
    help_text = subprocess.run([str(exe), "serve", "--help"], capture_output=True,
                               text=True).stdout
    if all(f in help_text for f in ("--any-model", "--n-predict", "--seed")):
        cmd += ["--any-model", "--seed", str(PRESET_SEED)]
        if "n_predict" in cfg:
            cmd += ["--n-predict", str(cfg["n_predict"])]
    else:  # a CLI without those flags: the same server, ServerSettings set directly
        cmd = [sys.executable, __file__, "--serve-as-preset",
               str(cfg.get("n_predict", -1)), *cmd[1:]]
    return cmd


@contextlib.contextmanager
def running(cmd: list[str], port: int, home: Path, log: Path) -> Iterator[None]:
    """Start a server, wait for /health (and a first completion, so the model is loaded
    before the first timed test), stop it afterwards."""
    env = {**os.environ, "INFERENCEOS_HOME": str(home), "LLAMA_ARG_HOST": "127.0.0.1"}
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            _wait_ready(proc, port)
            yield
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def _wait_ready(proc: subprocess.Popen[bytes], port: int, timeout: float = 180) -> None:
    import http.client

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with code {proc.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            conn.request("GET", "/health")
            health = conn.getresponse()
            health.read()
            if health.status == 200:
                # warm: load the model (ours loads on first use, llama-server at start)
                conn.request("POST", "/v1/completions", json.dumps(
                    {"prompt": "Hi", "max_tokens": 1}),
                    {"Content-Type": "application/json",
                     "Authorization": f"Bearer {API_KEY}"})
                conn.getresponse().read()
                return
        except (OSError, http.client.HTTPException):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the server did not answer /health within {timeout:.0f} s")


# -- running one file -------------------------------------------------------------------


def run_file(python: Path, tests: Path, name: str, port: int, budget: float,
             test_timeout: int, workdir: Path, label: str) -> FileResult:
    report = workdir / f"{label}-{name}.xml"
    env = {**os.environ, "DEBUG_EXTERNAL": "1", "PORT": str(port),
           "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("VIRTUAL_ENV", None)
    cmd = [str(python), "-m", "pytest", f"unit/{name}", "-v", "-m", "not slow",
           "-p", "no:cacheprovider", f"--timeout={test_timeout}",
           f"--junitxml={report}", "-o", "junit_family=xunit1"]
    out = workdir / f"{label}-{name}.out"
    with out.open("w") as sink:
        try:
            subprocess.run(cmd, cwd=tests, env=env, timeout=budget, stdout=sink,
                           stderr=subprocess.STDOUT)
        except subprocess.TimeoutExpired:
            # the XML report is written at the end: count what -v printed so far
            res = parse_verbose(out.read_text(errors="replace"))
            res.note = f"stopped after its {budget:.0f} s budget"
            return res
    return parse_report(report)


_VERBOSE = re.compile(r"^unit/[^:]+::(.+?) (PASSED|FAILED|ERROR|SKIPPED)\b", re.M)


def parse_verbose(text: str) -> FileResult:
    """Results from pytest -v lines (`unit/f.py::test PASSED [ 5%]`)."""
    res = FileResult()
    for test, outcome in _VERBOSE.findall(text):
        if outcome == "PASSED":
            res.passed.append(test)
        elif outcome == "SKIPPED":
            res.skipped.append(test)
        else:
            res.failed[test] = outcome.lower() + " (details lost with the budget)"
    return res


def parse_report(path: Path) -> FileResult:
    res = FileResult()
    if not path.is_file():
        res.note = "pytest wrote no report"
        return res
    for case in ET.parse(path).getroot().iter("testcase"):
        test = case.get("name", "?")
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if case.find("skipped") is not None:
            res.skipped.append(test)
        elif bad is not None:
            msg = (bad.get("message") or bad.text or "").strip().splitlines()
            res.failed[test] = (msg[0] if msg else "failed")[:160]
        else:
            res.passed.append(test)
    return res


# -- the report -------------------------------------------------------------------------


def print_report(results: dict[str, dict[str, FileResult]]) -> None:
    names = list(results)
    print(f"\n{'test file':<26} {'llama-server p/f/s':>20} {'inferenceos p/f/s':>20}")
    totals = {"llama-server": [0, 0, 0], "inferenceos": [0, 0, 0]}
    for name in names:
        row = []
        for label in ("llama-server", "inferenceos"):
            r = results[name][label]
            t = totals[label]
            t[0] += len(r.passed)
            t[1] += len(r.failed)
            t[2] += len(r.skipped)
            cell = f"{len(r.passed)}/{len(r.failed)}/{len(r.skipped)}"
            row.append(cell + (" !" if r.note else ""))
        print(f"{name:<26} {row[0]:>20} {row[1]:>20}")
    lt, ot = totals["llama-server"], totals["inferenceos"]
    print(f"{'total':<26} {'/'.join(map(str, lt)):>20} {'/'.join(map(str, ot)):>20}")
    print(f"\npassed: llama-server {lt[0]} of {sum(lt)}, inferenceos {ot[0]} of {sum(ot)}"
          f" (ratio {ot[0] / max(1, lt[0]):.2f})")
    for name in names:
        for label in ("llama-server", "inferenceos"):
            if results[name][label].note:
                print(f"  {label} {name}: {results[name][label].note}")
    print("\nllama-server passes, inferenceos fails:")
    for name in names:
        ours = results[name]["inferenceos"]
        for test in results[name]["llama-server"].passed:
            if test in ours.failed:
                print(f"  {name}::{test}: {ours.failed[test]}")
    print("\ninferenceos passes, llama-server fails:")
    for name in names:
        theirs = results[name]["llama-server"]
        for test in results[name]["inferenceos"].passed:
            if test in theirs.failed:
                print(f"  {name}::{test}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", default=",".join(FILES), help="comma-separated test files")
    ap.add_argument("--test-timeout", type=int, default=120, help="seconds per test")
    ap.add_argument("--file-budget", type=float, default=900, help="seconds per file run")
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--only", choices=("llama-server", "inferenceos"), default=None)
    ap.add_argument("--json", type=Path, default=None, help="also write results here")
    args = ap.parse_args()
    files = [f.strip() for f in args.files.split(",") if f.strip()]
    unknown = [f for f in files if f not in FILES]
    if unknown:
        raise SystemExit(f"no server settings for {unknown}; known: {', '.join(FILES)}")
    tests = suite_dir()
    python = suite_python(tests)
    gemma = ensure_default_model()
    workdir = Path(tempfile.mkdtemp(prefix="peer-suite-"))
    model = workdir / f"{ALIAS}.gguf"  # our served name comes from the file name
    model.symlink_to(gemma)
    labels = [args.only] if args.only else ["llama-server", "inferenceos"]
    results: dict[str, dict[str, FileResult]] = {}
    t0 = time.monotonic()
    try:
        for name in files:
            cfg = FILES[name]
            results[name] = {"llama-server": FileResult(note="not run"),
                             "inferenceos": FileResult(note="not run")}
            for label in labels:
                port = free_port()
                make = llama_server_cmd if label == "llama-server" else ours_cmd
                cmd = make(model, port, cfg, args.threads)
                log = workdir / f"{label}-{name}.log"
                t_file = time.monotonic()
                try:
                    with running(cmd, port, workdir / "home", log):
                        res = run_file(python, tests, name, port, args.file_budget,
                                       args.test_timeout, workdir, label)
                except RuntimeError as exc:
                    res = FileResult(note=f"{exc} (log: {log})")
                results[name][label] = res
                print(f"{name:<26} {label:<13} {len(res.passed):>3} passed "
                      f"{len(res.failed):>3} failed {len(res.skipped):>3} skipped "
                      f"({time.monotonic() - t_file:.0f} s){' ' + res.note if res.note else ''}",
                      flush=True)
    finally:
        if results:
            print_report(results)
            print(f"\n{time.monotonic() - t0:.0f} s in all; logs and reports in {workdir}")
            if args.json:
                args.json.write_text(json.dumps(
                    {n: {k: v.__dict__ for k, v in r.items()} for n, r in results.items()},
                    indent=1))


def serve_as_preset(n_predict: int, argv: list[str]) -> None:
    """`inferenceos serve ARGS` with ServerSettings.any_model on, and `n_predict` and the
    preset's seed as the llama.cpp routes' defaults (for a CLI without `--any-model`,
    `--n-predict` and `--seed`)."""
    import dataclasses

    import inferenceos.server.app as app_module

    create = app_module.create_app

    def create_any(settings, catalog, manager):  # type: ignore[no-untyped-def]
        return create(dataclasses.replace(settings, any_model=True, n_predict=n_predict,
                                          seed=PRESET_SEED), catalog, manager)

    app_module.create_app = create_any
    from inferenceos.cli.main import app

    sys.argv = ["inferenceos", *argv]
    app()


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--serve-as-preset":
        serve_as_preset(int(sys.argv[2]), sys.argv[3:])
    else:
        main()
