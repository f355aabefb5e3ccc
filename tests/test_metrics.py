"""Metrics: names, private registries, rendering; the service core never imports torch by itself."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from prometheus_client.parser import text_string_to_metric_families

from cosyserve.service.metrics import Metrics, accelerator_stats, process_rss_bytes


def exercised() -> Metrics:
    metrics = Metrics()
    metrics.observe_request("/v1/tts", 200, 0.3)
    metrics.observe_request("/v1/tts", 429, 0.001)
    metrics.observe_queue(3, 2)
    metrics.observe_job("done", 1.5, 0.2)
    metrics.observe_job("cancelled", None, 0.1)
    metrics.observe_first_chunk(0.4)
    metrics.observe_synthesis(audio_s=4.0, compute_s=2.0)
    metrics.count_error("invalid_input")
    metrics.set_model_loaded(True)
    return metrics


def test_every_name_starts_with_cosyserve() -> None:
    names = exercised().names()
    assert names and all(name.startswith("cosyserve_") for name in names)
    for expected in (
        "cosyserve_requests_total",
        "cosyserve_request_duration_seconds_bucket",
        "cosyserve_queue_depth",
        "cosyserve_in_flight",
        "cosyserve_jobs_total",
        "cosyserve_audio_seconds_total",
        "cosyserve_real_time_factor_bucket",
        "cosyserve_first_chunk_latency_seconds_bucket",
        "cosyserve_errors_total",
        "cosyserve_model_loaded",
    ):
        assert expected in names


def test_render_is_valid_exposition_text() -> None:
    body, content_type = exercised().render()
    assert isinstance(body, bytes) and content_type.startswith("text/plain")
    families = {family.name: family for family in text_string_to_metric_families(body.decode())}
    assert all(name.startswith("cosyserve_") for name in families)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples
    }
    assert samples[("cosyserve_requests_total", (("route", "/v1/tts"), ("status", "429")))] == 1
    assert samples[("cosyserve_queue_depth", ())] == 3
    assert samples[("cosyserve_audio_seconds_total", ())] == 4.0
    assert samples[("cosyserve_real_time_factor_sum", ())] == 0.5
    assert samples[("cosyserve_model_loaded", ())] == 1


def test_registries_are_private() -> None:
    first, second = Metrics(system=False), Metrics(system=False)  # no "Duplicated timeseries" error
    first.count_error("timeout")
    assert first.registry.get_sample_value("cosyserve_errors_total", {"kind": "timeout"}) == 1
    assert second.registry.get_sample_value("cosyserve_errors_total", {"kind": "timeout"}) is None


def test_system_gauges() -> None:
    rss = process_rss_bytes()
    if sys.platform.startswith("linux"):
        assert rss is not None and rss > 1_000_000
        assert "cosyserve_process_resident_memory_bytes" in Metrics().names()
    stats = accelerator_stats()  # whatever is here: never raises; {} on a CPU-only machine
    for device in stats.values():
        assert 0 <= device["memory_used_bytes"] <= device["memory_total_bytes"]


def test_service_core_never_imports_torch() -> None:
    code = textwrap.dedent(
        """
        import sys
        from cosyserve.service import logs, metrics, settings
        from cosyserve.service.scheduling import scheduler
        from cosyserve.service.stores import db, jobs
        m = metrics.Metrics()
        m.render()
        s = scheduler.Scheduler(1, 1, 5, m)
        s.submit(lambda ctx: 1).result(5)
        s.shutdown()
        settings.Settings()
        assert "torch" not in sys.modules, "torch was imported"
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
