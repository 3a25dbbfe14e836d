"""The server's metrics, named after vLLM's (`vllm:` → `inferenceos:`).

Histograms: time to first token, inter-token latency, end-to-end latency (seconds).
Counters: prompt and generation tokens, finished requests by reason, rejected requests,
HTTP responses by route and status, model loads and evictions, speculative decoding
(vLLM's `spec_decode_*`: draft tokens proposed and accepted, and decode steps, so that
acceptance rate = accepted / draft tokens and tokens per verification step =
(decode steps + accepted) / decode steps). Gauges computed at
scrape time: requests running and waiting, models loaded, KV cache usage per model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from inferenceos.server.prometheus import Collected, Counter, Histogram, Registry

P = "inferenceos:"
_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
         7.5, 10.0, 20.0, 40.0, 80.0)
_ITL = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1,
        0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
_E2E = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
        120.0, 240.0, 480.0)

Collect = Callable[[], Iterable[tuple[dict[str, str], float]]]


class ServerMetrics:
    """Every metric family of one server; gauges read their values through callbacks."""

    def __init__(self, running: Collect, waiting: Collect, loaded: Collect,
                 kv_usage: Collect, loads: Collect, evictions: Collect) -> None:
        r = self.registry = Registry()
        self.ttft = Histogram(P + "time_to_first_token_seconds",
                              "Time from request arrival to the first generated token", _TTFT)
        self.itl = Histogram(P + "inter_token_latency_seconds",
                             "Time between consecutive generated tokens", _ITL)
        self.e2e = Histogram(P + "e2e_request_latency_seconds",
                             "Time from request arrival to its last token", _E2E)
        self.prompt_tokens = Counter(P + "prompt_tokens_total", "Prompt tokens processed")
        self.generation_tokens = Counter(P + "generation_tokens_total", "Tokens generated")
        self.success = Counter(P + "request_success_total",
                               "Finished generation requests by finish reason")
        self.rejected = Counter(P + "requests_rejected_total",
                                "Requests refused before running (queue_full, draining)")
        self.http = Counter(P + "http_requests_total", "HTTP responses by route and status")
        self.draft_tokens = Counter(P + "spec_decode_num_draft_tokens_total",
                                    "Draft tokens proposed for verification")
        self.accepted_tokens = Counter(P + "spec_decode_num_accepted_tokens_total",
                                       "Draft tokens the model accepted")
        self.decode_steps = Counter(P + "spec_decode_num_steps_total",
                                    "Decode (verification) steps of finished requests")
        for m in (self.ttft, self.itl, self.e2e, self.prompt_tokens, self.generation_tokens,
                  self.success, self.rejected, self.http, self.draft_tokens,
                  self.accepted_tokens, self.decode_steps):
            r.add(m)
        r.add(Collected(P + "num_requests_running", "Requests being served", "gauge", running))
        r.add(Collected(P + "num_requests_waiting", "Requests queued", "gauge", waiting))
        r.add(Collected(P + "models_loaded", "Models loaded in memory", "gauge", loaded))
        r.add(Collected(P + "kv_cache_usage_perc",
                        "Fraction of the KV cache in use per model (0-1)", "gauge", kv_usage))
        r.add(Collected(P + "model_loads_total", "Models loaded", "counter", loads))
        r.add(Collected(P + "model_evictions_total",
                        "Models unloaded, by reason (expired, memory, unload, ...)",
                        "counter", evictions))

    def render(self) -> str:
        return self.registry.render()
