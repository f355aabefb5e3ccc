"""Job records: transitions, one result per job, restart recovery, paging; the database factory."""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import text

from cosyserve.errors import (
    Cancelled,
    InputError,
    JobStateError,
    JobTimeout,
    QueueFull,
    SettingsError,
    ShuttingDown,
    error_code,
)
from cosyserve.service.scheduling.scheduler import Scheduler, Ticket
from cosyserve.service.stores.db import make_engine, sqlite_path
from cosyserve.service.stores.job_table import sanitize_params, utc_now
from cosyserve.service.stores.jobs import INTERRUPTED_MESSAGE, JobStore


@pytest.fixture
def store() -> JobStore:
    return JobStore(make_engine("sqlite://"))


def test_lifecycle_done(store: JobStore) -> None:
    job = store.create({"text": "你好", "seed": 3}, owner="key-1")
    assert (job.state, job.kind, job.progress, job.owner) == ("queued", "tts", 0.0, "key-1")
    assert len(job.id) == 32 and job.created_at.tzinfo is not None and not job.is_terminal
    running = store.mark_running(job.id)
    assert running.state == "running" and running.started_at is not None
    assert store.set_progress(job.id, 0.5) and store.get(job.id).progress == 0.5
    done = store.finish_done(
        job.id, output_id="out1", output_path="/o/out1.wav", duration_s=2.5, seed=1234, extra={"warnings": []}
    )
    assert (done.state, done.progress, done.output_id, done.seed, done.duration_s) == (
        "done",
        1.0,
        "out1",
        1234,
        2.5,
    )
    assert done.finished_at >= done.started_at >= done.created_at
    assert done.to_dict()["finished_at"].endswith("+00:00")
    assert not store.set_progress(job.id, 0.7)  # no longer running: ignored


def test_finishing_twice_is_refused(store: JobStore) -> None:
    job = store.create({})
    store.mark_running(job.id)
    store.finish_done(job.id, seed=1)
    with pytest.raises(JobStateError, match="is done; it cannot become done"):
        store.finish_done(job.id, seed=2)
    with pytest.raises(JobStateError, match="cannot become failed"):
        store.finish_failed(job.id, "internal", "late error")
    with pytest.raises(JobStateError, match="cannot become running"):
        store.mark_running(job.id)
    assert store.get(job.id).seed == 1
    with pytest.raises(JobStateError, match="no job"):
        store.finish_cancelled("0" * 32)


def test_queued_can_be_cancelled_or_failed_but_not_done(store: JobStore) -> None:
    a, b, c = store.create({}), store.create({}), store.create({})
    assert store.finish_cancelled(a.id, "client cancelled").state == "cancelled"
    failed = store.finish_failed(b.id, "shutting_down", "server shutting down")
    assert (failed.error_code, failed.error_message) == ("shutting_down", "server shutting down")
    with pytest.raises(JobStateError, match="only from running"):
        store.finish_done(c.id)


def test_finish_with_exception_codes(store: JobStore) -> None:
    jobs = [store.create({}) for _ in range(3)]
    for job in jobs:
        store.mark_running(job.id)
    assert store.finish_with_exception(jobs[0].id, Cancelled("client went away")).state == "cancelled"
    timed_out = store.finish_with_exception(jobs[1].id, JobTimeout("too long"))
    assert (timed_out.state, timed_out.error_code, timed_out.error_message) == (
        "failed",
        "timeout",
        "too long",
    )
    assert store.finish_with_exception(jobs[2].id, ZeroDivisionError()).error_code == "internal"


def test_error_codes() -> None:
    assert error_code(InputError("x")) == "invalid_input"
    assert error_code(QueueFull("x", 3)) == "queue_full"
    assert error_code(ShuttingDown("x")) == "shutting_down"
    # One error table: a job state conflict has the API's code everywhere (job records said "job_state")
    assert error_code(JobStateError("x")) == "conflict"
    assert error_code(SettingsError("x")) == "settings"
    assert error_code(RuntimeError("x")) == "internal"


@pytest.mark.parametrize("on_disk", [False, True])
def test_only_one_racing_finisher_wins(on_disk: bool, tmp_path: Path) -> None:
    store = JobStore(make_engine(f"sqlite:///{tmp_path / 'jobs.db'}" if on_disk else "sqlite://"))
    job = store.create({})
    store.mark_running(job.id)
    wins, losses, lock = [], [], threading.Lock()

    def finish(i: int) -> None:
        try:
            store.finish_done(job.id, seed=i)
        except JobStateError:
            with lock:
                losses.append(i)
        else:
            with lock:
                wins.append(i)

    threads = [threading.Thread(target=finish, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(wins) == 1 and len(losses) == 7
    assert store.get(job.id).seed == wins[0]


def test_requeue_interrupted_after_restart(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'nested' / 'dir' / 'cosyserve.db'}"
    before = JobStore(make_engine(url))
    queued = before.create({}, prompt_wav=b"RIFF-audio")
    running, done, worn = before.create({}), before.create({}), before.create({})
    assert before.claim(running.id, "node-1", 30).attempt == 1
    before.claim(done.id, "node-1", 30)
    before.finish_done(done.id, seed=5)
    for _ in range(3):  # interrupted three times already
        before.claim(worn.id, "node-1", 0)
    before.engine.dispose()

    after = JobStore(make_engine(url))  # a new process on the same database
    requeued, failed = after.requeue_interrupted(max_attempts=3)
    assert [job.id for job in requeued] == [queued.id, running.id] and [job.id for job in failed] == [worn.id]
    assert after.get(running.id).state == "queued" and after.get(running.id).attempt == 1
    assert after.claim(running.id, "node-2", 30).attempt == 2  # the retry is the next attempt
    assert (after.get(worn.id).state, after.get(worn.id).error_code) == ("failed", "interrupted")
    assert INTERRUPTED_MESSAGE in after.get(worn.id).error_message
    assert after.get(done.id).state == "done"
    assert after.prompt_wav(queued.id) == b"RIFF-audio"  # kept while the job waits
    after.finish_cancelled(queued.id)
    assert after.prompt_wav(queued.id) is None  # and dropped once it ended


def test_release_gives_a_running_attempt_back_to_the_queue(store: JobStore) -> None:
    job = store.create({})
    attempt = store.claim(job.id, "node", 30).attempt
    store.release(job.id, attempt)
    assert store.get(job.id).state == "queued"
    with pytest.raises(JobStateError):
        store.release(job.id, attempt)  # no longer running
    assert store.claim(job.id, "node", 30).attempt == attempt + 1


def test_a_job_stopped_early_keeps_its_finished_part(store: JobStore) -> None:
    from cosyserve.service.access.principals import QuotaExceeded

    job = store.create({}, owner="key:1", reserved_s=10.0)
    store.claim(job.id, "node", 30)
    store.charge(job.id, 4.0)
    assert store.reserved_s("key:1") == pytest.approx(6.0)  # set aside, less what was charged
    assert store.reserved_s("key:2") == 0.0
    ended = store.finish_done(job.id, output_id="out", duration_s=4.0, stopped=QuotaExceeded("quota", 60))
    assert (ended.state, ended.error_code, ended.output_id) == ("failed", "quota_exceeded", "out")
    assert store.reserved_s("key:1") == 0.0  # a finished job holds nothing back


def test_a_segment_that_outlives_its_job_is_not_charged(store: JobStore) -> None:
    """A segment timeout ended the job and gave its charges back while the segment still ran; the segment
    then finished and was charged (12.8-17.1 s kept by jobs that kept nothing)."""
    job = store.create({}, owner="key:1", reserved_s=30.0)
    store.claim(job.id, "node", 30)
    assert store.charge(job.id, 4.0)
    store.finish_failed(job.id, "timeout", "a segment ran too long")
    assert store.take_charged(job.id) == pytest.approx(4.0)  # what the refund gives back
    assert not store.charge(job.id, 3.0)  # the late segment
    assert store.get(job.id).charged_s == 0.0


def test_list_by_owner_newest_first_with_paging(store: JobStore) -> None:
    mine = [store.create({"n": i}, owner="alice").id for i in range(5)]
    store.create({}, owner="bob")
    page1 = store.list(owner="alice", limit=2)
    page2 = store.list(owner="alice", limit=2, offset=2)
    page3 = store.list(owner="alice", limit=2, offset=4)
    assert [j.id for j in page1 + page2 + page3] == mine[::-1]
    assert store.count(owner="alice") == 5 and store.count() == 6
    assert len(store.list()) == 6
    store.mark_running(mine[0])
    assert [j.id for j in store.list(state="running")] == [mine[0]]
    with pytest.raises(InputError, match="limit"):
        store.list(limit=0)


def test_params_never_hold_raw_audio(store: JobStore) -> None:
    job = store.create({"text": "hi", "prompt_wav": b"RIFF" + bytes(100), "nested": {"x": (1, b"ab")}})
    assert job.params == {"text": "hi", "prompt_wav": "<104 bytes>", "nested": {"x": [1, "<2 bytes>"]}}
    assert sanitize_params({"path": Path("/a")}) == {"path": "/a"}


def test_purge_finished_before(store: JobStore) -> None:
    from cosyserve.service.stores.batches import BatchStore

    old, active = store.create({}), store.create({})
    store.finish_cancelled(old.id)
    batches = BatchStore(store.engine)
    ended = [store.create({"items": 2}, kind="batch") for _ in range(3)]
    for batch in ended:
        batches.add(batch.id, [{"name": "a", "params": {"text": "一。"}}, {"name": "b", "params": {}}])
        store.finish_cancelled(batch.id)
    assert store.purge_finished_before(utc_now() - timedelta(days=1)) == 0
    assert store.purge_finished_before(utc_now() + timedelta(seconds=1), chunk=2) == 4
    assert store.get(old.id) is None and store.get(active.id) is not None
    assert all(batches.items(batch.id) == [] for batch in ended)  # their items (texts) went with them


def test_sqlite_engine_is_tuned(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'a' / 'b.db'}"
    engine = make_engine(url)
    assert sqlite_path(url) == tmp_path / "a" / "b.db" and (tmp_path / "a").is_dir()
    with engine.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert conn.execute(text("PRAGMA busy_timeout")).scalar() >= 1000
    assert sqlite_path("sqlite://") is None and sqlite_path("postgresql://u@h/db") is None
    with pytest.raises(SettingsError, match="not a database URL"):
        make_engine("no url at all")


def test_scheduler_drives_job_records(store: JobStore) -> None:
    """The wiring the API uses: on_state moves the record; every accepted job ends terminal."""

    def on_state(ticket: Ticket, state: str) -> None:
        if state == "running":
            store.mark_running(ticket.id)
        elif state == "done":
            store.finish_done(ticket.id, seed=ticket.value)
        else:
            store.finish_with_exception(ticket.id, ticket.exception(0))

    scheduler = Scheduler(concurrency=1, queue_size=4, request_timeout_s=5)
    gate = threading.Event()

    def slow(ctx: object) -> int:
        gate.wait(5)
        return 7

    jobs = [store.create({"i": i}) for i in range(4)]
    tickets = [scheduler.submit(slow, job_id=jobs[0].id, on_state=on_state)]
    tickets += [scheduler.submit(lambda ctx: 8, job_id=job.id, on_state=on_state) for job in jobs[1:]]
    tickets[1].cancel()
    gate.set()
    tickets[0].wait(5)
    scheduler.shutdown(grace_s=0)
    states = [store.get(job.id).state for job in jobs]
    assert states[:2] == ["done", "cancelled"]
    assert all(state in ("done", "failed") for state in states[2:])
    assert all(store.get(job.id).is_terminal for job in jobs)


def test_a_damaged_record_fails_alone_and_the_server_starts(tmp_path: Path) -> None:
    """One running row whose JSON was damaged stopped every start ("Application startup failed")."""
    import sqlalchemy as sa

    store = JobStore(make_engine(f"sqlite:///{tmp_path / 'cosyserve.db'}"))
    good, bad = store.create({"n": 1}), store.create({"n": 2})
    store.claim(good.id, "node", 30), store.claim(bad.id, "node", 30)
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE jobs SET params = '{not json' WHERE id = :id"), {"id": bad.id})
    queued, failed = store.requeue_interrupted(max_attempts=3)
    assert [job.id for job in queued] == [good.id] and failed == []
    with store.engine.connect() as conn:
        query = sa.text("SELECT state, error_code FROM jobs WHERE id = :id")
        state = conn.execute(query, {"id": bad.id}).one()
    assert tuple(state) == ("failed", "unreadable")
