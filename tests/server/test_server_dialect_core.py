"""The dialect core of server/ (issue 27): each route module translates its API's
request into the core's and renders the core's result; what they share lives in
dialect-neutral modules, so no route module imports a peer route module."""

from __future__ import annotations

import ast
from pathlib import Path

SERVER = Path(__file__).resolve().parents[2] / "src" / "inferenceos" / "server"
# every route module: server/dialects/*/routes.py (and model_routes, sessions_routes),
# server/ops/routes.py and budget_routes.py, server/ui_routes.py
ROUTE_MODULES = sorted(p for p in SERVER.rglob("*.py")
                       if p.stem == "routes" or p.stem.endswith("_routes"))


def _is_route_module(module: str) -> bool:
    name = module.rsplit(".", 1)[-1]
    return name == "routes" or name.endswith("_routes")


def _imported_modules(path: Path) -> set[str]:
    """Every inferenceos.server module `path` imports (functions included)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m.startswith("inferenceos.server.")}


def test_route_modules_import_no_peer_route_module() -> None:
    assert len(ROUTE_MODULES) >= 10  # 5 dialects' routes, 2 more of theirs, ops' 2, ui
    for path in ROUTE_MODULES:
        peers = {m for m in _imported_modules(path) if _is_route_module(m)}
        assert not peers, f"{path.relative_to(SERVER)} imports {sorted(peers)}"


def test_route_modules_reach_the_state_one_way() -> None:
    """`state_of(request)` (server/state.py) is the one accessor; no route module
    writes its own."""
    for path in ROUTE_MODULES:
        text = path.read_text()
        assert "def _state(" not in text, path.name
        assert "app.state.ios" not in text, path.name


def test_output_formats_become_grammars_in_one_place() -> None:
    from inferenceos.server.errors import APIError
    from inferenceos.server.json_grammar import (
        JSON_OBJECT_GBNF,
        grammar_for_schema,
        output_grammar,
    )

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    assert output_grammar(None) is None
    assert output_grammar("text") is None
    assert output_grammar("json_object") == JSON_OBJECT_GBNF
    assert output_grammar("json_object", schema) == grammar_for_schema(schema)
    assert output_grammar("json_schema", schema) == grammar_for_schema(schema)
    try:
        output_grammar("xml", None, "text.format")
    except APIError as exc:
        assert (exc.status, exc.message) == (400, "text.format 'xml' is not supported")
    else:
        raise AssertionError("an unknown format kind was accepted")
    for path in SERVER.glob("*.py"):
        if path.name != "json_grammar.py":
            text = path.read_text()
            assert "grammar_for_schema" not in text and "JSON_OBJECT_GBNF" not in text, \
                f"{path.name} turns a format into a grammar itself"


def test_request_sampling_reads_the_shared_fields() -> None:
    from types import SimpleNamespace

    from inferenceos.server.options import request_sampling

    body = SimpleNamespace(temperature=0.5, top_k=7, seed=3, stop=["x"])  # no top_p, ...
    s = request_sampling(body, max_tokens=9, grammar=None)
    assert (s.temperature, s.top_k, s.seed, s.max_tokens) == (0.5, 7, 3, 9)
    assert s.stop == ()  # stop is each dialect's own (a string or a list): not shared
    assert request_sampling(body, temperature=1.0).temperature == 1.0  # the dialect's wins


def test_replies_are_read_in_one_place() -> None:
    """Tool calls and reasoning are read by reply.py for every dialect: no route
    module holds text back or parses calls itself."""
    for path in ROUTE_MODULES:
        text = path.read_text()
        for name in ("ToolCallStream", "parse_tool_calls", "ThinkingSplit", "split_reasoning"):
            assert name not in text, f"{path.name} uses {name} itself"


def test_reply_text_holds_calls_back_after_the_reasoning() -> None:
    from inferenceos.server.reasoning import reasoning_of
    from inferenceos.server.reply import ReplyText, read_reply
    from inferenceos.server.tool_calls import detect_format

    fmt = detect_format("{% for t in tools %}<tool_call>{{ t }}</tool_call>{% endfor %}")
    assert fmt is not None
    fmt = fmt.bound([{"name": "f", "parameters": {"type": "object"}}])
    reasoning = reasoning_of("{{ content.split('</think>')[-1] }} <think>")  # as Qwen3's
    whole = '<think>hm</think>ok <tool_call>{"name": "f", "arguments": {}}</tool_call>'
    thought, answer, calls = read_reply(whole, fmt, reasoning)
    assert (thought, answer.strip(), [c.name for c in calls]) == ("hm", "ok", ["f"])
    reply = ReplyText(fmt, reasoning)
    pieces = [reply.feed(p) for p in (whole[:9], whole[9:20], whole[20:])]
    end = reply.finish()
    sent = "".join(t for _, t in pieces) + end[1]
    assert "".join(th for th, _ in pieces) + end[0] == "hm"
    assert "<tool_call>" not in sent and sent.strip() == "ok"
    assert [c.name for c in end[2]] == ["f"]
    assert ReplyText(None).feed("<tool_call>x") == ("", "<tool_call>x")  # no tools: as is


def test_every_route_declares_its_error_dialect() -> None:
    from inferenceos.server.app import ROUTERS
    from inferenceos.server.errors import DialectRoute

    for router in ROUTERS:
        for route in router.routes:
            assert isinstance(route, DialectRoute), getattr(route, "path", route)


def _dialect_app() -> object:
    """Three routers of three dialects (two sharing /v1), behind the body limit."""
    from fastapi import APIRouter, FastAPI

    from inferenceos.server.errors import APIError, Dialect, install_handlers, route_class
    from inferenceos.server.security import BodyLimit

    routers = [APIRouter(prefix=p, route_class=route_class(d)) for p, d in (
        ("/v1", Dialect.OPENAI), ("/v1", Dialect.ANTHROPIC), ("/api", Dialect.OLLAMA))]
    for router, path in zip(routers, ("/chat", "/messages", "/chat"), strict=True):
        @router.post(path)
        async def busy() -> None:
            raise APIError(503, "busy", "model_busy")
    app = FastAPI()
    install_handlers(app, routers)
    for router in routers:
        app.include_router(router)
    app.add_middleware(BodyLimit, max_bytes=16)
    return app


def test_errors_answer_in_the_dialect_of_the_route() -> None:
    from fastapi.testclient import TestClient

    client = TestClient(_dialect_app())  # type: ignore[arg-type]
    r = client.post("/v1/chat")
    assert r.status_code == 503
    assert r.json() == {"error": {"message": "busy", "type": "server_error", "param": None,
                                  "code": "model_busy"}}
    r = client.post("/v1/messages")
    assert r.status_code == 529
    assert r.json()["type"] == "error"
    assert r.json()["error"] == {"type": "overloaded_error", "message": "busy"}
    r = client.post("/api/chat")
    assert (r.status_code, r.json()) == (503, {"error": "busy"})
    # a method the route does not take: still that route's dialect
    r = client.get("/v1/messages")
    assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error"
    assert "request_id" in r.json()


def test_refusals_before_routing_speak_the_routes_dialect() -> None:
    from fastapi.testclient import TestClient

    client = TestClient(_dialect_app())  # type: ignore[arg-type]
    big = b"x" * 64
    r = client.post("/v1/messages", content=big)
    assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"
    r = client.post("/v1/chat", content=big)
    assert r.status_code == 413 and r.json()["error"]["type"] == "invalid_request_error"
    r = client.post("/api/chat", content=big)
    assert r.status_code == 413 and isinstance(r.json()["error"], str)


def test_paths_no_route_serves_speak_their_url_spaces_dialect() -> None:
    from fastapi.testclient import TestClient

    client = TestClient(_dialect_app())  # type: ignore[arg-type]
    assert client.get("/v1/nothing").json()["error"]["type"] == "not_found_error"
    assert client.get("/v1/nothing").json()["error"]["code"] is None  # OpenAI's shape
    assert client.get("/v1/messages/batches").json()["type"] == "error"  # Anthropic's
    assert client.get("/nothing").json() == {"error": "Not Found"}  # Ollama's
