"""Prometheus series on one registry, one line each: `Series(registry).histogram(name, doc, buckets)`.

The service's metrics (`service.metrics`) and the take scores' (`service.quality.metrics`) are made here,
so that a series always lands on the registry its owner was given and never on prometheus_client's global
one (tests and several apps in one process each have their own).
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Series:
    """Makes counters, gauges and histograms on `registry`; `labels` are the series' label names."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def counter(self, name: str, doc: str, labels: Sequence[str] = ()) -> Counter:
        return Counter(name, doc, list(labels), registry=self.registry)

    def gauge(self, name: str, doc: str, labels: Sequence[str] = ()) -> Gauge:
        return Gauge(name, doc, list(labels), registry=self.registry)

    def histogram(
        self, name: str, doc: str, buckets: Sequence[float], labels: Sequence[str] = ()
    ) -> Histogram:
        return Histogram(name, doc, list(labels), buckets=tuple(buckets), registry=self.registry)
