"""/metrics on a real server, read by prometheus-client's own parser: every family
docs/api.md's table names is in a scrape with the type it states (and nothing the table
leaves out); the text format even when OpenMetrics is asked for; a live migration (a
cap lowered over the API while a stream runs) moves the migration counters."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from inferenceos.plan.entry import LoadRequest
from server_harness import serving

API_MD = Path(__file__).resolve().parents[3] / "docs" / "api.md"
P = "inferenceos:"
ROW = re.compile(r"^\s*\| `([a-z0-9_:]+)` \| (counter|gauge|histogram) \|")


def documented() -> dict[str, str]:
    """{exposed family name: type} from docs/api.md's /metrics table."""
    rows = [ROW.match(line) for line in API_MD.read_text().splitlines()]
    return {m.group(1): m.group(2) for m in rows if m}


def scrape(url: str, accept: str | None = None) -> dict[str, tuple[str, list]]:
    """{family name as exposed (counters with _total): (type, samples)} of one scrape,
    parsed by prometheus-client's own parser of the text format."""
    r = httpx.get(url + "/metrics", headers={"Accept": accept} if accept else {}, timeout=30)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    families = text_string_to_metric_families(r.text)
    out = {}
    for f in families:
        name = f.name + "_total" if f.type == "counter" else f.name
        out[name] = (f.type, f.samples)
    return out


def value(families: dict[str, tuple[str, list]], name: str, **labels: str) -> float:
    """The sum of the samples named `name` (a histogram's `_count` too) whose labels
    include `labels` (0 when none)."""
    return sum(s.value for _, samples in families.values() for s in samples
               if s.name == P + name
               and all(s.labels.get(k) == v for k, v in labels.items()))


def test_the_docs_table_is_parsed_and_names_at_least_the_vllm_families() -> None:
    names = documented()
    assert len(names) >= 19, names
    assert names["time_to_first_token_seconds"] == "histogram"
    assert names["num_requests_running"] == "gauge"
    assert names["migrations_total"] == "counter"


def test_a_scrape_has_every_documented_family_and_no_other(tiny_llama: Path,
                                                          tmp_path: Path) -> None:
    with serving({"tiny": tiny_llama}, tmp_path) as h:
        r = httpx.post(h.v1 + "/chat/completions", timeout=60, json={
            "model": "tiny", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 3})
        assert r.status_code == 200
        text = scrape(h.url)
        # what Prometheus 2 sends; the answer is the text format all the same
        om = scrape(h.url, "application/openmetrics-text;version=1.0.0,"
                           "text/plain;version=0.0.4;q=0.5")
    want = {P + n: t for n, t in documented().items()}
    got = {n: t for n, (t, _) in text.items()}
    assert got == want
    assert {n: t for n, (t, _) in om.items()} == want
    done, tiny = r.json()["usage"], "tiny:latest"
    assert value(text, "prompt_tokens_total", model_name=tiny) == done["prompt_tokens"]
    assert value(text, "generation_tokens_total") == done["completion_tokens"]
    assert value(text, "request_success_total", model_name=tiny) == 1
    assert value(text, "time_to_first_token_seconds_count", model_name=tiny) == 1
    assert value(text, "models_loaded") == 1 and value(text, "model_loads_total") == 1
    assert value(text, "http_requests_total", route="/v1/chat/completions",
                 status="200") == 1
    assert not any(n.endswith("_created") for n in got)  # no _created series
    assert value(text, "migrations_total") == 0


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny_models import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("wide") / "wide.gguf", "wide")


def test_a_live_migration_moves_the_migration_counters(
    wide: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As tests/server/ops/test_server_budget.py's migration: a stream runs, the CPU cap drops
    below what the model holds, the reactor migrates it down mid-stream."""
    monkeypatch.setenv("INFERENCEOS_PRESSURE_DWELL_S", "3600")  # a cap does not wait it
    base = LoadRequest(n_ctx=4096, n_batch=64, threads=1, type_k="f16", type_v="f16")
    body = {"model": "wide", "prompt": "ab cab", "n_predict": 3000, "temperature": 0,
            "ignore_eos": True, "stream": True}
    with serving({"wide": wide}, tmp_path, manager_kw={"base": base}) as h:
        httpx.post(h.url + "/completion", json={**body, "n_predict": 2, "stream": False},
                   timeout=60)
        charge = h.manager.loaded()[0].charge["CPU"]
        before = scrape(h.url)
        first = httpx.get(h.url + "/api/events").json()["last_id"]  # events are per process
        moved: list[dict] = []
        with httpx.stream("POST", h.url + "/completion", json=body, timeout=120) as r:
            for n, line in enumerate(r.iter_lines()):
                if line.startswith("data: "):
                    assert "error" not in json.loads(line[6:])
                if n == 5:
                    httpx.post(h.url + "/api/budget",
                               json={"device": "CPU", "bytes": int(charge * 0.8)})
                if n > 5 and n % 20 == 0:  # stop reading once the stream has moved
                    moved = httpx.get(h.url + "/api/events",
                                      params={"kind": "migration", "since": first},
                                      ).json()["events"]
                    if moved:
                        break
        after = scrape(h.url)
        seen = [e["text"] for e in httpx.get(h.url + "/api/events",
                                             params={"since": first}).json()["events"]]
    assert len(moved) == 1 and moved[0]["moved"] == 1, seen  # one migration, mid-stream
    assert value(before, "migrations_total") == 0
    assert value(after, "migrations_total", reason="cap", direction="down") == 1
    assert value(after, "migrations_total") == 1
    assert value(after, "migration_bytes_total", direction="down") > 0


def test_the_monitor_reads_scrapes_with_the_same_parser() -> None:
    from inferenceos.cli.monitor_cmd import parse_metrics
    from inferenceos.errors import InferenceOSError

    text = ('# TYPE inferenceos:prompt_tokens_total counter\n'
            'inferenceos:prompt_tokens_total{model_name="a"} 2.0\n'
            'inferenceos:prompt_tokens_total{model_name="b"} 3.0\n')
    assert parse_metrics(text) == {"inferenceos:prompt_tokens_total": 5.0}
    with pytest.raises(InferenceOSError, match="not Prometheus text"):
        parse_metrics("<html>a proxy's error page {</html>")


def test_a_failing_collector_empties_its_family_not_the_scrape(
        caplog: pytest.LogCaptureFixture) -> None:
    from inferenceos.server.ops.metrics import ServerMetrics

    def broken() -> list[tuple[dict[str, str], float]]:
        raise RuntimeError("the manager is gone")

    m = ServerMetrics(running=lambda: [({}, 3.0)], waiting=broken, loaded=lambda: [],
                      kv_usage=lambda: [], loads=lambda: [], evictions=lambda: [])
    body, content_type = m.render()
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    assert content_type.startswith("text/plain; version=0.0.4")
    assert [s.value for s in families[P + "num_requests_running"].samples] == [3.0]
    assert families[P + "num_requests_waiting"].samples == []
    assert "num_requests_waiting: its collector failed" in caplog.text
