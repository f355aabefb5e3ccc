"""Jobs whose worker died and whose task message is gone (`distributed/lost_jobs.py`), against a real
redis-server and a real jobs table: a batch is sent again once per attempt, a long-text job ends
`worker_lost` once even kombu's redelivery would have come, and a job a live worker holds is left alone."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from cosyserve.service.distributed.lost_jobs import LostJobSweep
from cosyserve.service.distributed.relay import connect
from cosyserve.service.stores.db import make_engine
from cosyserve.service.stores.job_table import JobRecord, utc_now
from cosyserve.service.stores.jobs import JobStore

LEASE_S, VISIBILITY_S = 30.0, 600.0


class Clock:
    def __init__(self) -> None:
        self.now = utc_now()

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture()
def setup(redis_url: str, tmp_path: Path):
    jobs = JobStore(make_engine(f"sqlite:///{tmp_path / 'jobs.db'}"))
    client = connect(redis_url)
    clock = Clock()
    sent: list[str] = []
    released: list[str] = []

    def resend(record: JobRecord) -> None:
        sent.append(record.id)

    sweep = LostJobSweep(
        jobs,
        client,
        resend,
        lease_s=LEASE_S,
        visibility_timeout_s=VISIBILITY_S,
        released=released.append,
        clock=clock,
        prefix=f"test-{uuid.uuid4().hex[:8]}",
    )
    yield jobs, sweep, clock, sent, released
    client.close()


def _running(jobs: JobStore, kind: str, worker: str = "wA") -> str:
    job_id = jobs.create({"items": 3}, kind=kind).id
    assert jobs.claim(job_id, worker, LEASE_S) is not None
    return job_id


def test_a_batch_whose_worker_stopped_is_sent_again_once_per_attempt(setup) -> None:
    jobs, sweep, clock, sent, _ = setup
    batch, dub = _running(jobs, "batch"), _running(jobs, "dub")
    clock.now = utc_now() + timedelta(seconds=LEASE_S * 1.5)  # lease out, but not a lease ago
    assert sweep.sweep().resent == [] and sent == []
    clock.advance(LEASE_S)
    assert sorted(sweep.sweep().resent) == sorted([batch, dub])
    clock.advance(LEASE_S)
    assert sweep.sweep().resent == []  # already sent for this attempt: its copy may still be on its way
    # Another worker claims the batch (attempt 2) and dies too: that attempt is sent again.
    assert jobs.renew(batch, 1, 0.0)  # wA's lease runs out in the store's own (real) time too
    assert jobs.claim(batch, "wB", LEASE_S) is not None and jobs.get(batch).attempt == 2
    clock.now = jobs.get(batch).lease_until + timedelta(seconds=LEASE_S / 2)
    assert sweep.sweep().resent == []  # wB's lease ran out less than a lease ago
    clock.advance(LEASE_S)
    assert sweep.sweep().resent == [batch]
    assert sorted(sent) == sorted([batch, dub, batch])


def test_a_long_text_job_ends_worker_lost_only_after_kombu_would_have_redelivered_it(setup) -> None:
    jobs, sweep, clock, sent, released = setup
    job = _running(jobs, "tts")
    lease_until = jobs.get(job).lease_until
    clock.now = lease_until + timedelta(seconds=VISIBILITY_S)  # kombu's copy may still come
    assert sweep.sweep().failed == [] and jobs.get(job).state == "running"
    clock.now = lease_until + timedelta(seconds=VISIBILITY_S + sweep.restore_interval_s + LEASE_S + 1)
    assert sweep.sweep().failed == [job]
    record = jobs.get(job)
    assert record.state == "failed" and record.error_code == "worker_lost"
    assert "submit the job again" in (record.error_message or "")
    assert released == [job] and sent == []  # its reservation given back; never sent again


def test_jobs_held_queued_or_ended_are_left_alone(setup) -> None:
    jobs, sweep, clock, sent, released = setup
    held = _running(jobs, "batch")
    queued = jobs.create({"items": 1}, kind="batch").id
    ended = _running(jobs, "tts")
    jobs.finish_failed(ended, "internal", "boom")
    clock.advance(LEASE_S / 2)  # held's lease is live
    result = sweep.sweep()
    assert (result.resent, result.failed, sent, released) == ([], [], [], [])
    assert {jobs.get(j).state for j in (held, queued)} == {"running", "queued"}


def test_a_job_a_live_worker_runs_is_left_to_it_whatever_this_hosts_clock_says(setup, caplog) -> None:
    jobs, sweep, clock, sent, released = setup
    batch, job = _running(jobs, "batch"), _running(jobs, "tts")
    sweep.running_elsewhere = lambda: {batch, job}  # wA's heartbeat lists both: it is alive and runs them
    clock.advance(VISIBILITY_S + 3600)  # this host's clock jumped an hour ahead (or runs ahead of wA's)
    for _ in range(2):
        result = sweep.sweep()
        assert (result.resent, result.failed, sent, released) == ([], [], [], [])
    assert {jobs.get(j).state for j in (batch, job)} == {"running"}
    skewed = [r for r in caplog.records if "clocks in step" in r.getMessage()]
    assert len(skewed) == 2  # said once per job and attempt, not at every sweep
    sweep.running_elsewhere = frozenset  # wA's heartbeat expired: it is gone
    result = sweep.sweep()
    assert (result.resent, result.failed) == ([batch], [job])


def test_one_worker_sweeps_per_lease(setup) -> None:
    jobs, sweep, clock, sent, _ = setup
    batch = _running(jobs, "batch")
    clock.now = jobs.get(batch).lease_until + timedelta(seconds=LEASE_S + 1)
    other = LostJobSweep(
        jobs,
        sweep.client,
        lambda record: sent.append(record.id),
        lease_s=LEASE_S,
        visibility_timeout_s=VISIBILITY_S,
        clock=clock,
        prefix=sweep.turn_key.rsplit(":lost-jobs", 1)[0],
    )
    assert sweep.maybe_sweep().resent == [batch]
    assert other.maybe_sweep().resent == []  # not its turn: the first swept within the lease
    assert sent == [batch]
