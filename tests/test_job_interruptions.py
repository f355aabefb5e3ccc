"""A job the server stops is not failed: an engine restart from the admin page and a worker's SIGTERM put
the running job back in the queue, and its next attempt goes on after what it finished (a batch keeps its
done items, their outputs not made twice)."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from celery.exceptions import Retry
from tests.conftest import LONG_TEXT, enrol_voice, sharing
from tests.test_api_admin import wait_for
from tests.test_api_batches import wait_batch
from tests.test_api_jobs import wait_job

from cosyserve.errors import Cancelled
from cosyserve.service import wire
from cosyserve.service.batches.inputs import BatchRules, items_from
from cosyserve.service.requests import OutputSpec

ITEMS = ["一。", "二。", "三。"]


class HoldOneSegment:
    """`SpeechEngine.generate` whose `hold_at`-th call runs until it is cancelled, as a long segment would
    (then ends Cancelled as the engine does); every other call runs normally."""

    def __init__(self, engine, hold_at: int) -> None:
        self.original, self.hold_at = engine.generate, hold_at
        self.calls = 0
        self.holding = threading.Event()

    def __call__(self, segment, *, cancel, **kwargs):
        self.calls += 1
        if self.calls == self.hold_at:
            self.holding.set()
            deadline = time.monotonic() + 60
            while not cancel():
                assert time.monotonic() < deadline, "the held segment was never cancelled"
                time.sleep(0.01)
            raise Cancelled("the request was cancelled")
        yield from self.original(segment, cancel=cancel, **kwargs)


@pytest.fixture
def server(start_api_server, prompt_wav_bytes):
    live = start_api_server(service_kwargs={"shutdown_grace_s": 0.2})  # a restart waits this long, then stops
    with live.client() as client:
        enrol_voice(client, "alice", prompt_wav_bytes)
    yield live
    live.stop()


def test_an_engine_restart_requeues_the_running_batch(server, api_synthesizer, monkeypatch) -> None:
    hold = HoldOneSegment(api_synthesizer.engine, hold_at=2)
    monkeypatch.setattr(api_synthesizer.engine, "generate", hold)
    with server.client() as client:
        batch_id = client.post("/v1/batches", json={"voice": "alice", "items": ITEMS}).json()["id"]
        assert hold.holding.wait(60)
        first = client.get(f"/v1/batches/{batch_id}").json()["items"][0]
        assert first["state"] == "done" and first["output_id"]
        assert client.post("/admin/engine/restart").status_code == 202
        final = wait_batch(client, batch_id)
        assert final["state"] == "done" and (final["done"], final["failed"]) == (3, 0), final
        assert final["items"][0]["output_id"] == first["output_id"]  # kept, not made again
        assert server.service.jobs.get(batch_id).attempt == 2
        wait_for(lambda: client.get("/ready").status_code == 200)


def test_an_engine_restart_requeues_a_running_long_text_job(
    server, api_synthesizer, prompt_wav_bytes, monkeypatch
) -> None:
    """Run again from its start, the job's key is charged for the audio it got, not also for the first
    segment the interrupted attempt made and threw away."""
    _, key = server.service.keys.create("restarted", "user", quota=600.0)
    _, admin_key = server.service.keys.create("restarter", "admin")
    hold = HoldOneSegment(api_synthesizer.engine, hold_at=2)
    with server.client(headers={"Authorization": f"Bearer {key}"}) as client:
        enrol_voice(client, "bea", prompt_wav_bytes)
        monkeypatch.setattr(api_synthesizer.engine, "generate", hold)
        job_id = client.post("/v1/jobs", json={"text": LONG_TEXT, "voice": "bea", "seed": 3}).json()["id"]
        assert hold.holding.wait(60)
        first_attempt_charged = server.service.jobs.get(job_id).charged_s
        assert first_attempt_charged > 0  # the first segment, made before the hold
        with server.client(headers={"Authorization": f"Bearer {admin_key}"}) as admin:
            assert admin.post("/admin/engine/restart").status_code == 202
        final = wait_job(client, job_id, timeout=300)
        assert final["state"] == "done" and final["error"] is None and final["output_id"], final
        assert server.service.jobs.get(job_id).attempt == 2
        made = client.get(f"/v1/outputs/{final['output_id']}/manifest").json()["duration_s"]
        wait_for(lambda: client.get("/v1/me").json()["quota"]["reserved_s"] == 0)
        used = client.get("/v1/me").json()["quota"]["used_s"]
    assert used == pytest.approx(made, abs=0.05), (used, made, first_attempt_charged)


class FakeTask:
    """The Celery task handle `_claimed` gets: `retry` sends the task again (recorded here)."""

    def __init__(self) -> None:
        self.retries: list[dict] = []

    def retry(self, **kwargs) -> Retry:
        self.retries.append(kwargs)
        return Retry()


@pytest.fixture
def worker(redis_url, api_synthesizer, demo_model_path, tmp_path):
    from cosyserve.service.assembly import Service
    from cosyserve.service.settings import Settings
    from cosyserve.service.worker_node import WorkerNode

    settings = Settings(
        model=str(demo_model_path),
        device="cpu",
        data_dir=tmp_path,
        queue_url=redis_url,
        concurrency=1,
        signing_secret="test-signing-secret-0123456789abcdef",
    )
    service = Service(settings, role="worker", synthesizer_factory=sharing(api_synthesizer))
    node = WorkerNode(settings, name="w1", service=service)
    service.start()
    wait_for(lambda: service.model_state == "ready", timeout=120)
    yield node
    service.shutdown()


def test_a_workers_sigterm_requeues_its_running_batch(
    worker, api_synthesizer, prompt_wav_bytes, monkeypatch
) -> None:
    service = worker.service
    job_id = uuid.uuid4().hex
    items = items_from(ITEMS, BatchRules(has_prompt=True))
    service.jobs.create(
        {"items": len(items)},
        kind="batch",
        owner=None,
        job_id=job_id,
        spec=wire.encode_job_spec(OutputSpec(endpoint="batches")),
        prompt_wav=prompt_wav_bytes,
    )
    service.batches.add(job_id, [item.as_row() for item in items])
    hold = HoldOneSegment(api_synthesizer.engine, hold_at=2)
    monkeypatch.setattr(api_synthesizer.engine, "generate", hold)

    def run_task(task: FakeTask, box: dict) -> None:
        try:
            worker._claimed(task, job_id, lambda attempt: worker.local.run_claimed_batch(job_id, attempt))
        except BaseException as exc:
            box["error"] = exc

    task, box = FakeTask(), {}
    thread = threading.Thread(target=run_task, args=(task, box))
    thread.start()
    assert hold.holding.wait(60)
    worker.on_worker_shutting_down(sender="someone-else@host")  # another worker's shutdown: not ours
    assert thread.is_alive()
    worker.on_worker_shutting_down(sender=worker.hostname, sig="SIGTERM", how="Warm", exitcode=0)
    thread.join(60)
    assert isinstance(box.get("error"), Retry) and task.retries == [{"countdown": 0, "max_retries": None}]
    record = service.jobs.get(job_id)
    assert (record.state, record.attempt, record.error_code) == ("queued", 1, None)
    first = service.batches.items(job_id)[0]
    assert first.state == "done" and first.output_id

    back = FakeTask()  # sent again, it reaches this worker while it stops: back to the queue, unclaimed
    run_task(back, box := {})
    assert isinstance(box.get("error"), Retry) and back.retries == [{"countdown": 1.0, "max_retries": None}]
    assert service.jobs.get(job_id).attempt == 1

    worker.stopping.clear()  # the same worker started again
    again = FakeTask()
    run_task(again, box := {})
    assert box == {} and again.retries == []
    record = service.jobs.get(job_id)
    assert (record.state, record.attempt) == ("done", 2)
    finished = service.batches.items(job_id)
    assert [item.state for item in finished] == ["done"] * 3
    assert finished[0].output_id == first.output_id  # kept, not made again


def services_without_a_model(data_dir, **settings):
    """Each call: a new `Service` on `data_dir` (a process of the server), loading no model."""
    from cosyserve.service.assembly import Service
    from cosyserve.service.settings import Settings

    def no_model(_settings, _voices):
        raise RuntimeError("no model in this test")

    values = {"model": "demo", "device": "cpu", "data_dir": data_dir, **settings}
    values["signing_secret"] = "test-signing-secret-0123456789abcdef"
    return lambda: Service(Settings(**values), synthesizer_factory=no_model)


def test_a_batch_past_the_retry_limit_ends_its_items_and_says_what_it_kept(tmp_path) -> None:
    """A batch interrupted by restarts as often as the retry limit allows failed, but its unfinished items
    stayed queued and running for ever (not deletable, nothing would run them) and it kept no `partial`."""
    start = services_without_a_model(tmp_path, job_max_attempts=2)
    before = start()
    batch = before.jobs.create({"items": 3}, kind="batch", owner="key:1")
    before.batches.add(
        batch.id, [{"name": n, "params": {"text": t}} for n, t in zip("abc", ITEMS, strict=True)]
    )
    first = before.jobs.claim(batch.id, "node", 0).attempt  # two processes died while running it
    before.batches.start(batch.id, 1, first)
    before.batches.finish(batch.id, 1, first, output_id="output_1", duration_s=1.5, run_s=0.4)
    second = before.jobs.claim(batch.id, "node", 0).attempt
    before.batches.start(batch.id, 2, second)  # the second died on item 2 without finishing any

    after = start()  # the next start
    after.backend.start()
    try:
        record = after.jobs.get(batch.id)
        assert (record.state, record.error_code) == ("failed", "interrupted")
        items = after.batches.items(batch.id)
        assert [(i.state, i.error_code) for i in items] == [
            ("done", None), ("cancelled", "interrupted"), ("cancelled", "interrupted")
        ]  # fmt: skip
        assert record.result_extra["partial"] == {
            "segments_done": 1, "segments_total": 3, "missing": [2, 3], "audio_s": 1.5
        }  # fmt: skip
    finally:
        after.backend.stop()


def test_a_long_text_past_the_retry_limit_gives_back_its_charge(tmp_path) -> None:
    """It failed keeping nothing, but its last attempt's charge stayed on the key (12.6-23 s)."""
    start = services_without_a_model(tmp_path, job_max_attempts=1)
    before = start()
    key, _ = before.keys.create("dave", role="user")
    job = before.jobs.create({"text": "今天天气很好。", "voice": "v"}, owner=f"key:{key.id}", reserved_s=30)
    before.jobs.claim(job.id, "node", 0)
    before.jobs.charge(job.id, 12.5)
    before.access.quota.add(key, 12.5)  # its segments, charged as they were made

    after = start()  # the start after the crash
    after.backend.start()
    try:
        assert after.jobs.get(job.id).state == "failed"
        assert after.access.quota.used(key) == pytest.approx(0.0)
        assert after.jobs.get(job.id).charged_s == 0.0
    finally:
        after.backend.stop()


def test_a_job_that_cannot_run_again_after_a_restart_gives_back_what_it_held(tmp_path, start_api_server):
    """Restarted with settings its text no longer fits (here a lower --max-text-chars), a long text failed
    `invalid_input` but kept its reservation (a third of the key's day, with nothing running), its pieces'
    charge and its pieces' folder."""
    before = services_without_a_model(tmp_path)()
    key, _ = before.keys.create("erin", role="user", quota=600.0)
    text = "今天天气很好。" * 400  # 2800 characters: more than a job takes at --max-text-chars 40
    job = before.jobs.create({"text": text, "voice": "v"}, owner=f"key:{key.id}", reserved_s=200)
    assert before.reservations.hold_job(job.id, key, 200.0)
    before.jobs.claim(job.id, "node", 0)
    before.jobs.charge(job.id, 12.5)
    before.access.quota.add(key, 12.5)  # its first pieces, charged as they were made
    pieces = before.outputs.root / ".job-pieces" / job.id
    pieces.mkdir(parents=True)
    (pieces / "0.json").write_text("{}")
    before.db.dispose()

    after = start_api_server(data_dir=tmp_path, max_text_chars=40)  # the start after the crash
    try:
        deadline = time.monotonic() + 60
        while (ended := after.service.jobs.get(job.id)).state != "failed":
            assert time.monotonic() < deadline, ended
            time.sleep(0.05)
        assert ended.error_code == "invalid_input", ended
        quota = after.service.access.quota
        wait_for(lambda: quota.reserved(key) == 0.0)
        assert quota.used(key) == pytest.approx(0.0) and after.service.jobs.get(job.id).charged_s == 0.0
        assert not pieces.exists()
    finally:
        after.stop()


def test_a_batch_that_progresses_in_every_attempt_does_not_use_up_its_retries(tmp_path) -> None:
    """Three kill -9s, each after some items were done, failed a 300-item batch that was going fine."""
    start = services_without_a_model(tmp_path, job_max_attempts=1)
    before = start()
    batch = before.jobs.create({"items": 2}, kind="batch", owner="key:1")
    before.batches.add(
        batch.id, [{"name": n, "params": {"text": t}} for n, t in zip("ab", ITEMS, strict=False)]
    )
    attempt = before.jobs.claim(batch.id, "node", 0).attempt
    before.batches.start(batch.id, 1, attempt)
    before.batches.finish(batch.id, 1, attempt, output_id="output_1", duration_s=1.5, run_s=0.4)
    queued, failed = before.jobs.requeue_interrupted(max_attempts=1)  # what the next start does
    assert [job.id for job in queued] == [batch.id] and failed == []


def test_a_long_text_that_progresses_in_every_attempt_does_not_use_up_its_retries(tmp_path) -> None:
    """With kept pieces a long text goes on after each restart, as a batch does; it still failed at the
    retry limit though every attempt finished pieces."""
    import numpy as np

    from cosyserve.service.outcomes import SentenceTiming, SynthesisResult

    start = services_without_a_model(tmp_path, job_max_attempts=1)
    before = start()
    stuck = before.jobs.create({"text": LONG_TEXT, "voice": "v"}, owner="key:1")
    going = before.jobs.create({"text": LONG_TEXT, "voice": "v"}, owner="key:1")
    for job in (stuck, going):
        before.jobs.claim(job.id, "node", 0)
    made = SynthesisResult(np.zeros(240, np.float32), 24000, 1, [SentenceTiming(0, "一", 0.0, 0.01)])
    pieces = before.backend.job_runner.pieces
    pieces.save(going.id, 0, LONG_TEXT, "m", made, charged_s=0.01, attempt=1)  # made in its last attempt
    pieces.save(stuck.id, 0, LONG_TEXT, "m", made, charged_s=0.01, attempt=0)  # made earlier, not now
    runner = before.backend.job_runner
    queued, failed = before.jobs.requeue_interrupted(max_attempts=1, progressed=runner.progressed)
    assert [job.id for job in queued] == [going.id] and [job.id for job in failed] == [stuck.id]


def test_a_long_text_goes_on_from_the_pieces_it_finished(
    start_api_server, api_synthesizer, prompt_wav_bytes, monkeypatch
):
    """An interrupted long text started over: a 20-minute text restarted near its end made (and waited
    for) all of it again. Its next attempt now goes on from the first piece missing, its audio the same as
    an uninterrupted run's, its key charged for what the result holds."""
    import io

    import soundfile as sf

    server = start_api_server(max_text_chars=40, service_kwargs={"shutdown_grace_s": 0.2})
    _, key = server.service.keys.create("resumer", "user", quota=600.0)
    _, admin_key = server.service.keys.create("restarter", "admin")
    pieces_root = server.service.backend.job_runner.pieces.root
    try:
        with server.client(headers={"Authorization": f"Bearer {key}"}) as client:
            enrol_voice(client, "bea", prompt_wav_bytes)
            job = {"text": LONG_TEXT, "voice": "bea", "seed": 5}
            whole = wait_job(client, client.post("/v1/jobs", json=job).json()["id"], timeout=300)
            hold = HoldOneSegment(api_synthesizer.engine, hold_at=3)  # pieces 1 and 2 finish, 3 is held
            monkeypatch.setattr(api_synthesizer.engine, "generate", hold)
            job_id = client.post("/v1/jobs", json=job).json()["id"]
            assert hold.holding.wait(60)
            assert sorted(p.name for p in (pieces_root / job_id).iterdir()) == [
                "0.json",
                "0.npy",
                "1.json",
                "1.npy",
            ]
            with server.client(headers={"Authorization": f"Bearer {admin_key}"}) as admin:
                assert admin.post("/admin/engine/restart").status_code == 202
            final = wait_job(client, job_id, timeout=300)
            assert final["state"] == "done" and final["output_id"], final
            assert hold.calls == 3 + 2  # the second attempt made pieces 3 and 4 only
            assert not (pieces_root / job_id).exists()  # gone with the job's end

            def samples(output_id: str):
                return sf.read(io.BytesIO(client.get(f"/v1/outputs/{output_id}").content))[0]

            assert samples(final["output_id"]) == pytest.approx(samples(whole["output_id"]), abs=1e-4)
            wait_for(lambda: client.get("/v1/me").json()["quota"]["reserved_s"] == 0)
            used = client.get("/v1/me").json()["quota"]["used_s"]
            made = [whole["duration_s"], final["duration_s"]]
        assert used == pytest.approx(sum(made), abs=0.05), (used, made)
    finally:
        server.stop()


def test_a_worker_drops_what_an_ended_jobs_earlier_attempt_kept(worker) -> None:
    """A worker taking the task of a long text that was cancelled meanwhile released its reservation, but
    the pieces an earlier attempt had kept stayed on disk for ever."""
    import numpy as np

    from cosyserve.service.outcomes import SentenceTiming, SynthesisResult

    service = worker.service
    key, _ = service.keys.create("erin", role="user")
    job_id = uuid.uuid4().hex
    spec = wire.encode_job_spec(OutputSpec(owner=f"key:{key.id}", key=key, endpoint="jobs"))
    service.jobs.create({"text": LONG_TEXT}, kind="tts", owner=f"key:{key.id}", job_id=job_id, spec=spec)
    service.jobs.claim(job_id, "dead-worker", 30)
    service.jobs.charge(job_id, 28.2)  # its kept pieces, charged as they were made
    service.access.quota.add(key, 28.2)
    pieces = worker.local.job_runner.pieces
    made = SynthesisResult(np.zeros(240, np.float32), 24000, 1, [SentenceTiming(0, "一", 0.0, 0.01)])
    pieces.save(job_id, 0, LONG_TEXT, "m", made, charged_s=28.2)
    assert (pieces.root / job_id).is_dir()
    service.jobs.finish_cancelled(job_id, "cancelled by the client")  # as the API node does, its worker dead
    worker._claimed(FakeTask(), job_id, lambda attempt: pytest.fail("an ended job ran"))
    assert not (pieces.root / job_id).exists()
    # the key paid 28.2 s for audio nobody got: taken back (once, however often the task comes)
    assert service.access.quota.used(key) == pytest.approx(0.0) and service.jobs.get(job_id).charged_s == 0.0
    worker._claimed(FakeTask(), job_id, lambda attempt: pytest.fail("an ended job ran"))
    assert service.access.quota.used(key) == pytest.approx(0.0)


def test_a_long_text_revoked_while_it_waited_to_go_on_keeps_its_finished_pieces(
    start_api_server, api_synthesizer, prompt_wav_bytes, monkeypatch
):
    """Revoked between a restart and its next attempt, a long text failed saying "the parts finished
    before are kept and charged" and kept nothing, its charge given back: its pieces are its result."""
    server = start_api_server(max_text_chars=40, service_kwargs={"shutdown_grace_s": 0.2})
    record, key = server.service.keys.create("leaver", "user", quota=600.0)
    _, admin_key = server.service.keys.create("restarter", "admin")
    try:
        with server.client(headers={"Authorization": f"Bearer {key}"}) as client:
            enrol_voice(client, "bea", prompt_wav_bytes)
            hold = HoldOneSegment(api_synthesizer.engine, hold_at=3)  # pieces 1 and 2 finish, 3 is held
            monkeypatch.setattr(api_synthesizer.engine, "generate", hold)
            job_id = client.post("/v1/jobs", json={"text": LONG_TEXT, "voice": "bea", "seed": 5}).json()["id"]
            assert hold.holding.wait(60)
        with server.client(headers={"Authorization": f"Bearer {admin_key}"}) as admin:
            assert admin.post("/admin/engine/restart").status_code == 202
            server.service.keys.revoke(record.id)
            final = wait_job(admin, job_id, timeout=300)
            assert final["state"] == "failed" and final["error"]["code"] == "key_revoked", final
            assert "the parts finished before are kept and charged" in final["error"]["message"]
            assert final["partial"]["segments_done"] == 2 and final["result_url"], final
            audio = admin.get(f"/v1/outputs/{final['output_id']}")
            assert audio.status_code == 200 and final["duration_s"] > 0
            assert hold.calls == 3  # nothing made after the revoke
        wait_for(lambda: server.service.access.quota.reserved(record.id) == 0)
        assert server.service.access.quota.used(record.id) == pytest.approx(final["duration_s"], abs=0.05)
    finally:
        server.stop()
