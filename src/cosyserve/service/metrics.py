"""Prometheus metrics, all named `cosyserve_*`, on a registry private to one `Metrics` object.

A private registry (not prometheus_client's global one) lets tests and several apps in one process each
have their own. Accelerator and process gauges are read at scrape time: NVML (pynvml) when importable,
else torch.cuda if torch is already loaded by the engine (never imported just for a scrape).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

PREFIX = "cosyserve_"
_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_RTF_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)


class Metrics:
    """The service's metrics. Also implements the scheduler's `SchedulerMetrics` hooks."""

    def __init__(self, registry: CollectorRegistry | None = None, *, system: bool = True) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests_total = Counter(
            "cosyserve_requests", "HTTP requests by route and status code", ["route", "status"], registry=r
        )
        self.request_duration_seconds = Histogram(
            "cosyserve_request_duration_seconds",
            "HTTP request duration",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge("cosyserve_queue_depth", "jobs waiting for a worker", registry=r)
        self.in_flight = Gauge("cosyserve_in_flight", "jobs running on a worker", registry=r)
        self.jobs_total = Counter("cosyserve_jobs", "finished jobs by final state", ["state"], registry=r)
        self.job_duration_seconds = Histogram(
            "cosyserve_job_duration_seconds",
            "time a job ran on a worker",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_wait_seconds = Histogram(
            "cosyserve_queue_wait_seconds",
            "time a job waited before it started",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.audio_seconds_total = Counter(
            "cosyserve_audio_seconds", "seconds of audio synthesised", registry=r
        )
        self.real_time_factor = Histogram(
            "cosyserve_real_time_factor",
            "compute seconds per second of audio (below 1: faster than real time)",
            buckets=_RTF_BUCKETS,
            registry=r,
        )
        self.first_chunk_latency_seconds = Histogram(
            "cosyserve_first_chunk_latency_seconds",
            "from submission to the first audio of a streamed request, taken where the engine produced it",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.errors_total = Counter("cosyserve_errors", "failures by kind (error code)", ["kind"], registry=r)
        self.model_loaded = Gauge(
            "cosyserve_model_loaded", "1 when the model is loaded and ready", registry=r
        )
        if system:
            r.register(SystemCollector())

    # -- hooks --------------------------------------------------------------------------------------------

    def observe_request(self, route: str, status: int, seconds: float) -> None:
        """`route` is the route template (`/v1/jobs/{job_id}`), never the raw path: keeps labels bounded."""
        self.requests_total.labels(route=route, status=str(status)).inc()
        self.request_duration_seconds.labels(route=route).observe(seconds)

    def observe_queue(self, depth: int, in_flight: int) -> None:
        self.queue_depth.set(depth)
        self.in_flight.set(in_flight)

    def observe_job(self, state: str, run_s: float | None, wait_s: float) -> None:
        self.jobs_total.labels(state=state).inc()
        self.queue_wait_seconds.observe(wait_s)
        if run_s is not None:
            self.job_duration_seconds.observe(run_s)

    def observe_first_chunk(self, seconds: float) -> None:
        self.first_chunk_latency_seconds.observe(seconds)

    def observe_synthesis(self, audio_s: float, compute_s: float) -> None:
        """After each finished synthesis: audio produced and the compute time it took."""
        if audio_s > 0:
            self.audio_seconds_total.inc(audio_s)
            self.real_time_factor.observe(compute_s / audio_s)

    def count_error(self, kind: str) -> None:
        self.errors_total.labels(kind=kind).inc()

    def set_model_loaded(self, loaded: bool) -> None:
        self.model_loaded.set(1 if loaded else 0)

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type, for `GET /metrics`."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def names(self) -> list[str]:
        """Every exported sample name (for tests and docs)."""
        return sorted({s.name for family in self.registry.collect() for s in family.samples})


class SystemCollector(Collector):
    """Accelerator memory and utilisation, process RSS; a value that cannot be read is left out."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        rss = process_rss_bytes()
        if rss is not None:
            yield GaugeMetricFamily(f"{PREFIX}process_resident_memory_bytes", "resident memory", value=rss)
        devices = accelerator_stats()
        if not devices:
            return
        used = GaugeMetricFamily(
            f"{PREFIX}accelerator_memory_used_bytes", "GPU memory used", labels=["device"]
        )
        total = GaugeMetricFamily(f"{PREFIX}accelerator_memory_total_bytes", "GPU memory", labels=["device"])
        util = GaugeMetricFamily(
            f"{PREFIX}accelerator_utilization_ratio",
            "GPU busy fraction over the last sample",
            labels=["device"],
        )
        for index, stats in devices.items():
            used.add_metric([str(index)], stats["memory_used_bytes"])
            total.add_metric([str(index)], stats["memory_total_bytes"])
            if stats.get("utilization") is not None:
                util.add_metric([str(index)], stats["utilization"])
        yield used
        yield total
        if util.samples:
            yield util

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())  # values come and go with the hardware: nothing to pre-declare


def process_rss_bytes() -> int | None:
    """Current resident set size (Linux /proc; psutil elsewhere if installed)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil  # type: ignore[import-not-found]
    except ImportError:
        return None
    return int(psutil.Process().memory_info().rss)


_nvml_state: dict[str, Any] = {}


def accelerator_stats() -> dict[int, dict[str, Any]]:
    """{device index: {memory_used_bytes, memory_total_bytes, utilization (0..1 or None)}}; {} if none."""
    stats = _nvml_stats()
    if stats is not None:
        return stats
    torch = sys.modules.get("torch")  # only if the engine already loaded it: importing takes seconds
    if torch is None:
        return {}
    try:
        if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
            return {}
        out = {}
        for index in range(torch.cuda.device_count()):
            free, total = torch.cuda.mem_get_info(index)
            out[index] = {"memory_used_bytes": total - free, "memory_total_bytes": total, "utilization": None}
        return out
    except Exception:  # a scrape must not fail because a driver call did
        return {}


def _nvml_stats() -> dict[int, dict[str, Any]] | None:
    if _nvml_state.get("unavailable"):
        return None
    try:
        import pynvml  # type: ignore[import-not-found]

        if not _nvml_state.get("initialised"):
            pynvml.nvmlInit()
            _nvml_state["initialised"] = True
        out = {}
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            busy = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0
            out[index] = {
                "memory_used_bytes": memory.used,
                "memory_total_bytes": memory.total,
                "utilization": busy,
            }
        return out
    except Exception:  # not installed, no driver, no GPU: fall back once and stop trying
        _nvml_state["unavailable"] = True
        return None
