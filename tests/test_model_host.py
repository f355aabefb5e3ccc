"""The model host's reloads and the engine's failures: never two models at once, never stuck restarting,
and out-of-memory answered as a 503 for the request concerned while the engine stays healthy."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from tests.conftest import API_TEXT, enrol_voice, sharing

from cosyserve.errors import ModelNotReady
from cosyserve.service.local.model_host import ModelHost
from cosyserve.service.metrics import Metrics
from cosyserve.service.scheduling.scheduler import Scheduler, WorkContext
from cosyserve.service.startup_clock import StartupClock


class _FakeSynth:
    def __init__(self, voices) -> None:
        self.voices = voices
        self.model_dir = type("Dir", (), {"fingerprint": "f", "path": "/nowhere"})()
        self.sample_rate = 24000
        placement = type("Placement", (), {"device": torch.device("cpu"), "dtype_name": "float32"})()
        self.engine = type(
            "Engine", (), {"placement": placement, "dtypes": lambda _self: {"lm": "float32"}}
        )()


def _host(settings_factory, *, release_wait_s: float, cancel_running=None, device_type: str = "cpu"):
    loads: list[float] = []

    def factory(settings, voices):
        loads.append(time.monotonic())
        return _FakeSynth(voices)

    settings = settings_factory()
    host = ModelHost(
        settings,
        voices=type("Voices", (), {"model_checksum": ""})(),
        metrics=Metrics(system=False),
        factory=factory,
        device_type=device_type,
        release_wait_s=release_wait_s,
        startup=StartupClock(),
        cancel_running=cancel_running or (lambda reason, only=None: None),
    )
    return host, loads


def _wait(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


@pytest.fixture
def settings_factory(tmp_path):
    from cosyserve.service.settings import Settings

    return lambda: Settings(model="demo", device="cpu", data_dir=tmp_path)


def test_restart_asks_running_work_to_stop_and_never_loads_a_second_copy(settings_factory) -> None:
    asked: list[str] = []
    holder_may_go = threading.Event()
    host, loads = _host(
        settings_factory,
        release_wait_s=1.0,
        cancel_running=lambda reason, only=None: (asked.append(reason), holder_may_go.set()),
    )
    host.start()
    _wait(lambda: host.state == "ready")

    def hold_the_model() -> None:
        with host.synthesizer():
            holder_may_go.wait(10)  # stops only when asked, like work checking its cancel event
            time.sleep(0.5)

    holder = threading.Thread(target=hold_the_model)
    holder.start()
    _wait(lambda: host._users == 1)
    assert host.restart() == "restarting"
    time.sleep(1.25)  # past the grace period (1 s): the holder was asked to stop and is finishing
    assert len(loads) == 1  # still waiting for the holder: no second model while the first is held
    _wait(lambda: host.state == "ready")
    holder.join()
    assert asked == ["the engine is restarting"] and len(loads) == 2


def test_a_restart_lets_a_job_finish_while_a_request_waits_for_the_new_model(settings_factory) -> None:
    """One slot: a long-text job holds the old model across its segments and gives the slot back
    between them; a request queued behind it must not keep the slot while it waits for the reloading
    model, or the job (and so the reload) waits for it until the grace period runs out (30 s then; the
    request was cancelled, the job run again)."""
    asked: list[str] = []
    host, loads = _host(
        settings_factory, release_wait_s=20.0, cancel_running=lambda reason, only=None: asked.append(reason)
    )
    host.start()
    _wait(lambda: host.state == "ready")
    scheduler = Scheduler(1, 8, 30.0)
    first_segment_done, go_on = threading.Event(), threading.Event()
    used: dict[str, object] = {}

    def job(ctx: WorkContext) -> int:
        with host.synthesizer(work=ctx) as synth:
            used["job"] = synth
            for segment in range(3):
                if segment:
                    ctx.next_unit()
                if segment == 1:
                    first_segment_done.set()
                    go_on.wait(10)
        return 3

    def request(ctx: WorkContext) -> str:
        with host.synthesizer(work=ctx) as synth:
            used["request"] = synth
        return "spoken"

    try:
        background = scheduler.submit(job, owner="key:A", work_class="background", timeout_s=None)
        assert first_segment_done.wait(10)
        interactive = scheduler.submit(request, owner="key:B")
        _wait(lambda: scheduler.position(interactive) == 0)
        assert host.restart() == "restarting"  # waits for the job to let go of the old model
        started = time.monotonic()
        go_on.set()  # the job gives its slot back before segment 2: the request gets it (fair) and waits
        assert background.result(timeout=10) == 3 and interactive.result(timeout=10) == "spoken"
        assert time.monotonic() - started < 5  # not the grace period
    finally:
        scheduler.shutdown(grace_s=0.5)
    assert asked == [] and len(loads) == 2
    assert used["request"] is not used["job"]  # the request ran on the reloaded model


def test_a_restart_stops_only_the_work_holding_the_old_model(settings_factory) -> None:
    """Past the grace period the restart cancelled every running ticket, also a request that only waited
    for the new model: accepted work got 409 "the engine is restarting" (a team's run)."""
    scheduler = Scheduler(2, 8, 60.0)
    host, loads = _host(settings_factory, release_wait_s=0.5, cancel_running=scheduler.cancel_running)
    host.start()
    _wait(lambda: host.state == "ready")
    holding = threading.Event()

    def job(ctx: WorkContext) -> str:
        with host.synthesizer(work=ctx):
            holding.set()
            while not ctx.cancel.is_set():  # a long job, stopping only when asked
                time.sleep(0.02)
            ctx.check_cancelled()
        return "finished"

    def request(ctx: WorkContext) -> str:
        with host.synthesizer(work=ctx):
            return "spoken"

    try:
        long_job = scheduler.submit(job, owner="key:A", work_class="background", timeout_s=None)
        assert holding.wait(10)
        assert host.restart() == "restarting"
        waiting = scheduler.submit(request, owner="key:B")  # accepted during the restart: waits
        assert waiting.result(timeout=20) == "spoken"  # on the new model, once the job let go
        _wait(lambda: long_job.finished)
        assert long_job.state == "cancelled" and len(loads) == 2
    finally:
        scheduler.shutdown(grace_s=0.5)


def test_restart_fails_clearly_when_work_never_lets_go(settings_factory) -> None:
    host, loads = _host(settings_factory, release_wait_s=0.2)
    host.start()
    _wait(lambda: host.state == "ready")
    release = threading.Event()

    def stuck() -> None:
        with host.synthesizer():
            release.wait(10)

    holder = threading.Thread(target=stuck)
    holder.start()
    _wait(lambda: host._users == 1)
    host.restart()
    _wait(lambda: host.state == "failed")
    assert len(loads) == 1 and "did not let go of the old model" in host.readiness()["reason"]
    release.set()
    holder.join()
    assert host.restart() == "restarting"  # the admin can try again once the work is gone
    _wait(lambda: host.state == "ready")


def test_a_broken_cuda_context_fails_the_reload_instead_of_hanging(settings_factory, monkeypatch) -> None:
    host, _ = _host(settings_factory, release_wait_s=0.2, device_type="cuda")

    def sticky_error() -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(torch.cuda, "empty_cache", sticky_error)
    host.start()
    _wait(lambda: host.state == "failed")
    assert "illegal memory access" in host.readiness()["reason"]
    with pytest.raises(ModelNotReady):
        host.require_ready()


def test_out_of_memory_is_a_503_for_that_request_and_the_engine_stays_ready(
    start_api_server, api_synthesizer, prompt_wav_bytes, monkeypatch
) -> None:
    live = start_api_server(factory=sharing(api_synthesizer))
    try:
        with live.client() as client:
            enrol_voice(client, "alice", prompt_wav_bytes)
            with live.service.model.synthesizer() as synth:
                lm = synth.engine.lm
            generate = lm.generate
            calls = []

            def out_of_memory(*args, **kwargs):
                calls.append(1)
                if len(calls) <= 3:  # more than the unready threshold: OOM must not count as a failure
                    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
                return generate(*args, **kwargs)

            monkeypatch.setattr(lm, "generate", out_of_memory)
            for _ in range(3):
                response = client.post("/v1/tts", json={"text": API_TEXT, "voice": "alice"})
                assert response.status_code == 503, response.text
                assert response.json()["error"]["code"] == "out_of_memory"
                assert int(response.headers["retry-after"]) >= 1
            assert client.get("/ready").status_code == 200
            assert client.post("/v1/tts", json={"text": API_TEXT, "voice": "alice"}).status_code == 200
    finally:
        live.stop()
