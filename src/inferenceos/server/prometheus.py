"""A minimal Prometheus text-format registry (counters, gauges, histograms, collectors).

Enough for /metrics without a dependency, and one registry per app (tests start
several apps in one process). Exposition follows the text format 0.0.4.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Sequence

Labels = tuple[tuple[str, str], ...]
Sample = tuple[str, Labels, float]  # name suffix ("", "_bucket", ...), labels, value


def _fmt_labels(labels: Labels) -> str:
    if not labels:
        return ""
    esc = (v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"") for _, v in labels)
    return "{" + ",".join(f'{k}="{v}"' for (k, _), v in zip(labels, esc, strict=True)) + "}"


def _fmt_value(v: float) -> str:
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v)) if not float(v).is_integer() else str(int(v))


class Metric:
    """Base: a named family with help text and a kind (counter, gauge, histogram)."""

    kind = "untyped"

    def __init__(self, name: str, help: str) -> None:
        self.name = name
        self.help = help
        self._lock = threading.Lock()

    def samples(self) -> Iterable[Sample]:
        raise NotImplementedError

    def render(self) -> str:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]
        lines += [f"{self.name}{sfx}{_fmt_labels(lb)} {_fmt_value(v)}"
                  for sfx, lb, v in self.samples()]
        return "\n".join(lines)


class Counter(Metric):
    kind = "counter"

    def __init__(self, name: str, help: str) -> None:
        super().__init__(name, help)
        self._values: dict[Labels, float] = {}

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, **labels: str) -> float:
        return self._values.get(tuple(sorted(labels.items())), 0.0)

    def samples(self) -> Iterable[Sample]:
        with self._lock:
            return [("", k, v) for k, v in sorted(self._values.items())]


class Histogram(Metric):
    kind = "histogram"

    def __init__(self, name: str, help: str, buckets: Sequence[float]) -> None:
        super().__init__(name, help)
        self.buckets = (*sorted(buckets), math.inf)
        self._series: dict[Labels, list[float]] = {}  # bucket counts..., sum, count

    def observe(self, value: float, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            s = self._series.setdefault(key, [0.0] * (len(self.buckets) + 2))
            for i, le in enumerate(self.buckets):
                if value <= le:
                    s[i] += 1
            s[-2] += value
            s[-1] += 1

    def samples(self) -> Iterable[Sample]:
        out: list[Sample] = []
        with self._lock:
            for key, s in sorted(self._series.items()):
                for le, n in zip(self.buckets, s, strict=False):
                    out.append(("_bucket", (*key, ("le", _fmt_value(le))), n))
                out += [("_sum", key, s[-2]), ("_count", key, s[-1])]
        return out


class Collected(Metric):
    """A family whose samples a callback computes at scrape time (gauges mostly)."""

    def __init__(self, name: str, help: str, kind: str,
                 collect: Callable[[], Iterable[tuple[dict[str, str], float]]]) -> None:
        super().__init__(name, help)
        self.kind = kind
        self._collect = collect

    def samples(self) -> Iterable[Sample]:
        return [("", tuple(sorted(lb.items())), v) for lb, v in self._collect()]


class Registry:
    """An ordered set of metric families rendered together."""

    def __init__(self) -> None:
        self._metrics: list[Metric] = []

    def add(self, metric: Metric) -> Metric:
        self._metrics.append(metric)
        return metric

    def render(self) -> str:
        return "\n".join(m.render() for m in self._metrics) + "\n"
