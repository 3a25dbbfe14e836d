"""Glue between the server and `prometheus-client`: scrape-time families and exposition.

The registry, counters, histograms and the text / OpenMetrics encoders are
`prometheus-client`'s own (what Prometheus, Grafana and the field's exporters are
tested against); this module adds only two things it leaves to its users:

- `Scraped`: one metric family whose samples a callback computes at scrape time (the
  gauges read from the model manager and the admission queue, and counters kept by a
  lower layer, such as the manager's loads and migrations). The callback returns
  `(labels dict, value)` pairs; a family may have different labels per sample.
- `exposition(registry)`: the body and content type of a scrape, always the Prometheus
  text format 0.0.4 (every Prometheus-compatible scraper reads it). Not OpenMetrics on
  request, as `prometheus_client`'s own handlers do (`choose_encoder`): its OpenMetrics
  writer turns the colon of `inferenceos:...` into `_` on sample lines but not on
  `# TYPE` lines under the `escaping=underscores` that Prometheus 2 negotiates, so the
  samples lose their type (prometheus/client_python#1177, open in 0.26).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator

from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector, CollectorRegistry

Collect = Callable[[], Iterable[tuple[dict[str, str], float]]]
log = logging.getLogger("inferenceos.server")
KINDS = ("gauge", "counter")


class Scraped(Collector):
    """A family computed by `collect` at each scrape. `name` is the exposed name: a
    counter's ends in `_total` (the family is named without it, as the exposition
    formats want). Register with `registry.register(Scraped(...))`."""

    def __init__(self, name: str, help: str, kind: str, collect: Collect) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
        if kind == "counter" and not name.endswith("_total"):
            raise ValueError(f"a counter's name ends in _total: {name!r}")
        self.name, self.help, self.kind, self._collect = name, help, kind, collect

    def _family(self) -> Metric:
        base = self.name.removesuffix("_total") if self.kind == "counter" else self.name
        return Metric(base, self.help, self.kind)

    def describe(self) -> Iterator[Metric]:
        """The empty family: lets the registry refuse a duplicate name at register
        time without calling `collect` (which may need a running server)."""
        yield self._family()

    def collect(self) -> Iterator[Metric]:
        """The family with this scrape's samples; a callback that fails gives it none
        this time (logged) rather than failing the whole scrape."""
        family = self._family()
        try:
            samples = [(dict(lb), float(v)) for lb, v in self._collect()]
        except Exception:  # one broken figure must not blank every other metric
            log.warning("metric %s: its collector failed; no samples this scrape",
                        self.name, exc_info=True)
            samples = []
        for labels, value in samples:
            family.add_sample(self.name, labels, value)
        yield family


def exposition(registry: CollectorRegistry) -> tuple[bytes, str]:
    """(body, content type) of one scrape of `registry`, Prometheus text format 0.0.4."""
    return generate_latest(registry), CONTENT_TYPE_PLAIN_0_0_4
