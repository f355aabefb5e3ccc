"""The operator's view without a GPU: NVML figures from a fake NVML module (never a CUDA context), the
same figures on /metrics, one activity line per request, a rotated log file, output names in a chosen
time zone with the UTC instant in the sidecar, and the retention interval as a setting."""

from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from cosyserve.service.activity import enrolment_logger, log_activity, synthesis_logger
from cosyserve.service.gpu import GpuReport, NvmlReader, engine_allocator
from cosyserve.service.logs import clear_recent_logs, configure_logging, recent_logs
from cosyserve.service.metrics import Metrics, SystemCollector
from cosyserve.service.outcomes import TtsOutcome
from cosyserve.service.requests import OutputSpec, SynthesisRequest
from cosyserve.service.scheduling.scheduler import Scheduler


class FakeNvml:
    """The slice of pynvml that `NvmlReader` calls: two GPUs, the second without utilisation (a MIG slice)."""

    NVML_TEMPERATURE_GPU = 0

    def __init__(self, *, init_error: Exception | None = None) -> None:
        self.init_error = init_error
        self.inits = 0

    def nvmlInit(self) -> None:
        self.inits += 1
        if self.init_error is not None:
            raise self.init_error

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int) -> bytes | str:
        return b"NVIDIA H200" if handle == 0 else "NVIDIA L4"

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(used=(handle + 1) * 2**30, total=16 * 2**30)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        if handle == 1:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return SimpleNamespace(gpu=37)

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        return 45 + handle


def test_nvml_figures_from_a_fake_module() -> None:
    fake = FakeNvml()
    reader = NvmlReader(fake)
    report = reader.read()
    assert [g.name for g in report.gpus] == ["NVIDIA H200", "NVIDIA L4"]
    first, second = report.gpus
    assert first.utilization == pytest.approx(0.37) and first.temperature_c == 45
    assert first.memory_free_bytes == 15 * 2**30
    assert second.utilization is None and second.temperature_c == 46  # unsupported figure: None
    reader.read()
    assert fake.inits == 1  # initialised once


def test_absent_gpu_is_a_reason_never_an_error() -> None:
    no_driver = NvmlReader(FakeNvml(init_error=RuntimeError("NVML Shared Library Not Found")))
    report = no_driver.read()
    assert report.gpus == () and "no NVIDIA driver" in (report.absent_reason or "")
    assert no_driver.read().gpus == ()  # and it stops trying


def test_metrics_export_the_same_gpu_figures() -> None:
    metrics = Metrics(system=False)
    metrics.registry.register(SystemCollector(NvmlReader(FakeNvml())))
    text = metrics.render()[0].decode()
    free = metrics.registry.get_sample_value(
        "cosyserve_accelerator_memory_free_bytes", {"device": "0", "name": "NVIDIA H200"}
    )
    assert free == 15 * 2**30
    assert 'cosyserve_accelerator_temperature_celsius{device="1",name="NVIDIA L4"} 46.0' in text
    assert 'cosyserve_accelerator_utilization_ratio{device="0",name="NVIDIA H200"} 0.37' in text
    assert 'utilization_ratio{device="1"' not in text
    quiet = Metrics(system=False)
    quiet.registry.register(SystemCollector(SimpleNamespace(read=lambda: GpuReport((), "none"))))
    assert "accelerator" not in quiet.render()[0].decode()


def test_engine_allocator_never_touches_cuda_off_gpu() -> None:
    assert engine_allocator("cpu") is None
    assert engine_allocator(None) is None
    torch = sys.modules.get("torch")
    if torch is not None and not torch.cuda.is_available():
        assert engine_allocator("cuda:0") is None  # no context is created to answer


@pytest.fixture
def activity_log() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    configure_logging("INFO", stream=io.StringIO())
    clear_recent_logs()
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def activity() -> list[dict]:
    return [e for e in recent_logs(100) if e["logger"] == "cosyserve.activity"]


def test_one_activity_line_per_synthesis_with_who_how_fast_and_where(activity_log: None) -> None:
    scheduler = Scheduler(1, 2, 10)
    request = SynthesisRequest(text="你好世界", voice="alice", prompt_text="")
    key = SimpleNamespace(name="studio-key")
    spec = OutputSpec(owner="key:3", key=key, request_id="rid123", endpoint="tts")  # type: ignore[arg-type]
    outcome = TtsOutcome(1, 2.0, 50, "output_x", None, "audio/wav")
    logger = synthesis_logger("synthesis", request, spec, "cuda:1")
    scheduler.submit(lambda ctx: outcome, on_state=logger).result(5)
    failing = synthesis_logger("synthesis", request, spec, "cuda:1")

    def broken(ctx: object) -> None:
        raise ValueError("boom")

    scheduler.submit(broken, on_state=failing).wait(5)
    scheduler.shutdown(1)
    ok, failed = activity()
    assert ok["event"] == "synthesis" and ok["result"] == "ok" and ok["who"] == "studio-key"
    assert ok["request_id"] == "rid123" and ok["chars"] == 4 and ok["audio_s"] == 2.0
    assert ok["mode"] == "cross_lingual" and ok["device"] == "cuda:1" and ok["rtf"] is not None
    assert failed["result"] == "internal" and failed["error"] == "boom"
    log_activity("login", "bad_password", who="mallory", endpoint="ui")
    assert activity()[-1]["who"] == "mallory"


def test_a_job_the_server_keeps_for_later_is_logged_requeued_not_failed(activity_log: None) -> None:
    """A shutdown that left jobs queued for the next start logged each as `job shutting_down` with an
    error, as if it had failed."""
    from cosyserve.errors import Interrupted, ShuttingDown

    request = SynthesisRequest(text="长文本", voice="alice")
    spec = OutputSpec(owner="key:3", request_id="rid9", endpoint="jobs")
    for error, kept in ((ShuttingDown("stopping"), True), (Interrupted("restart"), False)):
        logger = synthesis_logger("job", request, spec, "cpu", "a" * 32, kept_queued=kept)
        logger(SimpleNamespace(error=error, value=None), "cancelled")  # type: ignore[arg-type]
    stopped = synthesis_logger("job", request, spec, "cpu", "b" * 32)  # a worker's: not kept
    scheduler = Scheduler(1, 2, 10)

    def refused(ctx: object) -> None:
        raise ShuttingDown("stopping")

    scheduler.submit(refused, on_state=stopped).wait(5)
    scheduler.shutdown(1)
    first, second, third = activity()
    assert (first["result"], second["result"]) == ("requeued", "requeued") and "error" not in first
    assert third["result"] == "shutting_down"


def test_an_enrolment_line_says_who_enrolled_even_without_consent(activity_log: None) -> None:
    """An admin's enrolment without consent logged no `who` (it came only with a consent record)."""
    scheduler = Scheduler(1, 2, 10)
    voice = SimpleNamespace(id="v1")
    for consent, enroller in ((False, "key:1"), (True, "ops")):
        logger = enrolment_logger("house", "rid", "cpu", consent=consent, enroller=enroller)
        scheduler.submit(lambda ctx: voice, on_state=logger).result(5)
    scheduler.shutdown(1)
    bare, confirmed = activity()
    assert bare["event"] == "enrolment" and bare["who"] == "key:1" and bare["consent"] == "none"
    assert confirmed["who"] == "ops" and confirmed["consent"] == "confirmed"


def test_log_file_rotates(tmp_path: Path) -> None:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    target = tmp_path / "logs" / "cosyserve.log"
    try:
        configure_logging("INFO", True, stream=io.StringIO(), file=target, file_max_mb=0.002, file_backups=2)
        for index in range(60):
            logging.getLogger("cosyserve.test").info("line %d %s", index, "x" * 40)
    finally:
        for handler in root.handlers:
            if handler not in handlers:
                handler.close()
        root.handlers[:] = handlers
        root.setLevel(level)
    names = sorted(p.name for p in target.parent.iterdir())
    assert names == ["cosyserve.log", "cosyserve.log.1", "cosyserve.log.2"]
    last = target.read_text().splitlines()[-1]
    assert json.loads(last)["message"].startswith("line 59")


def test_output_names_in_the_chosen_time_zone_with_utc_in_the_sidecar(tmp_path: Path) -> None:
    from cosyserve.service.stores.output_timezone import output_timezone
    from cosyserve.service.stores.outputs import OutputStore

    instant = 1767225600.0  # 2026-01-01T00:00:00Z
    shanghai = OutputStore(tmp_path / "sh", zone=output_timezone("Asia/Shanghai"), clock=lambda: instant)
    saved = shanghai.save(b"RIFF", "wav", {})
    assert saved.id == "output_20260101_080000"
    assert saved.manifest["created_at"] == "2026-01-01T00:00:00Z"
    assert saved.manifest["created_at_local"] == "2026-01-01T08:00:00+08:00"
    utc = OutputStore(tmp_path / "utc", zone=output_timezone("UTC"), clock=lambda: instant)
    assert utc.save(b"RIFF", "wav", {}).id == "output_20260101_000000"
    with pytest.raises(ValueError, match="Asia/Shanghai"):
        output_timezone("Mars/Olympus")


def test_timezone_and_retention_interval_settings(tmp_path: Path) -> None:
    from cosyserve.errors import SettingsError
    from cosyserve.service.assembly import Service
    from cosyserve.service.settings import Settings

    settings = Settings(
        data_dir=tmp_path, timezone="Asia/Shanghai", retention_interval_s=120, log_file=tmp_path / "x.log"
    )
    assert settings.storage.retention_interval_s == 120 and settings.log.file == tmp_path / "x.log"
    service = Service(settings, synthesizer_factory=lambda s, v: None)  # type: ignore[arg-type,return-value]
    try:
        assert service.retention.interval_s == 120
        assert str(service.outputs.zone) == "Asia/Shanghai"
    finally:
        service.shutdown()
    with pytest.raises(SettingsError, match="time zone"):
        Settings(data_dir=tmp_path, timezone="Nowhere/Special")


def test_where_things_are_names_the_directories(tmp_path: Path) -> None:
    from cosyserve.commands.startup import where_things_are
    from cosyserve.service.settings import Settings

    line = where_things_are(Settings(data_dir=tmp_path))
    assert str(tmp_path) in line and str(tmp_path / "outputs") in line and "GPUs:" in line
