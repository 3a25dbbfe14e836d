"""registry/hub_download.download against a loopback server that misbehaves on Range:
one that ignores it (200 with the whole body), one that answers 416, one that resumes at
the wrong offset, and a cancel mid-file. The fake Hub (tests/fake_hub.py) always honours
Range, so these paths of the transport had no test."""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from inferenceos.registry.hub_download import HubError, download
from inferenceos.registry.hub_names import HubFile

DATA = os.urandom(3 * 1024 * 1024 + 17)  # a few chunks (1 MiB each) and a ragged end
FILE = HubFile("model.gguf", len(DATA), hashlib.sha256(DATA).hexdigest())


class _Server:
    """Serves DATA at /model.gguf; `mode` says what it does with a Range header:
    "honour" (206), "ignore" (200, whole body), "416" (refuse), "shift" (206 from one
    byte later than asked). Records every Range header it saw."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.ranges: list[str | None] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                rng = self.headers.get("Range")
                server.ranges.append(rng)
                start = int(rng.split("=")[1].split("-")[0]) if rng else 0
                if rng and server.mode == "416":
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(DATA)}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if rng and server.mode == "shift":
                    start += 1
                if rng and server.mode != "ignore":
                    self.send_response(206)
                    self.send_header("Content-Range",
                                     f"bytes {start}-{len(DATA) - 1}/{len(DATA)}")
                    body = DATA[start:]
                else:
                    self.send_response(200)
                    body = DATA
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}/model.gguf"
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


@pytest.fixture
def serve(request: pytest.FixtureRequest) -> Iterator[_Server]:
    s = _Server(request.param)
    yield s
    s.stop()


def _fetch(url: str, partial: Path) -> list[int]:
    return list(download(url, FILE, partial, retries=1, timeout=10))


@pytest.mark.parametrize("serve", ["honour"], indirect=True)
def test_a_partial_file_resumes_with_a_range_request(serve: _Server, tmp_path: Path) -> None:
    partial = tmp_path / ".download-x"
    partial.write_bytes(DATA[:1_000_000])
    progress = _fetch(serve.url, partial)
    assert partial.read_bytes() == DATA
    assert serve.ranges == ["bytes=1000000-"]
    assert progress[0] == 1_000_000 and progress[-1] == len(DATA)


@pytest.mark.parametrize("serve", ["ignore"], indirect=True)
def test_a_server_ignoring_range_starts_the_file_over(serve: _Server, tmp_path: Path) -> None:
    """The partial's bytes are kept only when the server resumes; a 200 replaces them
    (appending the whole body after them would fail the digest, or worse, pass a size
    check with the wrong bytes)."""
    partial = tmp_path / ".download-x"
    partial.write_bytes(DATA[:500_000])
    _fetch(serve.url, partial)
    assert partial.read_bytes() == DATA
    assert serve.ranges == ["bytes=500000-"]  # asked once, got everything, no retry


@pytest.mark.parametrize("serve", ["416"], indirect=True)
def test_a_416_starts_the_file_over_without_range(serve: _Server, tmp_path: Path) -> None:
    partial = tmp_path / ".download-x"
    partial.write_bytes(b"\0" * 700_000)  # bytes the server no longer has at that offset
    _fetch(serve.url, partial)
    assert partial.read_bytes() == DATA
    assert serve.ranges == ["bytes=700000-", None]


@pytest.mark.parametrize("serve", ["shift"], indirect=True)
def test_a_resume_at_the_wrong_offset_is_an_error(serve: _Server, tmp_path: Path) -> None:
    partial = tmp_path / ".download-x"
    partial.write_bytes(DATA[:200_000])
    with pytest.raises(HubError, match="wrong offset"):
        _fetch(serve.url, partial)
    assert partial.read_bytes() == DATA[:200_000]  # what it held is not touched


@pytest.mark.parametrize("serve", ["honour"], indirect=True)
def test_cancel_stops_between_chunks_and_keeps_the_partial(serve: _Server,
                                                           tmp_path: Path) -> None:
    partial = tmp_path / ".download-x"
    cancel = threading.Event()
    got = download(serve.url, FILE, partial, retries=1, cancel=cancel, timeout=10)
    assert next(got) == 0
    cancel.set()
    with pytest.raises(Exception, match="cancelled"):
        list(got)
    held = partial.read_bytes() if partial.exists() else b""  # an empty one is removed
    assert len(held) < len(DATA) and DATA.startswith(held)
    # the next pull resumes from there and completes
    assert _fetch(serve.url, partial)[-1] == len(DATA)
    assert partial.read_bytes() == DATA
    assert serve.ranges[-1] == (f"bytes={len(held)}-" if held else None)


@pytest.mark.parametrize("serve", ["honour"], indirect=True)
def test_a_partial_with_the_wrong_bytes_fails_the_digest_and_is_deleted(
        serve: _Server, tmp_path: Path) -> None:
    partial = tmp_path / ".download-x"
    partial.write_bytes(b"x" * 100)
    with pytest.raises(HubError, match="sha256 mismatch"):
        _fetch(serve.url, partial)
    assert not partial.exists()


@pytest.mark.parametrize("serve", ["honour"], indirect=True)
def test_a_pull_that_finished_between_open_and_lock_is_opened_again(
        serve: _Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race eight concurrent pulls hit (tests/faults/test_hostile_clients.py): the
    pull holding the claim completes and moves the file away after we opened the path
    but before our lock; ours then holds a stale handle. The claim opens the path again
    (not a FileNotFoundError from reading it, a 500): here a fresh file, fetched whole.
    A file that keeps moving away is a busy answer (UsageError, a 4xx)."""
    import fcntl

    from inferenceos.errors import UsageError

    partial = tmp_path / ".download-0123456789abcdef"
    real = fcntl.flock
    moves = [1]

    def winner_moves_it_first(fd: int, op: int) -> None:
        if moves[0]:
            moves[0] -= 1
            partial.rename(tmp_path / "blob")  # what the other pull's completion does
        real(fd, op)

    monkeypatch.setattr(fcntl, "flock", winner_moves_it_first)
    assert _fetch(serve.url, partial)[-1] == len(DATA)
    assert partial.read_bytes() == DATA and serve.ranges == [None]
    moves[0] = 10
    with pytest.raises(UsageError, match="another pull of this file is running"):
        _fetch(serve.url, partial)


def test_a_claim_that_found_nothing_to_do_leaves_no_file(tmp_path: Path) -> None:
    """A claim whose holder wrote nothing removes the empty file it created (a pull that
    found the model already registered leaves no `.download-` file in the store)."""
    from inferenceos.registry.hub_download import claim

    partial = tmp_path / ".download-0123456789abcdef"
    with claim(partial):
        assert partial.exists()
    assert not partial.exists()
    partial.write_bytes(b"half")
    with claim(partial):
        pass
    assert partial.read_bytes() == b"half"  # a partial download is kept for the resume
