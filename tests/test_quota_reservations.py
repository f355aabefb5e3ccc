"""Issue 25: quota reservations are atomic. Admission holds a request's estimate against usage plus what is
in flight, on SQLite and PostgreSQL, from several threads and several engines (nodes) at once; the real
length replaces the hold; failures give it back; holds of dead processes stop counting."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import sqlalchemy as sa

from cosyserve.errors import ShuttingDown
from cosyserve.service.access.estimate import request_estimate_s, voice_pace
from cosyserve.service.access.principals import QuotaExceeded
from cosyserve.service.access.quota import QuotaTracker, this_process
from cosyserve.service.reservations import QuotaReservations
from cosyserve.service.stores.db import make_engine
from cosyserve.service.stores.jobs import JobStore
from cosyserve.service.stores.keys import ApiKey

T0 = 1_700_000_000.0  # 22:13 UTC: the day does not change within a test


class FakeClock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def key_with(quota: float | None, key_id: int = 1) -> ApiKey:
    return ApiKey(key_id, "k", "cs_abcdefgh", "user", T0, None, None, quota, None)


@pytest.fixture()
def tracker(tmp_path: Path) -> QuotaTracker:
    return QuotaTracker(make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}"), sa.MetaData(), clock=FakeClock())


# -- concurrent admission: threads and nodes at once -------------------------------------------------------


@pytest.mark.parametrize("requests", [10, 50])
def test_concurrent_admissions_never_promise_more_than_the_quota(database_url: str, requests: int) -> None:
    engines = [make_engine(database_url) for _ in range(2)]  # two nodes sharing one database
    try:
        nodes = [QuotaTracker(engine, sa.MetaData()) for engine in engines]
        key = key_with(10.0, key_id=7)
        barrier = threading.Barrier(requests)
        admitted, refused, errors = [], [], []

        def request(number: int) -> None:
            node = nodes[number % 2]
            barrier.wait()
            try:
                reservation = node.reserve(key, 1.5)
            except QuotaExceeded as exc:
                refused.append(exc)
                return
            except Exception as exc:  # pragma: no cover - reported below
                errors.append(exc)
                return
            admitted.append(reservation)
            node.settle(reservation, key, 1.5)  # the real length, as long as the estimate

        threads = [threading.Thread(target=request, args=(n,)) for n in range(requests)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors, errors
        assert len(admitted) == 6 and len(refused) == requests - 6  # 6 x 1.5 s fit in 10 s, a 7th does not
        assert nodes[0].used(key) == pytest.approx(9.0)
        assert nodes[1].reserved(key) == 0.0  # every hold was replaced by its charge
        assert "1.0 s left" in str(refused[0]) and refused[0].retry_after_s > 0
    finally:
        for engine in engines:
            engine.dispose()


# -- one reservation's life --------------------------------------------------------------------------------


def test_a_request_whose_estimate_does_not_fit_is_refused_before_anything_is_held(tracker) -> None:
    key = key_with(10.0)
    tracker.add(key, 4.0)
    first = tracker.reserve(key, 5.0)
    with pytest.raises(QuotaExceeded, match=r"1\.0 s left .*4\.0 s used today, 5\.0 s reserved"):
        tracker.reserve(key, 1.5)
    assert tracker.reserved(key) == 5.0
    status = tracker.check(key)
    assert (status.used_s, status.reserved_s, status.remaining_s) == (4.0, 5.0, 1.0)
    tracker.release(first)
    assert tracker.reserve(key, 6.0) is not None  # given back: it fits now


def test_settle_replaces_the_hold_and_release_after_it_changes_nothing(tracker) -> None:
    key = key_with(10.0)
    held = tracker.reserve(key, 3.0)
    tracker.settle(held, key, 2.2)
    tracker.release(held)  # the ticket's end after the charge: a no-op
    tracker.settle(held, key, 0.0)  # a second settle finds no hold either
    assert (tracker.used(key), tracker.reserved(key)) == (pytest.approx(2.2), 0.0)
    tracker.settle(None, key, 1.0)  # no reservation (an unlimited key then): counted alone
    assert tracker.used(key) == pytest.approx(3.2)


def test_unlimited_keys_hold_nothing(tracker) -> None:
    assert tracker.reserve(key_with(None), 1e6) is None
    assert tracker.reserved(key_with(None)) == 0.0


def test_a_jobs_hold_shrinks_as_it_is_charged_and_is_renewed(tracker) -> None:
    key, clock = key_with(10.0), tracker._clock
    assert tracker.reserve(key, 6.0, holder="job", reservation_id="job1", ttl_s=60.0) == "job1"
    tracker.settle_part("job1", key, 2.5)
    assert (tracker.used(key), tracker.reserved(key)) == (2.5, 3.5)
    clock.now += 3000  # past the first expiry, but the charge renewed it for reservation_ttl_s
    assert tracker.reserved(key) == 3.5
    tracker.settle_part("job1", key, 5.0)  # ran past its estimate: the hold stops at zero
    assert (tracker.used(key), tracker.reserved(key)) == (7.5, 0.0)
    tracker.release("job1")
    with pytest.raises(QuotaExceeded):
        tracker.reserve(key, 3.0)


def test_holds_of_dead_processes_and_expired_holds_stop_counting(tracker) -> None:
    key, clock = key_with(10.0), tracker._clock
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
    dead_holder = f"{this_process().rsplit('-', 1)[0]}-{int(dead.stdout)}"
    tracker.reserve(key, 3.0, holder=dead_holder)  # a crashed process on this host
    tracker.reserve(key, 2.0, holder="elsewhere-1")  # another host's: only its expiry frees it
    mine = tracker.reserve(key, 1.0)
    tracker.reserve(key, 1.5, holder="job", ttl_s=10.0)
    assert tracker.reserved(key) == 7.5
    clock.now += 11  # the job's hold expired: no longer counted, even before it is deleted
    assert tracker.reserved(key) == 6.0
    assert tracker.release_dead() == 2  # the expired one and the dead process's
    assert tracker.reserved(key) == 3.0
    clock.now += 3600
    assert tracker.release_dead() == 2 and tracker.reserved(key) == 0.0
    tracker.release(mine)
    assert os.getpid() != int(dead.stdout)


def test_a_restarted_container_releases_what_its_dead_predecessor_held(tracker) -> None:
    """A server that is PID 1 in its container (our image) came back after a crash with the same host and
    pid as the dead one, took its reservations for its own and held the key's quota for an hour."""
    key = key_with(10.0)
    host, mine = this_process().rsplit("-", 1)
    pid = mine.partition(".")[0]
    assert mine != pid  # the start time is part of the name where /proc tells it
    tracker.reserve(key, 3.0, holder=f"{host}-{pid}")  # a predecessor of this version (pid alone)
    tracker.reserve(key, 2.0, holder=f"{host}-{pid}.1")  # a predecessor that started at another time
    parent = os.getppid()  # running, but not the process that started at tick 1 with that pid
    tracker.reserve(key, 1.5, holder=f"{host}-{parent}.1")
    held = tracker.reserve(key, 1.0)  # this process's own
    assert tracker.release_dead() == 3 and tracker.reserved(key) == 1.0
    tracker.release(held)


def test_reservations_count_against_their_own_day(tracker) -> None:
    key, clock = key_with(10.0), tracker._clock
    tracker.reserve(key, 9.0, ttl_s=7 * 86400)
    clock.now += 86400  # the next UTC day starts empty
    assert tracker.check(key).reserved_s == 0.0 and tracker.reserve(key, 9.0) is not None


# -- the day's boundary: work is charged to the day that admitted it ---------------------------------------

MIDNIGHT = T0 - T0 % 86400 + 86400  # the next 00:00 UTC after T0


def test_a_request_admitted_before_midnight_spends_its_own_days_seconds(tracker) -> None:
    key, clock = key_with(60.0), tracker._clock
    clock.now = MIDNIGHT - 10
    late = tracker.reserve(key, 50.0)
    clock.now = MIDNIGHT + 5  # the new day never saw that hold: a whole quota is free
    status = tracker.check(key)
    assert (status.used_s, status.reserved_s, status.remaining_s) == (0.0, 0.0, 60.0)
    early = tracker.reserve(key, 60.0)
    tracker.settle(late, key, 50.0)  # finished after midnight: yesterday's seconds, as admitted
    tracker.settle(early, key, 60.0)
    assert tracker.used(key) == 60.0  # not 110 against a quota of 60
    assert tracker.used(key, now=MIDNIGHT - 1) == 50.0


def test_a_job_running_into_the_next_day_is_charged_and_stopped_by_its_own_day(tracker) -> None:
    key, clock = key_with(60.0), tracker._clock
    clock.now = MIDNIGHT - 100
    tracker.reserve(key, 55.0, holder="job", reservation_id="job1", ttl_s=math.inf)
    tracker.settle_part("job1", key, 20.0)
    clock.now = MIDNIGHT + 100
    tracker.settle_part("job1", key, 30.0)
    assert tracker.check(key).reserved_s == 0.0 and tracker.used(key) == 0.0
    assert tracker.used(key, now=MIDNIGHT - 1) == 50.0 and not tracker.used_up(key, "job1")
    tracker.refund_part("job1", key, 30.0)  # an interrupted attempt's audio, made again: yesterday's
    assert tracker.used(key, now=MIDNIGHT - 1) == 20.0 and tracker.used(key) == 0.0
    tracker.settle_part("job1", key, 45.0)  # past its estimate: yesterday's quota is spent
    assert tracker.used_up(key, "job1") and not tracker.used_up(key)
    assert tracker.reserve(key, 60.0) is not None  # today's is whole


def test_a_jobs_hold_lives_while_it_waits_however_long(tracker) -> None:
    key, clock = key_with(30.0), tracker._clock
    clock.now = MIDNIGHT + 60
    tracker.reserve(key, 19.0, holder="job", reservation_id="queued", ttl_s=math.inf)
    clock.now += 20 * 3600  # waited behind other keys' batches far past reservation_ttl_s
    assert tracker.release_dead() == 0 and tracker.reserved(key) == 19.0
    with pytest.raises(QuotaExceeded):
        tracker.reserve(key, 19.0)
    assert tracker.held_by("job") == ["queued"] and tracker.held_by("job", older_than_s=1e6) == []


def test_a_start_releases_what_ended_or_vanished_jobs_still_hold(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    clock = FakeClock()
    tracker, jobs = QuotaTracker(engine, sa.MetaData(), clock=clock), JobStore(engine)
    reservations, key = QuotaReservations(tracker), key_with(100.0)
    for job_id in ("running", "ended", "vanished"):
        reservations.hold_job(job_id, key, 10.0)
        if job_id != "vanished":
            jobs.create({"text": "x"}, job_id=job_id)
    jobs.finish_failed("ended", "internal", "a crash came before its reservation was released")
    clock.now += 600
    reservations.hold_job("young", key, 10.0)  # its record is on its way (submits hold first)
    reservations.release_dead(jobs)
    assert sorted(tracker.held_by("job")) == ["running", "young"] and tracker.reserved(key) == 20.0


def test_a_refusal_by_the_keys_own_work_in_flight_says_retry_soon(tracker) -> None:
    key, clock = key_with(30.0), tracker._clock
    clock.now = MIDNIGHT - 9.4  # the day ends in 9.4 s
    tracker.reserve(key, 20.0)
    with pytest.raises(QuotaExceeded, match="once the key's running work has finished") as held:
        tracker.reserve(key, 15.0)  # 15 s fit once the 20 s settle (if they are no longer than that)
    assert held.value.held_only and held.value.retry_after_s == 5
    tracker.add(key, 20.0)
    with pytest.raises(QuotaExceeded, match="00:00 UTC") as spent:
        tracker.reserve(key, 15.0)
    assert not spent.value.held_only
    assert spent.value.retry_after_s == 10  # rounded up: a client that waits 9 s would be refused again


# -- estimates ---------------------------------------------------------------------------------------------


def test_estimates_follow_the_voice_pace_and_the_speed() -> None:
    text = "第一句话说得很长很长。"  # 10 syllables: 2.5 s at an average pace
    average = request_estimate_s(text)
    assert average == pytest.approx(2.5 * 1.2 + 0.5)
    slow = voice_pace("希望你以后能够做的比我还好呦。", {"speech_s": 5.25})  # 3.5 s expected, 5.25 s spoken
    assert slow == pytest.approx(1.5)
    assert request_estimate_s(text, pace=slow) > average
    assert request_estimate_s(text, speed=2.0) == pytest.approx(average / 2, abs=0.01)
    assert voice_pace("hi", {"speech_s": 3.0}) is None  # too short a transcript to tell
    assert voice_pace("希望你以后能够做的比我还好呦。", {"speech_s": 60.0}) == 2.0  # a mismatched transcript
    assert voice_pace(None, {"speech_s": 3.0}) is None


# -- a cluster: the API node reserves in the shared database, the worker settles ---------------------------


def test_an_api_node_reserves_and_its_worker_settles(tmp_path: Path, prompt_wav_bytes: bytes) -> None:
    from cosyserve.service import wire
    from cosyserve.service.distributed.remote import RemoteBackend
    from cosyserve.service.local.job_quota import JobQuota
    from cosyserve.service.requests import OutputSpec, SynthesisRequest
    from cosyserve.service.reservations import QuotaReservations
    from cosyserve.service.scheduling.scheduler import Scheduler
    from cosyserve.service.settings import Settings
    from cosyserve.service.stores.batches import BatchStore
    from cosyserve.service.stores.jobs import JobStore

    engine = make_engine(f"sqlite:///{tmp_path / 'shared.db'}")
    tracker, jobs, key = QuotaTracker(engine, sa.MetaData()), JobStore(engine), key_with(10.0)
    settings = Settings(queue={"queue_url": "redis://127.0.0.1:1/0"}, storage={"data_dir": tmp_path})
    scheduler = Scheduler(1, 4, 30.0)
    node = RemoteBackend(
        settings, scheduler, jobs=jobs, voices=None, batches=BatchStore(engine),  # type: ignore[arg-type]
        reservations=QuotaReservations(tracker),
    )  # fmt: skip
    sent: list[list] = []
    worker_done = threading.Event()

    def relay(task_id, ctx):  # the worker's answer: it ends only when the test says so
        worker_done.wait(10)
        raise wire.WorkerLost("the worker stopped")
        yield

    def send(task: str, args: list, task_id: str | None = None) -> str:
        sent.append(args)
        return task_id or "task"

    node.require_ready = lambda: None  # type: ignore[method-assign]
    node._send = send  # type: ignore[method-assign]
    node.reader.items = relay  # type: ignore[method-assign]
    try:
        ticket = node.submit_tts(SynthesisRequest(text="第一句话说得很长很长。"), OutputSpec(key=key))
        assert tracker.reserved(key) == pytest.approx(3.5)  # held on the API node, before the worker runs
        waited = 0
        while not sent and waited < 1000:  # the API node's slot sends the task
            threading.Event().wait(0.01)
            waited += 1
        on_worker = wire.decode_spec(sent[0][1], lambda _id: key)  # what the worker's backend gets
        assert on_worker.reservation is not None
        QuotaReservations(tracker).settle(on_worker, 2.25)  # the worker's `_finish`
        assert (tracker.used(key), tracker.reserved(key)) == (2.25, 0.0)
        worker_done.set()
        ticket.wait(10)  # the API node's end gives back nothing more: the worker settled
        assert (tracker.used(key), tracker.reserved(key)) == (2.25, 0.0)

        job_request = SynthesisRequest(text="第一句话说得很长很长。" * 2, prompt_wav=prompt_wav_bytes)
        job = node.submit_job(job_request, OutputSpec(key=key))  # (a job needs its voice at submit)
        assert tracker.reserved(key) == pytest.approx(6.5)  # under the job's id, in the shared database
        jobs.claim(job.id, "worker", 30)  # a worker took it (a job is charged only while it runs)
        JobQuota(tracker, jobs, lambda _id: key).charge(key.id, job.id, 2.0)  # its first segment
        assert (tracker.used(key), tracker.reserved(key)) == (4.25, pytest.approx(4.5))
        node.cancel_job(job.id)
        assert tracker.reserved(key) == 0.0
        scheduler.shutdown(grace_s=1.0)  # a drain: a job is refused as a request is (it was accepted)
        with pytest.raises(ShuttingDown):
            node.submit_job(job_request, OutputSpec(key=key))
        assert tracker.reserved(key) == 0.0 and len(jobs.list(limit=10)) == 1  # nothing held or recorded
    finally:
        scheduler.shutdown(grace_s=1.0)
        engine.dispose()


def test_estimates_read_numbers_as_they_are_spoken() -> None:
    """Thirteen digits were estimated as 1.6 s, and a team's run made 12-15 s of them on a 17 s quota:
    the estimate counts the words the engine reads (the spoken form), not the characters typed."""
    assert request_estimate_s("1234567890123") > 8.0  # "one trillion two hundred thirty four billion …"
    assert request_estimate_s("$1,234,567.89") > 6.0
    assert request_estimate_s("今天是2024年1月1日。") == pytest.approx(
        request_estimate_s("今天是二零二四年一月一日。")
    )
