"""`version`, `cache`, `reset` and `update` through the real console entry point."""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from inferenceos.cli.cache_cmd import cache_kinds
from inferenceos.cli.main import main
from inferenceos.cli.update_cmd import newer
from inferenceos.config import config_path, set_value
from inferenceos.hardware import get_profile, profile_path


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str],
            monkeypatch: pytest.MonkeyPatch, stdin: str = "") -> tuple[int, str, str]:
    import io

    monkeypatch.setattr(sys, "argv", ["inferenceos", *args])
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_version_json(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, _ = run_cli(["version", "--json"], capsys, monkeypatch)
    data = json.loads(out)
    assert code == 0 and data["inferenceos"] == "0.1.0"
    assert data["python"] == sys.version.split()[0]
    if data["llama_error"] is None:
        assert data["llama_cpp_python"] and data["ggml_commit"] and "CPU" in data["backends"]
    code, out, _ = run_cli(["version"], capsys, monkeypatch)
    assert code == 0 and out.startswith("InferenceOS 0.1.0")


def _fill_caches() -> None:
    get_profile(measure=False)
    for kind, path in cache_kinds().items():
        if path.suffix == ".json":  # a cache kept in one file
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("{}")
        else:
            path.mkdir(parents=True, exist_ok=True)
            (path / f"{kind}-sample.json").write_text("{}")


def test_cache_list_and_clean(capsys: pytest.CaptureFixture[str],
                              monkeypatch: pytest.MonkeyPatch) -> None:
    _fill_caches()
    code, out, _ = run_cli(["cache", "list", "--json"], capsys, monkeypatch)
    data = json.loads(out)
    # only what InferenceOS writes somewhere (issue 15: no kinds nothing ever fills)
    assert code == 0 and set(data) == {"profiles", "digests", "self-drafts", "kv-cache"}
    assert data["profiles"]["files"] >= 2 and data["self-drafts"]["bytes"] == 2
    assert data["digests"] == {"path": str(cache_kinds()["digests"]), "files": 1, "bytes": 2}
    code, _, _ = run_cli(["cache", "clean", "self-drafts"], capsys, monkeypatch, stdin="n\n")
    assert code == 1 and cache_kinds()["self-drafts"].exists()
    code, out, _ = run_cli(["cache", "clean", "self-drafts", "digests", "--yes"], capsys,
                           monkeypatch)
    assert code == 0 and "self-drafts: 2 B freed" in out
    assert not cache_kinds()["self-drafts"].exists() and not cache_kinds()["digests"].exists()
    assert profile_path().exists()
    code, _, err = run_cli(["cache", "clean", "models", "-y"], capsys, monkeypatch)
    assert code == 2 and "unknown cache kind(s) models" in err


def test_reset_asks_first_and_yes_skips(capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    set_value("server.port", "8080")
    _fill_caches()
    code, out, _ = run_cli(["reset"], capsys, monkeypatch, stdin="n\n")
    assert code == 1 and "nothing changed" in out and config_path().exists()
    code, out, _ = run_cli(["reset"], capsys, monkeypatch, stdin="y\n")
    assert code == 0 and not config_path().exists() and not profile_path().exists()
    set_value("server.port", "8081")
    code, out, _ = run_cli(["reset", "--yes"], capsys, monkeypatch)
    assert code == 0 and "reset done" in out and not config_path().exists()


@pytest.fixture
def index_server() -> Iterator[str]:
    """A local package index that knows newer versions of both packages."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            versions = {"/pypi/inferenceos-runtime/json": "9.9.0",
                        "/pypi/llama-cpp-python/json": "0.3.36"}
            if self.path not in versions:
                self.send_error(404)
                return
            body = json.dumps({"info": {"version": versions[self.path]}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/pypi"
    server.shutdown()
    server.server_close()


def test_update_reports_newer_versions(index_server: str, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERENCEOS_UPDATE_INDEX_URL", index_server)
    code, out, _ = run_cli(["update", "--json"], capsys, monkeypatch)
    data = json.loads(out)
    assert code == 0 and data["online"]
    assert data["packages"]["inferenceos-runtime"]["latest"] == "9.9.0"
    assert data["packages"]["inferenceos-runtime"]["update_available"]
    code, out, _ = run_cli(["update"], capsys, monkeypatch)
    assert "inferenceos-runtime 0.1.0 -> 9.9.0 available: pip install -U inferenceos-runtime" \
        in out


def test_update_offline_says_so_quickly(capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: connection refused
    monkeypatch.setenv("INFERENCEOS_UPDATE_INDEX_URL", f"http://127.0.0.1:{port}/pypi")
    start = time.monotonic()
    code, out, _ = run_cli(["update"], capsys, monkeypatch)
    assert code == 0 and out.startswith("offline: could not reach")
    assert "inferenceos-runtime 0.1.0" in out and time.monotonic() - start < 3


def test_update_never_hangs_on_a_silent_server(capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        monkeypatch.setenv("INFERENCEOS_UPDATE_INDEX_URL",
                           f"http://127.0.0.1:{silent.getsockname()[1]}/pypi")
        monkeypatch.setenv("INFERENCEOS_UPDATE_TIMEOUT_S", "0.5")
        start = time.monotonic()
        code, out, _ = run_cli(["update", "--json"], capsys, monkeypatch)
        elapsed = time.monotonic() - start
    data = json.loads(out)
    assert code == 0 and not data["online"] and elapsed < 2
    assert "0.5 s" in data["packages"]["inferenceos-runtime"]["error"] or \
        "timed out" in data["packages"]["inferenceos-runtime"]["error"]


def test_version_comparison() -> None:
    assert newer("0.3.37", "0.3.36") and newer("1.0", "0.9.9")
    assert not newer("0.3.36", "0.3.36") and not newer(None, "1") and not newer("0.3.9", "0.3.10")
