"""The server's metrics, named after vLLM's (`vllm:` → `inferenceos:`), on
`prometheus-client` (one `CollectorRegistry` per server: tests run several in one
process).

Histograms: time to first token, inter-token latency, end-to-end latency (seconds).
Counters: prompt and generation tokens, finished requests by reason, rejected requests,
HTTP responses by route and status, speculative decoding (vLLM's `spec_decode_*`:
draft tokens proposed and accepted, and decode steps, so that acceptance rate =
accepted / draft tokens and tokens per verification step = (decode steps + accepted) /
decode steps). Computed at scrape time (`Scraped`): requests running and waiting,
models loaded, KV cache usage per model, model loads and evictions, live migrations by
reason and direction and the sequence-state bytes they moved.

Adding a metric (one line here, one in docs/api.md, which tests/server/ops/test_server_metrics.py
checks against a scrape):

- updated where it happens: `self.x = Counter(P + "x_total", "help",
  ["model_name"], registry=self.registry)`; the caller does
  `state.metrics.x.labels(model_name=name).inc()` (prometheus-client's own API).
- kept by a lower layer (the manager, an engine): `self.scraped(P + "x_total", "help",
  "counter", lambda: [({"model_name": m}, float(n)) for m, n in ...])` — the callback
  runs at each scrape, must be quick, and must not raise.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics

from inferenceos.server.ops.prometheus import Collect, Scraped, exposition

# No `<name>_created` series: the text format carries them as extra gauges, which
# doubled the counters' lines and meant nothing to a dashboard. Process-wide, as
# prometheus-client offers it.
disable_created_metrics()

P = "inferenceos:"
_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
         7.5, 10.0, 20.0, 40.0, 80.0)
_ITL = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1,
        0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
_E2E = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
        120.0, 240.0, 480.0)
_MODEL = ("model_name",)
# label names in sorted order: a scrape lists labels as the hand-written registry did,
# for readers that match a line's start (`name{finished_reason="abort"`)


class ServerMetrics:
    """Every metric family of one server (module doc); `registry` is its own."""

    def __init__(self, running: Collect, waiting: Collect, loaded: Collect,
                 kv_usage: Collect, loads: Collect, evictions: Collect,
                 migrations: Collect = lambda: (),
                 migration_bytes: Collect = lambda: ()) -> None:
        r = self.registry = CollectorRegistry()
        self.ttft = Histogram(P + "time_to_first_token_seconds",
                              "Time from request arrival to the first generated token",
                              _MODEL, buckets=_TTFT, registry=r)
        self.itl = Histogram(P + "inter_token_latency_seconds",
                             "Time between consecutive generated tokens", _MODEL,
                             buckets=_ITL, registry=r)
        self.e2e = Histogram(P + "e2e_request_latency_seconds",
                             "Time from request arrival to its last token", _MODEL,
                             buckets=_E2E, registry=r)
        self.prompt_tokens = Counter(P + "prompt_tokens_total", "Prompt tokens processed",
                                     _MODEL, registry=r)
        self.generation_tokens = Counter(P + "generation_tokens_total", "Tokens generated",
                                         _MODEL, registry=r)
        self.success = Counter(P + "request_success_total",
                               "Finished generation requests by finish reason",
                               ("finished_reason", "model_name"), registry=r)
        self.rejected = Counter(P + "requests_rejected_total",
                                "Requests refused before running (queue_full, draining)",
                                ("reason",), registry=r)
        self.direct_tokens = Counter(
            P + "direct_written_tokens_total",
            "Generated tokens the model worker wrote to their clients itself "
            "(server.direct_writes), also counted in generation_tokens_total",
            _MODEL, registry=r)
        self.http = Counter(P + "http_requests_total", "HTTP responses by route and status",
                            ("method", "route", "status"), registry=r)
        self.draft_tokens = Counter(P + "spec_decode_num_draft_tokens_total",
                                    "Draft tokens proposed for verification",
                                    ("drafter", "model_name"), registry=r)
        self.accepted_tokens = Counter(P + "spec_decode_num_accepted_tokens_total",
                                       "Draft tokens the model accepted",
                                       ("drafter", "model_name"), registry=r)
        self.decode_steps = Counter(P + "spec_decode_num_steps_total",
                                    "Decode (verification) steps of finished requests",
                                    _MODEL, registry=r)
        self.scraped(P + "num_requests_running", "Requests being served", "gauge", running)
        self.scraped(P + "num_requests_waiting", "Requests queued", "gauge", waiting)
        self.scraped(P + "models_loaded", "Models loaded in memory", "gauge", loaded)
        self.scraped(P + "kv_cache_usage_perc",
                     "Fraction of the KV cache in use per model (0-1)", "gauge", kv_usage)
        self.scraped(P + "model_loads_total", "Models loaded", "counter", loads)
        self.scraped(P + "model_evictions_total",
                     "Models unloaded, by reason (expired, memory, unload, ...)",
                     "counter", evictions)
        self.scraped(P + "migrations_total",
                     "Live migrations of a loaded model to a new placement, by reason "
                     "(memory, cap, recovered, requested) and direction (down, up, same)",
                     "counter", migrations)
        self.scraped(P + "migration_bytes_total",
                     "Sequence-state (KV) bytes carried across live migrations, by direction",
                     "counter", migration_bytes)

    def scraped(self, name: str, help: str, kind: str, collect: Collect) -> None:
        """Register a family that `collect` computes at each scrape (module doc)."""
        self.registry.register(Scraped(name, help, kind, collect))

    def render(self) -> tuple[bytes, str]:
        """One scrape: (body, content type), Prometheus text format 0.0.4."""
        return exposition(self.registry)
