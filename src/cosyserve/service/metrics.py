"""Prometheus metrics, all named `cosyserve_*`, on a registry private to one `Metrics` object.

A private registry (not prometheus_client's global one) lets tests and several apps in one process each
have their own. GPU and process gauges are read at scrape time, the GPUs through NVML (`service.gpu`),
which opens no CUDA context: an API node or a machine without a GPU simply exports no GPU series.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from cosyserve.service.gpu import gpu_report
from cosyserve.service.metric_series import Series
from cosyserve.service.quality.metrics import TakeMetrics

PREFIX = "cosyserve_"
_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_RTF_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)


class Metrics:
    """The service's metrics. Also implements the scheduler's `SchedulerMetrics` hooks."""

    def __init__(self, registry: CollectorRegistry | None = None, *, system: bool = True) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        series = Series(self.registry)
        self.requests_total = series.counter(
            "cosyserve_requests", "HTTP requests by route and status code", ["route", "status"]
        )
        self.request_duration_seconds = series.histogram(
            "cosyserve_request_duration_seconds", "HTTP request duration", _LATENCY_BUCKETS, ["route"]
        )
        self.queue_depth = series.gauge("cosyserve_queue_depth", "jobs waiting for a worker")
        self.in_flight = series.gauge("cosyserve_in_flight", "jobs running on a worker")
        self.jobs_total = series.counter("cosyserve_jobs", "finished jobs by final state", ["state"])
        self.job_duration_seconds = series.histogram(
            "cosyserve_job_duration_seconds", "time a job ran on a worker", _LATENCY_BUCKETS
        )
        self.queue_wait_seconds = series.histogram(
            "cosyserve_queue_wait_seconds", "time a job waited before it started", _LATENCY_BUCKETS
        )
        self.wait_estimate_error_seconds = series.histogram(
            "cosyserve_wait_estimate_error_seconds",
            "actual wait before a start minus the wait estimated when it was queued, by class "
            "(positive: it waited longer than said)",
            (-60, -20, -5, -2, -1, -0.5, -0.1, 0.1, 0.5, 1, 2, 5, 20, 60),
            ["work_class"],
        )
        self.wait_estimate_ratio = series.histogram(
            "cosyserve_wait_estimate_ratio",
            "actual wait over estimated wait (waits of a second or more either way), by class",
            (0.25, 0.5, 0.67, 0.8, 1.0, 1.25, 1.5, 2.0, 4.0),
            ["work_class"],
        )
        self.audio_seconds_total = series.counter("cosyserve_audio_seconds", "seconds of audio synthesised")
        self.real_time_factor = series.histogram(
            "cosyserve_real_time_factor",
            "compute seconds per second of audio (below 1: faster than real time)",
            _RTF_BUCKETS,
        )
        self.first_chunk_latency_seconds = series.histogram(
            "cosyserve_first_chunk_latency_seconds",
            "from submission to the first audio of a streamed request, taken where the engine produced it",
            _LATENCY_BUCKETS,
        )
        self.errors_total = series.counter("cosyserve_errors", "failures by kind (error code)", ["kind"])
        self.model_loaded = series.gauge("cosyserve_model_loaded", "1 when the model is loaded and ready")
        self.takes = TakeMetrics(series)  # the take scores (`service.quality`)
        self.observe_take = self.takes.observe
        if system:
            self.registry.register(SystemCollector())

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

    def observe_wait_estimate(self, work_class: str, estimated_s: float, actual_s: float) -> None:
        """A ticket started: how far the wait it was told at submit was from the wait it had."""
        self.wait_estimate_error_seconds.labels(work_class=work_class).observe(actual_s - estimated_s)
        if max(actual_s, estimated_s) >= 1.0:
            ratio = actual_s / max(estimated_s, 1e-3)
            self.wait_estimate_ratio.labels(work_class=work_class).observe(ratio)

    def observe_first_chunk(self, seconds: float) -> None:
        self.first_chunk_latency_seconds.observe(seconds)

    def observe_synthesis(self, audio_s: float, compute_s: float) -> None:
        """After each finished synthesis: audio produced and the compute time it took."""
        if audio_s > 0:
            self.audio_seconds_total.inc(audio_s)
            self.real_time_factor.observe(compute_s / audio_s)

    def count_audio(self, audio_s: float) -> None:
        """Audio a stream sent before it was left (no finished synthesis counts it)."""
        if audio_s > 0:
            self.audio_seconds_total.inc(audio_s)

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


class SyncCollector(Collector):
    """The S3 sync as its `status()` reads at scrape time: uploads waiting to be tried again after a
    failure (`cosyserve_s3_failing`, 0 when everything got there), queued, done and given up."""

    def __init__(self, sync: Any) -> None:
        self._sync = sync

    def collect(self) -> Iterator[Any]:
        status = self._sync.status()
        yield GaugeMetricFamily(
            f"{PREFIX}s3_failing", "uploads that gave up and wait to be tried again", value=status["failing"]
        )
        yield GaugeMetricFamily(f"{PREFIX}s3_pending", "uploads and deletes queued", value=status["pending"])
        yield CounterMetricFamily(f"{PREFIX}s3_uploads", "objects uploaded", value=status["uploaded"])
        yield CounterMetricFamily(
            f"{PREFIX}s3_failures", "uploads and deletes that gave up", value=status["failed_total"]
        )


class SystemCollector(Collector):
    """GPU name, memory, utilisation and temperature (NVML, no CUDA context), process RSS; a value that
    cannot be read is left out, and a machine without a GPU exports no GPU series."""

    def __init__(self, reader: Any = None) -> None:
        self._read = reader.read if reader is not None else gpu_report

    def collect(self) -> Iterator[GaugeMetricFamily]:
        rss = process_rss_bytes()
        if rss is not None:
            yield GaugeMetricFamily(f"{PREFIX}process_resident_memory_bytes", "resident memory", value=rss)
        gpus = self._read().gpus
        if not gpus:
            return
        labels = ["device", "name"]
        families = {
            "used": GaugeMetricFamily(
                f"{PREFIX}accelerator_memory_used_bytes", "GPU memory used", labels=labels
            ),
            "free": GaugeMetricFamily(
                f"{PREFIX}accelerator_memory_free_bytes", "GPU memory free", labels=labels
            ),
            "total": GaugeMetricFamily(
                f"{PREFIX}accelerator_memory_total_bytes", "GPU memory", labels=labels
            ),
            "util": GaugeMetricFamily(
                f"{PREFIX}accelerator_utilization_ratio",
                "GPU busy fraction over the last sample",
                labels=labels,
            ),
            "temp": GaugeMetricFamily(
                f"{PREFIX}accelerator_temperature_celsius", "GPU core temperature", labels=labels
            ),
        }
        for gpu in gpus:
            key = [str(gpu.index), gpu.name]
            families["used"].add_metric(key, gpu.memory_used_bytes)
            families["free"].add_metric(key, gpu.memory_free_bytes)
            families["total"].add_metric(key, gpu.memory_total_bytes)
            if gpu.utilization is not None:
                families["util"].add_metric(key, gpu.utilization)
            if gpu.temperature_c is not None:
                families["temp"].add_metric(key, gpu.temperature_c)
        for family in families.values():
            if family.samples:
                yield family

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


def accelerator_stats() -> dict[int, dict[str, Any]]:
    """{device index: {memory_used_bytes, memory_total_bytes, utilization, name, ...}}; {} without a GPU."""
    return {gpu.index: gpu.as_dict() for gpu in gpu_report().gpus}
