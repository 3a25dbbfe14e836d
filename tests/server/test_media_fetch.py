"""Fetching media from http(s) URLs (media/fetch.py) against a real HTTP server on
loopback: off by default, refused for loopback by the SSRF guard even when allowed, and
reachable only through the test-only address hook that whitelists loopback."""

from __future__ import annotations

import http.server
import io
import ipaddress
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest
from PIL import Image

from inferenceos.errors import MediaError
from inferenceos.media.collect import MediaSet
from inferenceos.media.fetch import _PinnedHTTP, fetcher, is_public_address
from inferenceos.media.limits import MediaLimits


def _png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (12, 10), (10, 200, 30)).save(buf, "PNG")
    return buf.getvalue()


PNG = _png()


class _Handler(http.server.BaseHTTPRequestHandler):
    hits: ClassVar[list[tuple[str, str]]] = []

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def _send(self, status: int, body: bytes = b"", ctype: str = "image/png",
              **headers: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        if "Content_Length" not in headers:
            self.send_header("Content-Length", str(len(body)))
        for k, v in headers.items():
            self.send_header(k.replace("_", "-"), v)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # http.server's name
        type(self).hits.append((self.path, self.headers.get("Host", "")))
        p = self.path
        if p == "/img.png":
            self._send(200, PNG)
        elif p == "/redirect":
            self._send(302, b"", "text/plain", Location="/img.png")
        elif p == "/loop":
            self._send(302, b"", "text/plain", Location="/loop")
        elif p == "/to-private":
            self._send(302, b"", "text/plain", Location="http://10.1.2.3/img.png")
        elif p == "/html":
            self._send(200, b"<html>hi</html>", "text/html")
        elif p == "/gzip":
            self._send(200, PNG, Content_Encoding="gzip")
        elif p == "/missing":
            self._send(404, b"no", "text/plain")
        elif p == "/big-declared":
            self._send(200, b"", Content_Length=str(10**9))
        elif p == "/big-undeclared":  # no Content-Length: the body runs until close
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Connection", "close")
            self.end_headers()
            for _ in range(64):
                try:
                    self.wfile.write(b"\x00" * 65536)
                except OSError:
                    return
        elif p == "/drip":  # a byte at a time, for ever
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", "100000")
            self.end_headers()
            for _ in range(200):
                try:
                    self.wfile.write(b"\x89")
                    self.wfile.flush()
                except OSError:
                    return
                time.sleep(0.05)
        else:
            self._send(404, b"", "text/plain")


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


@pytest.fixture(autouse=True)
def _clear_hits() -> None:
    _Handler.hits.clear()


# the test-only hook: loopback (our server) counts as reachable; nothing else does
LOOPBACK_ONLY = fetcher(address_ok=lambda ip: ip.is_loopback)


def test_urls_are_refused_by_default_and_nothing_is_fetched(server: str) -> None:
    with pytest.raises(MediaError, match="does not fetch media from URLs"):
        MediaSet().image(server + "/img.png")
    assert _Handler.hits == []


def test_loopback_is_refused_even_when_fetching_is_allowed(server: str) -> None:
    media = MediaSet(fetch=fetcher())  # the server's own guard
    with pytest.raises(MediaError, match=r"non-public address \(127.0.0.1\)"):
        media.image(server + "/img.png")
    port = server.rsplit(":", 1)[1]
    for url in (f"http://localhost:{port}/img.png", f"http://[::1]:{port}/img.png",
                f"http://2130706433:{port}/img.png", f"http://0.0.0.0:{port}/img.png"):
        with pytest.raises(MediaError, match=r"non-public address|cannot resolve"):
            media.image(url)
    assert _Handler.hits == []


def test_fetch_through_test_only_loopback_hook_decodes_the_image(server: str) -> None:
    media = MediaSet(fetch=LOOPBACK_ONLY)
    media.image(server + "/img.png")
    assert (media.items[0].nx, media.items[0].ny) == (12, 10)


def test_fetch_through_test_only_loopback_hook_follows_redirects(server: str) -> None:
    media = MediaSet(fetch=LOOPBACK_ONLY)
    media.image(server + "/redirect")
    assert [p for p, _ in _Handler.hits] == ["/redirect", "/img.png"]
    with pytest.raises(MediaError, match="redirected more than 3 times"):
        media.image(server + "/loop")


def test_fetch_through_test_only_loopback_hook_rechecks_each_redirect_hop(server: str
                                                                          ) -> None:
    with pytest.raises(MediaError, match=r"non-public address \(10.1.2.3\)"):
        MediaSet(fetch=LOOPBACK_ONLY).image(server + "/to-private")


@pytest.mark.parametrize("path, match", [
    ("/html", "answered 'text/html', not an image or audio"),
    ("/gzip", "'gzip' encoding"),
    ("/missing", "HTTP 404"),
    ("/big-declared", "is 953.7 MiB; the limit is 1 MiB"),
    ("/big-undeclared", "larger than 1 MiB"),
])
def test_fetch_through_test_only_loopback_hook_enforces_type_and_size(
        server: str, path: str, match: str) -> None:
    with pytest.raises(MediaError, match=match):
        MediaSet(MediaLimits(max_bytes=1 << 20), fetch=LOOPBACK_ONLY).image(server + path)


def test_fetch_through_test_only_loopback_hook_stops_at_the_total_time_limit(
        server: str) -> None:
    t0 = time.monotonic()
    with pytest.raises(MediaError, match="took longer than 1 s"):
        MediaSet(MediaLimits(fetch_timeout_s=1.0), fetch=LOOPBACK_ONLY).image(
            server + "/drip")
    assert time.monotonic() - t0 < 2.5  # not 200 drips × 50 ms


def test_connection_goes_to_the_checked_address_not_a_new_lookup(server: str) -> None:
    """DNS rebinding: the socket is opened to the address that was checked; the name
    is only the Host header (a name that resolves nowhere still reaches it)."""
    port = int(server.rsplit(":", 1)[1])
    conn = _PinnedHTTP("rebind.invalid", port, ipaddress.ip_address("127.0.0.1"), 5.0)
    conn.request("GET", "/img.png")
    assert conn.getresponse().read() == PNG
    conn.close()
    assert _Handler.hits == [("/img.png", f"rebind.invalid:{port}")]


@pytest.mark.parametrize("addr, public", [
    ("8.8.8.8", True), ("2606:4700:4700::1111", True), ("93.184.216.34", True),
    ("127.0.0.1", False), ("127.8.9.10", False), ("::1", False), ("0.0.0.0", False),
    ("::", False), ("10.0.0.1", False), ("172.16.5.4", False), ("192.168.1.1", False),
    ("169.254.169.254", False), ("fe80::1", False), ("fc00::1", False), ("fd12::1", False),
    ("100.64.0.1", False), ("224.0.0.1", False), ("239.255.255.250", False),
    ("ff02::1", False), ("240.0.0.1", False), ("255.255.255.255", False),
    ("::ffff:127.0.0.1", False), ("::ffff:10.0.0.1", False), ("2002:7f00:1::", False),
    ("64:ff9b::a00:1", False), ("2001::ffff:80ff:fffe", False),  # Teredo, client 127.0.0.1
    # IPv4 written inside IPv6 is not fetched even when the IPv4 is public (Python's
    # tables class the mapped and NAT64 ranges as non-global; a real host has no need)
    ("::ffff:8.8.8.8", False), ("64:ff9b::808:808", False),
    ("fec0::1", False), ("198.18.0.1", False), ("192.0.2.1", False),
])
def test_ssrf_guard_address_classes(addr: str, public: bool) -> None:
    assert is_public_address(ipaddress.ip_address(addr)) is public


def test_fetch_through_test_only_loopback_hook_verifies_https_certificates(
        tmp_path: Path) -> None:
    """An https URL is fetched over TLS with the certificate verified for the host: a
    self-signed one (this loopback server's) is refused."""
    import ssl

    from test_server_tls import self_signed

    cert, key = self_signed(tmp_path)
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        with pytest.raises(MediaError, match=r"CERTIFICATE_VERIFY_FAILED|certificate verify"):
            MediaSet(fetch=LOOPBACK_ONLY).image(
                f"https://127.0.0.1:{srv.server_address[1]}/img.png")
    finally:
        srv.shutdown()
        srv.server_close()
    assert _Handler.hits == []  # the handshake failed before any request was sent
