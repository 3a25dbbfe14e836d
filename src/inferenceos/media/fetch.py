"""Fetching media from http(s) URLs, for servers whose operator allowed it (off by
default: `serve --allow-media-urls` or `server.media_fetch = true`).

Rules, each enforced here:
- http and https only; no user:password@ in the URL; at most `max_redirects` redirects,
  every hop checked again from the start (scheme, host, address);
- SSRF guard: the host is resolved and *every* address it resolves to must be public:
  loopback, private (RFC 1918, fc00::/7), link-local, multicast, reserved, unspecified,
  shared (100.64/10) and such are refused, including IPv4 addresses inside IPv6 ones
  (IPv4-mapped, 6to4, Teredo, NAT64; the mapped and NAT64 forms are refused whatever
  they hold, as Python's address tables class them non-global). The connection then
  goes to the address that was checked (the Host header and TLS name stay the host's),
  so a DNS answer that changes between check and connect (rebinding) cannot redirect it;
- no proxies from the environment, no compressed transfer (Accept-Encoding: identity;
  a compressed answer is refused rather than inflated);
- the response must declare an image, audio or video type (or octet-stream) and a
  Content-Length within `max_bytes` if it declares one; the body is read in pieces and
  the fetch stops as soon as it passes `max_bytes`;
- `fetch_timeout_s` bounds the whole fetch (DNS, connects, redirects, body): a watchdog
  shuts the socket at the deadline, so a server dripping bytes cannot hold it longer.
"""

from __future__ import annotations

import contextlib
import http.client
import ipaddress
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

from inferenceos.errors import MediaError
from inferenceos.media.limits import MediaLimits, size_text
from inferenceos.media.source import Fetched

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
AddressCheck = Callable[[IPAddress], bool]

_REDIRECTS = (301, 302, 303, 307, 308)
_TYPES = ("image/", "audio/", "video/", "application/octet-stream")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_SHARED = ipaddress.ip_network("100.64.0.0/10")
_USER_AGENT = "InferenceOS-media-fetch/1"


def is_public_address(ip: IPAddress) -> bool:
    """True when `ip` is a globally routable unicast address (what a fetch may reach)."""
    if isinstance(ip, ipaddress.IPv6Address):
        inner = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if inner is None and ip in _NAT64:
            inner = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if inner is not None and not is_public_address(inner):
            return False
        if ip.is_site_local:
            return False
    if isinstance(ip, ipaddress.IPv4Address) and ip in _SHARED:
        return False
    return not (ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_multicast
                or ip.is_reserved or ip.is_unspecified) and ip.is_global


@dataclass(frozen=True)
class _Target:
    scheme: str
    host: str
    port: int
    path: str


def _target(url: str) -> _Target:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise MediaError(f"the media URL is malformed ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise MediaError(f"media URLs must be http or https, not {scheme[:20]!r}")
    if parts.username is not None or parts.password is not None:
        raise MediaError("media URLs must not carry a user name or password")
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise MediaError("the media URL has no host")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return _Target(scheme, host, port or (443 if scheme == "https" else 80), path)


def _resolve(host: str, port: int, timeout_s: float) -> list[IPAddress]:
    """The addresses `host` resolves to, within `timeout_s` (getaddrinfo has no timeout
    of its own: it runs in a helper thread that is abandoned if it is late)."""
    result: list[object] = []

    def work() -> None:
        try:
            result.append(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except OSError as exc:
            result.append(exc)

    t = threading.Thread(target=work, name="media-dns", daemon=True)
    t.start()
    t.join(max(0.0, timeout_s))
    if not result:
        raise MediaError(f"resolving {host[:100]} took too long")
    found = result[0]
    if isinstance(found, OSError):
        raise MediaError(f"cannot resolve {host[:100]}: {found.strerror or found}")
    out: list[IPAddress] = []
    for _family, _type, _proto, _name, addr in found:  # type: ignore[attr-defined]
        ip = ipaddress.ip_address(str(addr[0]).split("%", 1)[0])
        if ip not in out:
            out.append(ip)
    if not out:
        raise MediaError(f"{host[:100]} resolves to no address")
    return out


class _PinnedHTTP(http.client.HTTPConnection):
    """An HTTP connection to an address checked beforehand (Host: stays the name).
    `pinned` keeps the socket: http.client drops its own reference once a response
    that closes the connection has started, and the watchdog still needs it."""

    def __init__(self, host: str, port: int, ip: IPAddress, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self._ip = ip
        self.pinned: socket.socket | None = None

    def connect(self) -> None:
        self.sock = self.pinned = socket.create_connection((str(self._ip), self.port),
                                                           self.timeout)


class _PinnedHTTPS(http.client.HTTPSConnection):
    """HTTPS to a checked address; the certificate is verified for the host name."""

    def __init__(self, host: str, port: int, ip: IPAddress, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout, context=ssl.create_default_context())
        self._ip = ip
        self.pinned: socket.socket | None = None

    def connect(self) -> None:
        sock = socket.create_connection((str(self._ip), self.port), self.timeout)
        context: ssl.SSLContext = self._context  # type: ignore[attr-defined]
        self.sock = self.pinned = context.wrap_socket(sock, server_hostname=self.host)


def fetch_url(url: str, limits: MediaLimits,
              address_ok: AddressCheck = is_public_address) -> Fetched:
    """The media at `url` under the module's rules. `address_ok` decides which resolved
    addresses may be reached; only tests pass anything but `is_public_address` (to
    reach their own loopback server)."""
    deadline = time.monotonic() + limits.fetch_timeout_s
    for _hop in range(limits.max_redirects + 1):
        target = _target(url)
        status, location, fetched = _get(target, deadline, limits, address_ok)
        if status in _REDIRECTS:
            if not location:
                raise MediaError(f"the media URL redirected (HTTP {status}) without a "
                                 "Location")
            url = urljoin(url, location)
            continue
        assert fetched is not None
        return fetched
    raise MediaError(f"the media URL redirected more than {limits.max_redirects} times")


def _left(deadline: float, limits: MediaLimits) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise MediaError(f"fetching the media took longer than {limits.fetch_timeout_s:g} s")
    return left


def _get(t: _Target, deadline: float, limits: MediaLimits, address_ok: AddressCheck
         ) -> tuple[int, str, Fetched | None]:
    """One request: (status, Location for a redirect, the body otherwise)."""
    ips = _resolve(t.host, t.port, _left(deadline, limits))
    refused = [ip for ip in ips if not address_ok(ip)]
    if refused:
        raise MediaError(f"refusing to fetch from {t.host[:100]}: it resolves to a "
                         f"non-public address ({refused[0]})")
    cls = _PinnedHTTPS if t.scheme == "https" else _PinnedHTTP
    conn: _PinnedHTTP | _PinnedHTTPS = cls(t.host, t.port, ips[0],
                                            timeout=_left(deadline, limits))
    watchdog = threading.Timer(_left(deadline, limits), _shut, (conn,))
    watchdog.daemon = True
    watchdog.start()
    try:
        conn.request("GET", t.path, headers={
            "User-Agent": _USER_AGENT, "Accept": "image/*, audio/*, video/*",
            "Accept-Encoding": "identity", "Connection": "close"})
        resp = conn.getresponse()
        if resp.status in _REDIRECTS:
            return resp.status, resp.getheader("Location", "") or "", None
        if resp.status != 200:
            raise MediaError(f"fetching the media failed: HTTP {resp.status} from "
                             f"{t.host[:100]}")
        return resp.status, "", _body(resp, conn.pinned, deadline, limits)
    except MediaError:
        raise
    except (OSError, http.client.HTTPException, ValueError) as exc:
        _left(deadline, limits)  # past the deadline: say so rather than the socket error
        raise MediaError(f"fetching the media from {t.host[:100]} failed: "
                         f"{' '.join(str(exc).split())[:120] or type(exc).__name__}"
                         ) from None
    finally:
        watchdog.cancel()
        conn.close()


def _body(resp: http.client.HTTPResponse, sock: socket.socket | None, deadline: float,
          limits: MediaLimits) -> Fetched:
    ctype = (resp.getheader("Content-Type") or "").split(";", 1)[0].strip().lower()
    if not ctype.startswith(_TYPES):
        raise MediaError(f"the media URL answered {ctype[:60] or 'no content type'!r}, "
                         "not an image or audio")
    encoding = (resp.getheader("Content-Encoding") or "identity").strip().lower()
    if encoding != "identity":
        raise MediaError(f"the media URL answered with {encoding[:20]!r} encoding "
                         "(uncompressed only)")
    declared = resp.getheader("Content-Length")
    if declared is not None and declared.strip().isdigit() and \
            int(declared) > limits.max_bytes:
        raise MediaError(f"the media at the URL is {size_text(int(declared))}; the limit "
                         f"is {size_text(limits.max_bytes)}")
    chunks: list[bytes] = []
    got = 0
    while True:
        if sock is not None:
            sock.settimeout(_left(deadline, limits))
        piece = resp.read1(65536)
        if not piece:
            break
        got += len(piece)
        if got > limits.max_bytes:
            raise MediaError(f"the media at the URL is larger than "
                             f"{size_text(limits.max_bytes)}")
        chunks.append(piece)
    _left(deadline, limits)  # a body cut short by the watchdog is a timeout, not media
    if declared is not None and declared.strip().isdigit() and got < int(declared):
        raise MediaError(f"the media URL's body ended after {got} of {declared} bytes")
    return Fetched(b"".join(chunks), ctype)


def _shut(conn: _PinnedHTTP | _PinnedHTTPS) -> None:
    """The deadline passed: wake any blocked read (it sees the end of the stream)."""
    sock = conn.pinned
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def fetcher(address_ok: AddressCheck = is_public_address
            ) -> Callable[[str, MediaLimits], Fetched]:
    """A `source.Fetcher` under these rules (the server's, when fetching is allowed)."""
    return lambda url, limits: fetch_url(url, limits, address_ok)
