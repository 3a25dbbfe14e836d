"""The CLI's one way to a running InferenceOS server: `ps`, `monitor`, `budget`,
`models stop` and `chat` all reach it through `ServerClient`.

`server_base` says where the server is: `--url`, else host and port (the options, else
config `server.host` / `server.port`; a wildcard bind address, 0.0.0.0 or ::, is reached
at 127.0.0.1; an IPv6 address goes in brackets). `ServerClient` asks it: GET or POST,
JSON or text, the API key as a bearer token. Every failure is one of three errors, each
one line a person can act on:

- `ServerAbsent`: nothing answers there (connection refused, a name that does not
  resolve, no connection made within the timeout, an answer that is not HTTP or not
  the JSON asked for): "no InferenceOS server at URL (why); start one with ...".
- `ServerBusy`: a server accepted the connection and got the request, but sent no
  answer within the timeout. It is there and working on something else, so it is worth
  waiting for: "the server is busy: no answer in 5 s".
- `ServerHTTPError`: it answered with an HTTP error; the status and the server's own
  detail (any dialect's error body), and for a 401 how to give the key.

`retry_busy` asks again after each `ServerBusy`, waiting twice as long each time (up to a
minute; `Patience` keeps that count), until an answer comes; Ctrl-C stops it. It is how
`ps`, `budget` and `monitor --once` never exit on a slow answer.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import urllib.error
import urllib.request
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import Annotated, Any, TypeVar

import typer

from inferenceos.errors import InferenceOSError, UsageError

T = TypeVar("T")

FIRST_TIMEOUT_S = 5.0  # the first wait for an answer
LONGEST_TIMEOUT_S = 60.0  # what the doubling stops at
START_HINT = "start one with `inferenceos serve`"
KEY_HINT = "pass --api-key KEY or set it with `inferenceos config server.api_key KEY`"
WILDCARDS = ("", "0.0.0.0", "::")  # bind addresses that mean "every interface"

# `--timeout` of the commands that retry a busy server (ps, budget, monitor)
TimeoutOpt = Annotated[float, typer.Option(
    "--timeout", min=0.1, max=LONGEST_TIMEOUT_S,
    help="Seconds to wait for an answer before saying the server is busy and asking "
         "again (each wait twice the last, up to 60)")]


class ServerError(InferenceOSError):
    """A server could not be asked, or refused (`base`: its URL)."""

    def __init__(self, message: str, base: str) -> None:
        super().__init__(message)
        self.base = base


class ServerAbsent(ServerError):
    """Nothing (or nothing of ours) answers at `base`."""


class ServerBusy(ServerError):
    """A server accepted the request but gave no answer within `timeout_s`."""

    def __init__(self, base: str, timeout_s: float) -> None:
        super().__init__(f"the server is busy: no answer in {seconds(timeout_s)} s", base)
        self.timeout_s = timeout_s


class ServerHTTPError(ServerError):
    """The server answered `status`; `detail` is the message its error body gave."""

    def __init__(self, message: str, base: str, status: int, detail: str) -> None:
        super().__init__(message, base)
        self.status, self.detail = status, detail


def seconds(value: float) -> str:
    """A timeout as a person reads it: 5, 0.5, 2.4."""
    return f"{value:.3g}"


def server_base(url: str | None = None, host: str | None = None,
                port: int | None = None) -> str:
    """The server's base URL, no trailing slash: `url` (http:// or https://, else
    UsageError), else http://HOST:PORT from `host` / `port`, each defaulting to config
    server.host / server.port. A wildcard bind address becomes 127.0.0.1, and an IPv6
    address is bracketed (given with or without brackets)."""
    if url:
        if not url.startswith(("http://", "https://")):
            raise UsageError(f"--url must start with http:// or https://, got {url!r}")
        return url.rstrip("/")
    if not host or not port:
        from inferenceos.config import load_config

        cfg = load_config()
        host, port = host or str(cfg.get("server.host")), port or int(cfg.get("server.port"))
    host = host.strip("[]")
    host = "127.0.0.1" if host in WILDCARDS else host
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def configured_key(api_key: str | None) -> str:
    """`api_key` when given (an empty one included: no key), else config server.api_key."""
    if api_key is not None:
        return api_key
    from inferenceos.config import load_config

    return str(load_config().get("server.api_key") or "")


@dataclass(frozen=True)
class ServerClient:
    """Requests to one server. Each method takes `timeout` (seconds to wait for a
    connection and then for each read; default `self.timeout`) and raises only the
    `ServerError`s above."""

    base: str
    api_key: str = ""
    timeout: float = FIRST_TIMEOUT_S

    @classmethod
    def configured(cls, url: str | None = None, host: str | None = None,
                   port: int | None = None, api_key: str | None = None,
                   timeout: float = FIRST_TIMEOUT_S) -> ServerClient:
        """The client for the command line's --url / --host / --port / --api-key, with
        the config's values for what is not given (`server_base`, `configured_key`)."""
        return cls(server_base(url, host, port), configured_key(api_key), timeout)

    def get_json(self, path: str, timeout: float | None = None) -> Any:
        """GET `path`; its JSON. ServerAbsent when the answer is not JSON."""
        return self._json(path, self._read(path, None, timeout))

    def post_json(self, path: str, body: Any, timeout: float | None = None) -> Any:
        """POST `body` as JSON to `path`; its JSON answer ({} for an empty one)."""
        return self._json(path, self._read(path, body, timeout) or b"{}")

    def get_text(self, path: str, timeout: float | None = None) -> str:
        """GET `path`; its body as text (/metrics)."""
        return self._read(path, None, timeout).decode(errors="replace")

    def stream_lines(self, path: str, body: Any, timeout: float | None = None
                     ) -> Generator[bytes, None, None]:
        """POST `body` to `path` and yield the answer's lines as they arrive (NDJSON).
        A gap of `timeout` seconds between lines is ServerBusy; closing the iterator
        closes the connection."""
        wait = self.timeout if timeout is None else timeout
        with self._open(path, body, wait) as resp, self._reading(wait):
            yield from resp

    def answers(self, timeout: float = 0.5) -> bool:
        """True when a server answers /api/version (any HTTP status: a 401 is a server
        there too), or accepts the request and is busy with others."""
        try:
            self._read("/api/version", None, timeout)
        except ServerAbsent:
            return False
        except ServerError:
            pass
        return True

    def _read(self, path: str, body: Any, timeout: float | None) -> bytes:
        wait = self.timeout if timeout is None else timeout
        with self._open(path, body, wait) as resp, self._reading(wait):
            data: bytes = resp.read()
            return data

    @contextlib.contextmanager
    def _reading(self, wait: float) -> Iterator[None]:
        """While an answer is read: a silence of `wait` s is ServerBusy, a connection
        cut (or not HTTP) ServerAbsent."""
        try:
            yield
        except TimeoutError:
            raise ServerBusy(self.base, wait) from None
        except (OSError, http.client.HTTPException) as exc:
            raise self._absent(exc) from None

    def _open(self, path: str, body: Any, wait: float) -> http.client.HTTPResponse:
        """The open response to GET `path` (POST when `body` is not None). urllib
        raises a failure to connect as URLError and a silence after the request as
        TimeoutError itself: the line between absent and busy."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data,
                                     method="GET" if data is None else "POST")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.api_key:
            req.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            resp: http.client.HTTPResponse = urllib.request.urlopen(req, timeout=wait)
            return resp
        except urllib.error.HTTPError as exc:
            raise self._refused(exc) from None
        except urllib.error.URLError as exc:  # no connection (refused, no such name, ...)
            why = (f"no connection in {seconds(wait)} s"
                   if isinstance(exc.reason, TimeoutError) else exc.reason)
            raise ServerAbsent(self._absent_text(why), self.base) from None
        except TimeoutError:  # connected and asked, no answer: a server at work
            raise ServerBusy(self.base, wait) from None
        except (OSError, http.client.HTTPException, ValueError) as exc:
            raise self._absent(exc) from None

    def _json(self, path: str, raw: bytes) -> Any:
        try:
            return json.loads(raw)
        except ValueError:
            raise ServerAbsent(self._absent_text(f"its answer to {path} is not JSON"),
                               self.base) from None

    def _absent(self, exc: BaseException) -> ServerAbsent:
        return ServerAbsent(self._absent_text(str(exc) or type(exc).__name__), self.base)

    def _absent_text(self, why: object) -> str:
        return f"no InferenceOS server at {self.base} ({why}); {START_HINT}"

    def _refused(self, exc: urllib.error.HTTPError) -> ServerHTTPError:
        """The server's HTTP error as one line: its detail, or for a 401 what to do."""
        try:
            detail = error_detail(exc.read())
        except (OSError, http.client.HTTPException):
            detail = ""
        detail = detail or str(exc.reason or "")
        if exc.code == 401:
            said = ("wrong API key" if self.api_key else "it needs an API key") + f"; {KEY_HINT}"
        else:
            said = detail
        text = f"the server at {self.base} answered {exc.code}" + (f": {said}" if said else "")
        return ServerHTTPError(text, self.base, exc.code, detail)


def error_detail(body: bytes) -> str:
    """The message of an error body in any of the server's dialects: Ollama's
    {"error": "..."}, OpenAI's and Anthropic's {"error": {"message": ...}}, FastAPI's
    {"detail": ...}; plain text as it is (cut to 200 characters)."""
    try:
        data = json.loads(body)
    except ValueError:
        return body.decode(errors="replace").strip()[:200]
    err = data.get("error", data.get("detail", "")) if isinstance(data, dict) else data
    if isinstance(err, dict):
        err = err.get("message", "")
    return str(err or "")


@dataclass
class Patience:
    """How long to wait for the next answer: `first` seconds, doubled after each busy
    try up to `longest`, back to `first` once an answer comes. A server that takes 7 s
    an answer gets through on the second try rather than never."""

    first: float = FIRST_TIMEOUT_S
    longest: float = LONGEST_TIMEOUT_S
    timeout: float = field(init=False)

    def __post_init__(self) -> None:
        self.timeout = self.first

    def busy(self) -> None:
        self.timeout = max(self.timeout, min(2 * self.timeout, self.longest))

    def answered(self) -> None:
        self.timeout = self.first


def retry_busy(call: Callable[[float], T], notify: Callable[[ServerBusy], None],
               patience: Patience | None = None) -> T:
    """`call(timeout)` until it returns, with `patience`'s timeouts (default: 5 s, then
    doubled up to 60 s). Each ServerBusy goes to `notify` (what the user is told) and
    the call is made again; every other error propagates, and Ctrl-C stops the wait.
    Only for calls that may be repeated (a GET, or a POST that sets a value)."""
    patience = patience or Patience()
    while True:
        try:
            result = call(patience.timeout)
        except ServerBusy as exc:
            notify(exc)
            patience.busy()
            continue
        patience.answered()
        return result


def say_busy(exc: ServerBusy) -> None:
    """Tell the user on stderr that a busy server is asked again (`ps`, `budget`)."""
    from inferenceos.cli.console import err

    err.print(f"{exc}, retrying", markup=False, highlight=False)
