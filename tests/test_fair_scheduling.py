"""Fair scheduling: interactive work before background work, keys sharing fairly, units as the grain."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from cosyserve.errors import Cancelled
from cosyserve.service.metrics import Metrics
from cosyserve.service.scheduling.fair_policy import FairPolicy, FairSettings, Waiter
from cosyserve.service.scheduling.scheduler import Scheduler, WorkContext
from cosyserve.service.scheduling.slots import EngineSlots
from cosyserve.service.scheduling.wait_estimates import Holder, Queued, ServiceTimes, estimate_waits

WAIT = 5.0
NOBODY: dict[str, int] = {}


def waiter(ticket_id: str, work_class: str, key: str, seq: int) -> Waiter:
    return Waiter(ticket_id, work_class, key, seq)  # type: ignore[arg-type]


# -- the policy, deterministic --------------------------------------------------------------------------


def test_interactive_goes_before_background_and_keys_take_turns() -> None:
    policy = FairPolicy()
    batch = [waiter(f"a{i}", "background", "A", i) for i in range(5)]
    single = waiter("b", "background", "B", 10)
    tts = waiter("t", "interactive", "C", 11)
    assert policy.choose([*batch, single, tts], NOBODY, 1, 0.0) is tts
    # within the class: A's first (earliest), then B's one before A's second, although A queued more
    order = []
    pool = [*batch, single]
    for step in range(3):
        chosen = policy.choose(pool, NOBODY, 1, float(step))
        assert chosen is not None
        order.append(chosen.ticket_id)
        pool.remove(chosen)
        policy.granted(chosen, 1.0)
        policy.settled(chosen, 1.0, 1.0, float(step))
    assert order == ["a0", "b", "a1"]


def test_background_gets_its_share_under_constant_interactive_load() -> None:
    policy = FairPolicy(FairSettings(background_share=0.2))
    fg, bg = waiter("t", "interactive", "C", 0), waiter("a", "background", "A", 1)
    served = {"interactive": 0.0, "background": 0.0}
    for step in range(200):
        chosen = policy.choose([fg, bg], NOBODY, 1, float(step))
        assert chosen is not None
        policy.granted(chosen, 1.0)
        policy.settled(chosen, 1.0, 1.0, float(step))
        served[chosen.work_class] += 1.0
    assert 0.15 <= served["background"] / 200 <= 0.3


def test_background_slots_keep_slots_for_interactive_work() -> None:
    policy = FairPolicy(FairSettings(background_slots=1))
    bg = waiter("a", "background", "A", 0)
    assert policy.choose([bg], {"background": 1}, 2, 0.0) is None
    assert policy.choose([bg], {"background": 0}, 2, 0.0) is bg


def test_the_wait_estimate_plays_units_forward() -> None:
    times = ServiceTimes()
    times.observe("interactive", 2.0)
    times.observe("background", 1.0)
    running = Holder(waiter("a", "background", "A", 0), 0.5, units_after=100)
    queued = [Queued(waiter(f"t{i}", "interactive", f"K{i}", i + 1), 0, queued=True) for i in range(3)]
    found = estimate_waits(FairPolicy(), 1, [running], queued, times, now=0.0)
    # the batch's unit ends at 0.5 s, then each interactive request takes 2 s
    assert found == {"t0": (0, 0.5), "t1": (1, 2.5), "t2": (2, 4.5)}


# -- the scheduler, with fake work ------------------------------------------------------------------------


@pytest.fixture
def make_scheduler() -> Iterator[Any]:
    made: list[Scheduler] = []

    def make(concurrency: int = 1, queue_size: int = 8, **kw: Any) -> Scheduler:
        scheduler = Scheduler(concurrency, queue_size, 30.0, **kw)
        made.append(scheduler)
        return scheduler

    yield make
    for scheduler in made:
        scheduler.shutdown(grace_s=0.5)


def units(log: list[str], name: str, count: int, seconds: float = 0.01) -> Any:
    """Background work of `count` units, each logged as it runs."""

    def work(ctx: WorkContext) -> int:
        for index in range(count):
            ctx.next_unit()
            log.append(f"{name}{index}")
            time.sleep(seconds)
        return count

    return work


def wait_until(predicate: Any, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.002)


def test_an_interactive_request_waits_one_unit_of_another_keys_batch(make_scheduler: Any) -> None:
    scheduler = make_scheduler(concurrency=1)
    log: list[str] = []
    batch = scheduler.submit(units(log, "a", 100), owner="key:A", work_class="background")
    wait_until(lambda: len(log) >= 3)
    before = len(log)
    tts = scheduler.submit(lambda ctx: log.append("tts") or "spoken", owner="key:B")
    assert tts.result(WAIT) == "spoken"
    assert log.index("tts") - before <= 1  # at most the unit running when it came
    assert batch.state == "running"
    assert batch.result(WAIT) == 100


def test_two_keys_background_work_progresses_side_by_side(make_scheduler: Any) -> None:
    scheduler = make_scheduler(concurrency=1)
    log: list[str] = []
    first = scheduler.submit(units(log, "a", 30), owner="key:A", work_class="background")
    wait_until(lambda: len(log) >= 2)
    second = scheduler.submit(units(log, "b", 5), owner="key:B", work_class="background")
    assert second.result(WAIT) == 5 and first.result(WAIT) == 30
    b_runs = [i for i, name in enumerate(log) if name.startswith("b")]
    assert b_runs[-1] < 16  # B's 5 units alternated with A's, not after A's 30


def test_cancelling_work_that_waits_for_its_next_unit_ends_it_at_once(make_scheduler: Any) -> None:
    scheduler = make_scheduler(concurrency=1)
    log: list[str] = []
    batch = scheduler.submit(units(log, "a", 100), owner="key:A", work_class="background")
    wait_until(lambda: len(log) >= 1)
    gate = threading.Event()
    holder = scheduler.submit(lambda ctx: gate.wait(WAIT), owner="key:B")
    wait_until(lambda: holder.state == "running")  # the batch now waits between its units
    started = time.monotonic()
    assert batch.cancel()
    assert batch.wait(1.0) and batch.state == "cancelled"
    assert time.monotonic() - started < 0.5
    assert isinstance(batch.exception(), Cancelled)
    gate.set()
    assert holder.result(WAIT) is True


def test_a_units_clock_stops_while_it_waits_for_the_engine(make_scheduler: Any) -> None:
    scheduler = make_scheduler(concurrency=1)

    def job(ctx: WorkContext) -> str:
        for _ in range(3):
            ctx.set_timeout(0.3, "a segment took too long")
            ctx.next_unit()
            time.sleep(0.01)
        return "finished"

    gate = threading.Event()
    blocker = scheduler.submit(lambda ctx: gate.wait(WAIT))
    wait_until(lambda: blocker.state == "running")
    background = scheduler.submit(job, owner="key:A", work_class="background", timeout_s=None)
    interactive_after = [scheduler.submit(lambda ctx: time.sleep(0.2)) for _ in range(2)]
    gate.set()
    assert background.result(WAIT) == "finished"  # waited ~0.4 s for interactive work: no timeout
    for ticket in interactive_after:
        ticket.result(WAIT)


def test_queued_work_has_a_position_and_a_wait_and_the_error_is_measured(make_scheduler: Any) -> None:
    metrics = Metrics(system=False)
    scheduler = make_scheduler(concurrency=1, metrics=metrics)
    scheduler._slots.times.observe("interactive", 0.05)
    gate = threading.Event()
    running = scheduler.submit(lambda ctx: gate.wait(WAIT))
    wait_until(lambda: running.state == "running")
    queued = [scheduler.submit(lambda ctx: time.sleep(0.05)) for _ in range(3)]
    assert [t.position for t in queued] == [0, 1, 2]
    waits = [t.estimated_wait_s() for t in queued]
    assert waits == sorted(waits) and waits[2] > waits[0] >= 0
    stats = scheduler.stats()
    assert stats["classes"]["interactive"]["queued"] == 3 and "unit_seconds" in stats
    gate.set()
    for ticket in queued:
        ticket.result(WAIT)
    sample = metrics.registry.get_sample_value
    assert sample("cosyserve_wait_estimate_error_seconds_count", {"work_class": "interactive"}) == 4


def test_the_cluster_sends_background_work_to_its_own_queue() -> None:
    from cosyserve.service.distributed import celery_app

    assert celery_app.queue_of(celery_app.BATCH_TASK) == celery_app.queue_of(celery_app.JOB_TASK)
    assert celery_app.queue_of(celery_app.JOB_TASK) == celery_app.BACKGROUND_QUEUE != celery_app.QUEUE
    assert celery_app.queue_of(celery_app.TTS_TASK) == celery_app.queue_of(celery_app.ENROL_TASK)
    assert celery_app.queue_of(celery_app.TTS_TASK) == celery_app.QUEUE
    assert celery_app.task_options(celery_app.JOB_TASK)["max_retries"] is None  # retries are not capped


# -- the wait estimate with what submitters say and the scheduler's caps, deterministic --------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass(eq=False)
class FakeTicket:
    id: str
    progress: float = 0.0


def engine(slots: int, unit_s: float = 0.5, **kw: Any) -> tuple[EngineSlots, FakeClock]:
    """Engine slots on a fake clock whose background units took `unit_s`, and whose past background
    tickets had 100 units (what a ticket of unknown size is taken to have)."""
    clock = FakeClock()
    books = EngineSlots(slots, clock=clock, **kw)
    books.times.observe("background", unit_s)
    books.times.observe_ticket_units(100)
    return books, clock


def start(books: EngineSlots, ticket: Any, key: str, units: int | None) -> None:
    books.add(ticket, "background", key, units)
    assert books.grant() == 1 and books.take() is ticket


def next_unit(books: EngineSlots, clock: FakeClock, ticket: Any, seconds: float, progress: float) -> None:
    clock.now += seconds
    books.release(ticket)
    ticket.progress = progress
    books.pause(ticket)
    books.grant()


def test_a_keys_second_job_waits_the_first_jobs_units_not_a_typical_count() -> None:
    books, clock = engine(1)
    first, second = FakeTicket("first"), FakeTicket("second")
    start(books, first, "A", units=8)
    books.add(second, "background", "A", 3)  # same key: first come, first served
    assert books.estimated_wait_s(second) == pytest.approx(8 * 0.5)
    next_unit(books, clock, first, 0.5, progress=1 / 8)
    assert books.granted(first) and books.estimated_wait_s(second) == pytest.approx(7 * 0.5)
    unknown = FakeTicket("unknown")
    books.add(unknown, "background", "A", None)  # no count given: a typical ticket's (100 units)
    assert books.estimated_wait_s(unknown) == pytest.approx((7 + 3) * 0.5)
    assert books.position(second) == 0 and books.position(unknown) == 1


def test_a_job_submitted_with_its_units_is_told_their_time() -> None:
    with Scheduler(1, 4, 30.0) as scheduler:
        scheduler._slots.times.observe("background", 1.0)
        scheduler._slots.times.observe_ticket_units(100)
        gate = threading.Event()
        first = scheduler.submit(lambda ctx: gate.wait(WAIT), owner="A", work_class="background", units=4)
        wait_until(lambda: first.state == "running")
        second = scheduler.submit(lambda ctx: 2, owner="A", work_class="background", units=2)
        assert 3.5 < second.estimated_wait_s() <= 4.0  # the first job's 4 units of 1 s, not 100
        gate.set()
        assert second.result(WAIT) == 2


def test_a_queued_background_ticket_waits_while_the_background_tickets_started_are_at_their_cap() -> None:
    books, _clock = engine(2, background_running=1)
    first, second = FakeTicket("first"), FakeTicket("second")
    start(books, first, "A", units=4)
    books.add(second, "background", "B", 2)
    assert books.grant() == 0  # a slot is free, but only one background ticket may be started
    assert books.estimated_wait_s(second) == pytest.approx(4 * 0.5)  # when the first one ended
    uncapped, _ = engine(2, background_running=2)
    start(uncapped, first, "A", units=4)
    uncapped.add(second, "background", "B", 2)
    assert uncapped.estimated_wait_s(second) == 0.0


def test_a_queued_background_ticket_waits_for_the_background_slots() -> None:
    books, clock = engine(2, fair=FairSettings(background_slots=1))
    first, second, same_key = FakeTicket("first"), FakeTicket("second"), FakeTicket("same")
    start(books, first, "A", units=4)
    books.add(second, "background", "B", 2)
    books.add(same_key, "background", "A", 2)
    assert books.grant() == 0  # the background class holds its one slot
    # B's first unit comes when A's first ends (the keys take turns); A's second job after A's first job
    # and B's 2 units: 4 + 2 units of 0.5 s on the one background slot
    assert books.estimated_wait_s(second) == pytest.approx(0.5)
    assert books.estimated_wait_s(same_key) == pytest.approx(6 * 0.5)
    next_unit(books, clock, first, 0.5, progress=0.25)
    assert books.handoff == deque([second]) and books.estimated_wait_s(second) == 0.0
