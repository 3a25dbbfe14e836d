"""Structured access logs and the HTTP counter: one JSON line per response.

Logged on the `inferenceos.access` logger: method, route (the route template, not the
raw path, so client text does not flood the log), status, duration in ms, client
address. Bodies and headers (API keys) are never logged.
"""

from __future__ import annotations

import json
import logging
import time

from prometheus_client import Counter
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inferenceos.server.generation import ClientDisconnected

log = logging.getLogger("inferenceos.access")
events = logging.getLogger("inferenceos.server")


class AccessLog:
    def __init__(self, app: ASGIApp, counter: Counter) -> None:
        self.app = app
        self.counter = counter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = [500]

        async def send_wrapper(msg: Message) -> None:
            if msg["type"] == "http.response.start":
                status[0] = int(msg["status"])
            await send(msg)

        try:
            await self.app(scope, receive, send_wrapper)
        except ClientDisconnected:
            # nginx's 499: the client closed the connection; one line, no traceback
            status[0] = 499
            client = scope.get("client") or ("", 0)
            events.info("%s %s: client %s disconnected before the answer; generation "
                        "cancelled", scope["method"], scope.get("path", ""), client[0])
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            self.counter.labels(method=scope["method"], route=route, status=str(status[0])).inc()
            if log.isEnabledFor(logging.INFO):
                client = scope.get("client") or ("", 0)
                log.info(json.dumps({
                    "method": scope["method"], "route": route, "status": status[0],
                    "ms": round((time.perf_counter() - t0) * 1000, 1), "client": client[0],
                }))
