"""Distributed mode, piece by piece: the wire format, job claims and leases (SQLite and PostgreSQL), the
Redis relay and worker registry, and the API node's relay loop against a scripted worker."""

from __future__ import annotations

import threading
import time
import uuid
from types import SimpleNamespace

import numpy as np
import pytest

from cosyserve.errors import Cancelled, InputError, JobStateError, QueueFull
from cosyserve.service import wire
from cosyserve.service.outcomes import TtsOutcome
from cosyserve.service.requests import OutputSpec, SynthesisRequest, VoiceDefaults
from cosyserve.service.stores.jobs import JobStore
from cosyserve.service.stores.voices import VoiceNotFound

# -- wire -------------------------------------------------------------------------------------------------


def test_request_round_trip_keeps_bytes_and_every_field() -> None:
    request = SynthesisRequest(
        text="你好",
        prompt_wav=bytes(range(256)) * 3,
        prompt_text="t",
        instruct="i",
        seed=7,
        speed=1.1,
        volume=0.5,
        takes=3,
        thresholds={"min_similarity": 0.6, "max_pause_s": 3.0},
    )
    data = wire.encode_request(request)
    assert isinstance(data["prompt_wav"], str)  # JSON-safe
    assert wire.decode_request(data) == request
    assert wire.decode_request(wire.from_json(wire.to_json(data))) == request
    kept = wire.from_json(wire.to_json(wire.encode_job_request(request, OutputSpec())))  # a job's record
    assert wire.decode_job_request(kept, request.prompt_wav) == request
    assert wire.decode_request(wire.encode_request(SynthesisRequest(text="x", voice="v"))).prompt_wav is None


def test_spec_travels_with_the_key_id_and_comes_back_with_the_key() -> None:
    key = SimpleNamespace(id=42)
    spec = OutputSpec(
        format="mp3", sample_rate=16000, owner="key:42", key=key, request_id="r", extra={"a": 1}
    )
    data = wire.encode_spec(spec)
    assert data["key_id"] == 42 and "key" not in data
    looked_up = []
    back = wire.decode_spec(data, lambda key_id: looked_up.append(key_id) or key)
    assert looked_up == [42] and back == spec
    assert wire.decode_spec(data).key is None  # no lookup: not charged on this node


def test_outcome_round_trip() -> None:
    outcome = TtsOutcome(1, 2.5, 60, "output_x", "/o/x.wav", "audio/wav", ("w",), b"RIFF\x00")
    assert wire.decode_outcome(wire.encode_outcome(outcome)) == outcome
    assert wire.decode_defaults(wire.encode_defaults(VoiceDefaults(speed=1.2))) == VoiceDefaults(speed=1.2)


@pytest.mark.parametrize(
    "exc",
    [
        VoiceNotFound("no voice 'x'"),
        InputError("bad text"),
        Cancelled("stop"),
        QueueFull("full", retry_after_s=9),
    ],
)
def test_user_facing_errors_come_back_as_the_same_class(exc: Exception) -> None:
    back = wire.decode_error(wire.encode_error(exc))
    assert type(back) is type(exc) and str(back) == str(exc)
    assert getattr(back, "retry_after_s", None) == getattr(exc, "retry_after_s", None)


def test_bugs_come_back_as_remote_failure_with_the_cause() -> None:
    back = wire.decode_error(wire.encode_error(ZeroDivisionError("division by zero")))
    assert isinstance(back, wire.RemoteFailure)
    assert "ZeroDivisionError: division by zero" in str(back)


# -- job claims -------------------------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def job_store(request: pytest.FixtureRequest, tmp_path) -> JobStore:
    from cosyserve.service.stores.db import make_engine

    url = (
        f"sqlite:///{tmp_path / 'jobs.db'}"
        if request.param == "sqlite"
        else request.getfixturevalue("postgres_url")
    )
    return JobStore(make_engine(url))


def test_claim_takes_a_queued_job_once_and_a_lapsed_one_again(job_store: JobStore) -> None:
    job = job_store.create({"text": "x"})
    first = job_store.claim(job.id, "worker-a", lease_s=0.3)
    assert (
        first is not None and first.state == "running" and first.attempt == 1 and first.worker == "worker-a"
    )
    assert job_store.claim(job.id, "worker-b", lease_s=0.3) is None  # worker-a is alive
    assert job_store.renew(job.id, 1, lease_s=0.3)
    time.sleep(0.4)  # worker-a stops renewing: it died
    second = job_store.claim(job.id, "worker-b", lease_s=30)
    assert second is not None and second.attempt == 2 and second.worker == "worker-b"
    assert second.started_at == first.started_at
    # The first attempt wakes up: it can neither renew, report progress nor record a result.
    assert not job_store.renew(job.id, 1, lease_s=30)
    assert not job_store.set_progress(job.id, 0.5, attempt=1)
    with pytest.raises(JobStateError, match="taken over"):
        job_store.finish_done(job.id, output_id="o1", attempt=1)
    with pytest.raises(JobStateError, match="taken over"):
        job_store.finish_failed(job.id, "internal", "boom", attempt=1)
    done = job_store.finish_done(job.id, output_id="o2", attempt=2)
    assert done.state == "done" and done.output_id == "o2" and done.lease_until is None
    assert job_store.claim(job.id, "worker-c", lease_s=30) is None  # finished: nothing to claim


def test_a_cancelled_job_is_not_claimed_and_its_holder_loses_the_lease(job_store: JobStore) -> None:
    job = job_store.create({"text": "x"})
    assert job_store.claim(job.id, "w", lease_s=30) is not None
    job_store.finish_cancelled(job.id, "cancelled by the client")
    assert not job_store.renew(job.id, 1, lease_s=30)
    assert job_store.claim(job.id, "w2", lease_s=30) is None
    with pytest.raises(JobStateError):
        job_store.finish_done(job.id, attempt=1)
    assert job_store.get(job.id).state == "cancelled"


def test_racing_claims_have_exactly_one_winner(job_store: JobStore) -> None:
    job = job_store.create({"text": "x"})
    winners: list[int] = []
    barrier = threading.Barrier(6)

    def claim(index: int) -> None:
        barrier.wait()
        if job_store.claim(job.id, f"w{index}", lease_s=30) is not None:
            winners.append(index)

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(winners) == 1
    assert job_store.get(job.id).attempt == 1


def test_old_databases_gain_the_claim_columns(tmp_path) -> None:
    import sqlalchemy as sa

    from cosyserve.service.stores.db import make_engine

    engine = make_engine(f"sqlite:///{tmp_path / 'old.db'}")
    with engine.begin() as conn:  # the jobs table as it was before claims existed
        conn.execute(
            sa.text(
                "CREATE TABLE jobs (id VARCHAR(32) PRIMARY KEY, kind VARCHAR(16) NOT NULL,"
                " state VARCHAR(16) NOT NULL, progress FLOAT NOT NULL, owner VARCHAR(128),"
                " created_at DATETIME NOT NULL, started_at DATETIME,"
                " finished_at DATETIME, params JSON NOT NULL, error_code VARCHAR(64), error_message TEXT,"
                " output_id VARCHAR(64), output_path TEXT, duration_s FLOAT, seed BIGINT, result_extra JSON)"
            )
        )
        conn.execute(
            sa.text(
                "INSERT INTO jobs (id, kind, state, progress, created_at, params)"
                " VALUES ('old', 'tts', 'queued', 0, '2026-01-01 00:00:00', '{}')"
            )
        )
    store = JobStore(engine)
    assert store.get("old").attempt == 0
    assert store.claim("old", "w", lease_s=30).attempt == 1


# -- relay and registry -----------------------------------------------------------------------------------


@pytest.fixture()
def redis_client(redis_url: str):
    from cosyserve.service.distributed.relay import connect

    client = connect(redis_url)
    yield client
    client.close()


def test_relay_keeps_order_and_lets_a_late_reader_see_everything(redis_client) -> None:
    from cosyserve.service.distributed.relay import Relay

    relay, task = Relay(redis_client, ttl_s=60), uuid.uuid4().hex
    relay.publish(task, "start", {"seed": 1})
    relay.publish(task, "chunk", b"\x00\x01binary\xff")
    relay.publish(task, "progress", 0.5)
    relay.publish(task, "done", {"ok": True})
    items = relay.read(task, block_ms=10)
    assert [item.kind for item in items] == ["start", "chunk", "progress", "done"]
    assert items[1].data == b"\x00\x01binary\xff"
    assert relay.read(task, after=items[-1].id, block_ms=10) == []
    assert 0 < redis_client.ttl(f"cosyserve:out:{task}") <= 60
    relay.drop(task)
    assert relay.read(task, block_ms=10) == []


def test_cancel_flags_and_leases(redis_client) -> None:
    from cosyserve.service.distributed.relay import Relay

    relay, task = Relay(redis_client), uuid.uuid4().hex
    assert relay.cancel_reason(task) is None
    relay.request_cancel(task, "cancelled by the client")
    assert relay.cancel_reason(task) == "cancelled by the client"
    relay.hold(task, "worker-a", lease_s=0.2)
    assert relay.holder(task) == "worker-a"
    time.sleep(0.3)
    assert relay.holder(task) is None  # not renewed: the worker is gone


def test_registry_lists_only_fresh_heartbeats(redis_client) -> None:
    from cosyserve.service.distributed.relay import WorkerRegistry

    registry, name = WorkerRegistry(redis_client), f"w-{uuid.uuid4().hex[:6]}"
    registry.beat(name, {"model": "demo", "sample_rate": 24000}, ttl_s=0.3)
    assert any(w["name"] == name and w["sample_rate"] == 24000 for w in registry.alive())
    time.sleep(0.4)
    assert all(w["name"] != name for w in registry.alive())
    registry.beat(name, {}, ttl_s=30)
    registry.leave(name)
    assert all(w["name"] != name for w in registry.alive())
    registry.beat(name, {"jobs": ["job-a", "job-b"]}, ttl_s=0.3)  # what the lost-job sweep leaves alone
    assert {"job-a", "job-b"} <= registry.running_jobs()
    time.sleep(0.4)
    assert not {"job-a", "job-b"} & registry.running_jobs()


# -- the API node's relay loop, against a scripted worker -------------------------------------------------


class _Context:
    def __init__(self) -> None:
        self.cancel = threading.Event()
        self.progress: list[float] = []

    def set_progress(self, fraction: float) -> None:
        self.progress.append(fraction)

    def check_cancelled(self) -> None:
        if self.cancel.is_set():
            raise Cancelled("cancelled by the client")


@pytest.fixture()
def dispatcher(redis_url: str, tmp_path):
    from cosyserve.service.distributed.remote import RemoteBackend
    from cosyserve.service.settings import Settings

    settings = Settings(queue={"queue_url": redis_url}, storage={"data_dir": tmp_path})
    remote = RemoteBackend(settings, None, jobs=None, voices=None, batches=None)  # type: ignore[arg-type]
    sent: list[tuple[str, str, list]] = []

    def send(task: str, args: list, task_id: str | None = None) -> str:
        task_id = task_id or uuid.uuid4().hex
        sent.append((task, task_id, args))
        return task_id

    remote._send = send  # type: ignore[method-assign]
    remote.sent = sent  # type: ignore[attr-defined]
    yield remote
    remote.stop()


def _run_in_thread(function, *args):
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = function(*args)
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, box


def _wait_for_task(dispatcher) -> str:
    deadline = time.monotonic() + 5
    while not dispatcher.sent:
        assert time.monotonic() < deadline, "no task was sent"
        time.sleep(0.01)
    return dispatcher.sent[-1][1]


def test_tts_result_and_progress_are_relayed(dispatcher) -> None:
    work = dispatcher.tts_work(SynthesisRequest(text="hi", voice="v"), OutputSpec(), False)
    ctx = _Context()
    thread, box = _run_in_thread(work, ctx)
    task = _wait_for_task(dispatcher)
    outcome = TtsOutcome(3, 1.0, 25, "o", None, "audio/wav", (), b"RIFF")
    dispatcher.relay.hold(task, "w", 5)
    dispatcher.relay.publish(task, "progress", 0.5)
    dispatcher.relay.publish(task, "done", wire.encode_outcome(outcome))
    thread.join(5)
    assert box["value"] == outcome and ctx.progress == [0.5]
    assert dispatcher.relay.read(task, block_ms=10) == []  # the reader dropped the stream


def test_a_stream_yields_start_then_bytes_and_returns_the_outcome(dispatcher) -> None:
    from cosyserve.service.outcomes import StreamStart

    work = dispatcher.tts_work(SynthesisRequest(text="hi", voice="v"), OutputSpec(), True)
    items = work(_Context())
    task = _wait_for_task(dispatcher)
    dispatcher.relay.publish(task, "start", {"seed": 5, "media_type": "audio/wav", "sample_rate": 24000})
    dispatcher.relay.publish(task, "chunk", b"abc")
    dispatcher.relay.publish(task, "chunk", b"def")
    dispatcher.relay.publish(
        task, "done", wire.encode_outcome(TtsOutcome(5, 1.0, 25, None, None, "audio/wav"))
    )
    received = []
    with pytest.raises(StopIteration) as stop:
        while True:
            received.append(next(items))
    assert received == [StreamStart(5, "audio/wav", 24000), b"abc", b"def"]
    assert stop.value.value.seed == 5


def test_a_worker_error_is_raised_on_the_api_node(dispatcher) -> None:
    work = dispatcher.tts_work(SynthesisRequest(text="hi", voice="nope"), OutputSpec(), False)
    thread, box = _run_in_thread(work, _Context())
    task = _wait_for_task(dispatcher)
    dispatcher.relay.publish(task, "error", wire.encode_error(VoiceNotFound("no voice 'nope'")))
    thread.join(5)
    assert isinstance(box["error"], VoiceNotFound)


def test_a_vanished_worker_is_reported_as_worker_lost(dispatcher) -> None:
    work = dispatcher.tts_work(SynthesisRequest(text="hi", voice="v"), OutputSpec(), False)
    thread, box = _run_in_thread(work, _Context())
    task = _wait_for_task(dispatcher)
    dispatcher.relay.hold(task, "w", lease_s=1.5)  # taken, then never renewed or answered
    thread.join(10)
    assert not thread.is_alive()
    assert isinstance(box["error"], wire.WorkerLost)


def test_a_cancel_on_the_api_node_reaches_the_worker(dispatcher) -> None:
    work = dispatcher.tts_work(SynthesisRequest(text="hi", voice="v"), OutputSpec(), False)
    ctx = _Context()
    thread, box = _run_in_thread(work, ctx)
    task = _wait_for_task(dispatcher)
    ctx.cancel.set()
    thread.join(5)
    assert isinstance(box["error"], Cancelled)
    assert dispatcher.relay.cancel_reason(task) is not None


def test_readiness_needs_a_live_worker_and_takes_its_model_info(dispatcher) -> None:
    from cosyserve.service.distributed.relay import WorkerRegistry

    registry = WorkerRegistry(dispatcher.client)
    for worker in registry.alive():
        registry.leave(worker["name"])
    state = dispatcher.readiness(False, accepting=True)
    assert state["ready"] is False and "cosyserve worker" in state["reason"]
    with pytest.raises(wire.NoWorkers):
        dispatcher.require_ready()
    registry.beat("gpu0", {"model": "m", "sample_rate": 24000, "model_path": "/secret"}, ttl_s=30)
    state = dispatcher.readiness(False, accepting=True)
    assert state["ready"] is True and state["workers"] == 1 and state["sample_rate"] == 24000
    assert "model_path" not in state and "worker_info" not in state
    assert dispatcher.readiness(True, accepting=True)["worker_info"][0]["name"] == "gpu0"
    registry.leave("gpu0")


def test_an_unreachable_queue_is_a_clear_503(tmp_path) -> None:
    from cosyserve.service.distributed.remote import RemoteBackend
    from cosyserve.service.settings import Settings

    settings = Settings(queue={"queue_url": "redis://127.0.0.1:1/0"}, storage={"data_dir": tmp_path})
    remote = RemoteBackend(settings, None, jobs=None, voices=None, batches=None)  # type: ignore[arg-type]
    state = remote.readiness(False, accepting=True)
    assert state["ready"] is False and "cannot be reached" in state["reason"]
    with pytest.raises(wire.QueueUnavailable, match="Redis"):
        remote.require_ready()


def test_audio_survives_the_wire_bit_for_bit() -> None:
    audio = (np.random.default_rng(0).standard_normal(2400) * 1000).astype(np.int16).tobytes()
    outcome = TtsOutcome(0, 0.1, 3, None, None, "audio/pcm", (), audio)
    assert wire.decode_outcome(wire.encode_outcome(outcome)).audio == audio


def test_worker_http_answers_health_ready_and_metrics() -> None:
    import httpx

    from cosyserve.service.distributed.worker_http import WorkerHttp
    from cosyserve.service.metrics import Metrics

    state = {"ready": False, "reason": "the model is loading"}
    server = WorkerHttp("127.0.0.1", 0, lambda: dict(state), Metrics(system=False)).start()
    base = f"http://127.0.0.1:{server.address[1]}"
    try:
        assert httpx.get(f"{base}/health").json() == {"status": "ok"}
        not_ready = httpx.get(f"{base}/ready")
        assert not_ready.status_code == 503 and not_ready.json()["reason"] == "the model is loading"
        state["ready"] = True
        assert httpx.get(f"{base}/ready").status_code == 200
        assert "cosyserve_queue_depth" in httpx.get(f"{base}/metrics").text
        missing = httpx.get(f"{base}/v1/tts")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    finally:
        server.close()
