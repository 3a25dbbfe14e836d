"""Can a server listen here? Checked before starting, so the answer is one clear line."""

from __future__ import annotations

import socket


def bind_error(host: str, port: int) -> OSError | None:
    """The error binding `host:port` would raise now, or None when it is free.

    Resolution failures come back as OSError too (socket.gaierror is one).
    """
    try:
        family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except OSError as exc:
        return exc
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            sock.bind(addr)
        except OSError as exc:
            return exc
    return None
