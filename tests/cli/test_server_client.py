"""The CLI's client of a running server (cli/server_client.py) against real loopback
sockets: a server that accepts and holds its answer until the test releases it is busy,
a port where nothing listens is absent, and HTTP errors keep the server's own words."""

from __future__ import annotations

import pytest

from inferenceos.cli.server_client import (
    Patience,
    ServerAbsent,
    ServerBusy,
    ServerClient,
    ServerHTTPError,
    configured_key,
    error_detail,
    retry_busy,
    server_base,
)
from inferenceos.errors import UsageError
from slow_server import Answer, closed_port, held_server


def test_a_server_that_accepts_but_holds_its_answer_is_busy_not_absent() -> None:
    with held_server({"/api/ps": Answer({"models": []})}) as srv:
        client = ServerClient(srv.url, timeout=0.2)
        with pytest.raises(ServerBusy) as busy:
            client.get_json("/api/ps")
        assert str(busy.value) == "the server is busy: no answer in 0.2 s"
        assert busy.value.timeout_s == 0.2 and busy.value.base == srv.url
        assert client.answers()  # a busy server is a server there
        srv.release.set()
        assert client.get_json("/api/ps") == {"models": []}


def test_a_closed_port_is_absent_with_the_one_line() -> None:
    with closed_port() as port:
        client = ServerClient(f"http://127.0.0.1:{port}")
        with pytest.raises(ServerAbsent) as absent:
            client.get_json("/api/ps")
        text = str(absent.value)
        assert text.startswith(f"no InferenceOS server at http://127.0.0.1:{port} (")
        assert "refused" in text and text.endswith("start one with `inferenceos serve`")
        with pytest.raises(ServerAbsent):
            client.post_json("/api/budget", {"device": "CPU", "bytes": None})
        assert not client.answers()


def test_a_stream_that_stalls_after_its_first_line_is_busy() -> None:
    stalls = Answer(b'{"b": 2}\n', first=b'{"a": 1}\n')
    with held_server({"/api/chat": stalls}) as srv:
        lines = ServerClient(srv.url, timeout=0.2).stream_lines("/api/chat", {"x": 1})
        assert next(lines) == b'{"a": 1}\n'
        with pytest.raises(ServerBusy, match=r"no answer in 0\.2 s"):
            next(lines)
        assert srv.asked[0].method == "POST" and srv.asked[0].body == {"x": 1}


def test_retry_busy_waits_twice_as_long_each_time_until_the_answer() -> None:
    with held_server({"/api/ps": Answer({"models": ["m"]})}) as srv:
        client = ServerClient(srv.url)
        waits: list[float] = []

        def notify(exc: ServerBusy) -> None:
            waits.append(exc.timeout_s)
            if len(waits) == 2:
                srv.release.set()

        patience = Patience(0.2)
        got = retry_busy(lambda t: client.get_json("/api/ps", t), notify, patience)
        assert got == {"models": ["m"]} and waits == [0.2, 0.4]
        assert len(srv.asked) == 3 and patience.timeout == 0.2  # back to the first wait


def test_retry_busy_gives_an_absent_server_back_at_once() -> None:
    told: list[ServerBusy] = []
    with closed_port() as port, pytest.raises(ServerAbsent):
        client = ServerClient(f"http://127.0.0.1:{port}")
        retry_busy(lambda t: client.get_json("/api/ps", t), told.append)
    assert told == []


def test_patience_doubles_up_to_a_minute_and_starts_over_after_an_answer() -> None:
    p = Patience()
    seen = [p.timeout]
    for _ in range(5):
        p.busy()
        seen.append(p.timeout)
    assert seen == [5, 10, 20, 40, 60, 60]
    p.answered()
    assert p.timeout == 5


def test_http_errors_say_the_status_and_the_servers_detail() -> None:
    routes = {
        "/api/budget": Answer({"error": "unknown device 'GPU9'"}, 400, held=False),
        "/v1/models": Answer({"error": {"message": "too many", "type": "x"}}, 429,
                             held=False),
        "/api/ps": Answer({"error": "Missing or wrong API key"}, 401, held=False),
    }
    with held_server(routes) as srv:
        client = ServerClient(srv.url)
        with pytest.raises(ServerHTTPError) as refused:
            client.post_json("/api/budget", {"device": "GPU9", "bytes": 1})
        assert str(refused.value) == f"the server at {srv.url} answered 400: unknown device 'GPU9'"
        assert refused.value.status == 400 and refused.value.detail == "unknown device 'GPU9'"
        with pytest.raises(ServerHTTPError, match=r"answered 429: too many$"):
            client.get_json("/v1/models")
        with pytest.raises(ServerHTTPError, match="answered 401: it needs an API key; pass "
                                                  "--api-key KEY or set it with"):
            client.get_json("/api/ps")
        with pytest.raises(ServerHTTPError, match="answered 401: wrong API key; pass"):
            ServerClient(srv.url, "k").get_json("/api/ps")
        assert srv.asked[-1].authorization == "Bearer k" and srv.asked[0].authorization is None
        assert ServerClient(srv.url, "k").answers()  # any HTTP answer is a server there


def test_an_answer_that_is_not_json_is_not_our_server() -> None:
    with held_server({"/api/ps": Answer("<html>hello</html>", held=False)}) as srv:
        with pytest.raises(ServerAbsent, match=r"its answer to /api/ps is not JSON"):
            ServerClient(srv.url).get_json("/api/ps")
        assert ServerClient(srv.url).get_text("/api/ps") == "<html>hello</html>"


def test_error_detail_reads_every_dialect() -> None:
    assert error_detail(b'{"error": "gone"}') == "gone"
    assert error_detail(b'{"error": {"message": "bad", "type": "t"}}') == "bad"
    assert error_detail(b'{"type": "error", "error": {"type": "t", "message": "x"}}') == "x"
    assert error_detail(b'{"detail": "Not Found"}') == "Not Found"
    assert error_detail(b"plain words\n") == "plain words"


def test_server_base_from_url_options_and_config(monkeypatch: pytest.MonkeyPatch) -> None:
    assert server_base("http://h:1/") == "http://h:1"
    with pytest.raises(UsageError, match="--url must start with http"):
        server_base("ftp://h")
    assert server_base(host="0.0.0.0", port=8) == "http://127.0.0.1:8"
    assert server_base(host="::", port=8) == "http://127.0.0.1:8"
    assert server_base(host="::1", port=8) == "http://[::1]:8"
    assert server_base(host="[::1]", port=8) == "http://[::1]:8"
    assert server_base() == "http://127.0.0.1:11434"  # the config's defaults
    monkeypatch.setenv("INFERENCEOS_SERVER_HOST", "0.0.0.0")
    monkeypatch.setenv("INFERENCEOS_SERVER_PORT", "8089")
    assert server_base() == "http://127.0.0.1:8089"
    assert server_base(port=9) == "http://127.0.0.1:9"
    monkeypatch.setenv("INFERENCEOS_SERVER_API_KEY", "from-config")
    assert configured_key(None) == "from-config"
    assert configured_key("") == "" and configured_key("k") == "k"
    assert ServerClient.configured(host="::1", api_key=None).api_key == "from-config"
