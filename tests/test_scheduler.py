"""The scheduler: limits, queueing, cancellation, timeouts, streaming, shutdown — and nothing left hanging."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from cosyserve.errors import Cancelled, InputError, JobStateError, JobTimeout, QueueFull, ShuttingDown
from cosyserve.service.metrics import Metrics
from cosyserve.service.scheduling.scheduler import Scheduler, Ticket, WorkContext

WAIT = 5.0  # generous upper bound for anything that should happen "soon"


@pytest.fixture
def make_scheduler() -> Iterator[Any]:
    made: list[Scheduler] = []

    def make(concurrency: int = 1, queue_size: int = 4, timeout: float | None = 30.0, **kw: Any) -> Scheduler:
        scheduler = Scheduler(concurrency, queue_size, timeout, **kw)
        made.append(scheduler)
        return scheduler

    yield make
    for scheduler in made:
        scheduler.shutdown(grace_s=0.5)


def wait_until(predicate: Any, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.002)


def blocker(gate: threading.Event) -> Any:
    """Work that holds its worker until `gate` opens (or it is cancelled)."""

    def work(ctx: WorkContext) -> str:
        while not gate.wait(0.01):
            ctx.check_cancelled()
        return "released"

    return work


def test_concurrency_limit_respected(make_scheduler: Any) -> None:
    scheduler = make_scheduler(concurrency=3, queue_size=20)
    lock, current, peak = threading.Lock(), [0], [0]

    def work(ctx: WorkContext) -> None:
        with lock:
            current[0] += 1
            peak[0] = max(peak[0], current[0])
        time.sleep(0.03)
        with lock:
            current[0] -= 1

    tickets = [scheduler.submit(work) for _ in range(12)]
    for ticket in tickets:
        ticket.result(WAIT)
    assert peak[0] == 3


def test_queue_full_with_retry_after(make_scheduler: Any) -> None:
    scheduler = make_scheduler(concurrency=1, queue_size=2)
    gate = threading.Event()
    running = scheduler.submit(blocker(gate))
    wait_until(lambda: running.state == "running")
    queued = [scheduler.submit(blocker(gate)) for _ in range(2)]
    assert [t.position for t in queued] == [0, 1]
    with pytest.raises(QueueFull) as info:
        scheduler.submit(blocker(gate))
    assert info.value.retry_after_s >= 1 and "queue is full" in str(info.value)
    assert scheduler.stats()["queued"] == 2 and scheduler.stats()["running"] == 1
    gate.set()
    assert [t.result(WAIT) for t in [running, *queued]] == ["released"] * 3


def test_a_ticket_granted_but_not_yet_started_does_not_shrink_the_queue(make_scheduler: Any) -> None:
    """Submitted back to back, the first ticket holds the slot before a thread has taken it: it counts as
    running, not also as waiting, so the queue still has all its places."""
    scheduler = make_scheduler(concurrency=1, queue_size=1)
    gate = threading.Event()
    accepted = [scheduler.submit(blocker(gate)) for _ in range(2)]  # no pause between them
    with pytest.raises(QueueFull):
        scheduler.submit(blocker(gate))
    gate.set()
    assert [t.result(WAIT) for t in accepted] == ["released"] * 2


def test_zero_queue_accepts_only_when_a_worker_is_free(make_scheduler: Any) -> None:
    scheduler = make_scheduler(concurrency=1, queue_size=0)
    gate = threading.Event()
    first = scheduler.submit(blocker(gate))
    with pytest.raises(QueueFull):
        scheduler.submit(blocker(gate))
    gate.set()
    first.result(WAIT)
    scheduler.submit(lambda ctx: 1).result(WAIT)


def test_fifo_order(make_scheduler: Any) -> None:
    scheduler = make_scheduler(concurrency=1, queue_size=10)
    gate, order = threading.Event(), []
    first = scheduler.submit(blocker(gate))
    wait_until(lambda: first.state == "running")
    tickets = [scheduler.submit(lambda ctx, i=i: order.append(i)) for i in range(8)]
    gate.set()
    for ticket in tickets:
        ticket.result(WAIT)
    assert order == list(range(8))


def test_cancel_queued(make_scheduler: Any) -> None:
    scheduler = make_scheduler(concurrency=1)
    gate, ran = threading.Event(), []
    first = scheduler.submit(blocker(gate))
    wait_until(lambda: first.state == "running")
    victim = scheduler.submit(lambda ctx: ran.append("victim"))
    after = scheduler.submit(lambda ctx: ran.append("after"))
    assert after.position == 1
    assert victim.cancel() is True
    assert victim.state == "cancelled" and victim.done and after.position == 0
    with pytest.raises(Cancelled):
        victim.result(0)
    assert victim.cancel() is False  # already finished
    gate.set()
    after.result(WAIT)
    assert ran == ["after"]


def test_cancel_running(make_scheduler: Any) -> None:
    scheduler = make_scheduler(concurrency=1)
    ticket = scheduler.submit(blocker(threading.Event()))
    wait_until(lambda: ticket.state == "running")
    assert scheduler.cancel(ticket.id) is True
    assert ticket.wait(WAIT) and ticket.state == "cancelled"
    assert isinstance(ticket.exception(), Cancelled)
    assert scheduler.get(ticket.id) is None
    assert scheduler.submit(lambda ctx: "next").result(WAIT) == "next"  # the worker is free again


def test_timeout_fails_with_job_timeout(make_scheduler: Any) -> None:
    scheduler = make_scheduler(concurrency=2, timeout=0.2)
    cooperative = scheduler.submit(blocker(threading.Event()))
    stubborn_done = threading.Event()

    def stubborn(ctx: WorkContext) -> str:
        time.sleep(0.6)  # ignores its cancel event
        stubborn_done.set()
        return "late"

    ignoring = scheduler.submit(stubborn)
    start = time.monotonic()
    with pytest.raises(JobTimeout, match="request timeout"):
        cooperative.result(WAIT)
    with pytest.raises(JobTimeout):
        ignoring.result(WAIT)
    assert time.monotonic() - start < 0.5  # failed at the deadline, not when the stubborn work ended
    assert not stubborn_done.is_set() and ignoring.cancel_event.is_set()
    assert cooperative.state == ignoring.state == "failed"
    assert stubborn_done.wait(WAIT)
    assert ignoring.state == "failed"  # the late return did not produce a second result


def test_exceptions_propagate_with_their_type(make_scheduler: Any) -> None:
    scheduler = make_scheduler()

    def bad_input(ctx: WorkContext) -> None:
        raise InputError("text is empty: give some text")

    def bug(ctx: WorkContext) -> None:
        raise KeyError("oops")

    first, second = scheduler.submit(bad_input), scheduler.submit(bug)
    with pytest.raises(InputError, match="text is empty"):
        first.result(WAIT)
    with pytest.raises(KeyError):
        second.result(WAIT)
    assert first.state == second.state == "failed"
    assert isinstance(second.exception(), KeyError)


def test_streaming_with_backpressure(make_scheduler: Any) -> None:
    scheduler = make_scheduler(stream_buffer=2)
    produced = []

    def work(ctx: WorkContext) -> Iterator[int]:
        for i in range(10):
            produced.append(i)
            yield i
        return 99

    ticket = scheduler.submit(work, stream=True)
    received = []
    for item in ticket.chunks(timeout=WAIT):
        time.sleep(0.01)
        # the producer is at most the buffer plus the item in hand ahead of the consumer
        assert len(produced) - (len(received) + 1) <= 3
        received.append(item)
    assert received == list(range(10))
    assert ticket.result(0) == 99 and ticket.state == "done"


def test_stream_result_method_is_used(make_scheduler: Any) -> None:
    class Stream:
        def __init__(self) -> None:
            self.items = iter([b"a", b"b"])

        def __iter__(self) -> Stream:
            return self

        def __next__(self) -> bytes:
            return next(self.items)

        def result(self) -> str:
            return "summary"

    ticket = make_scheduler().submit(lambda ctx: Stream(), stream=True)
    assert list(ticket.chunks(WAIT)) == [b"a", b"b"] and ticket.result(0) == "summary"


def test_stream_error_after_items(make_scheduler: Any) -> None:
    def work(ctx: WorkContext) -> Iterator[int]:
        yield 1
        raise InputError("segment 2 cannot be read")

    ticket = make_scheduler().submit(work, stream=True)
    got = []
    with pytest.raises(InputError, match="segment 2"):
        for item in ticket.chunks(WAIT):
            got.append(item)
    assert got == [1] and ticket.state == "failed"


def test_an_audio_stream_is_start_chunks_then_outcome(make_scheduler: Any) -> None:
    from cosyserve.service.backend import AudioStream
    from cosyserve.service.outcomes import StreamStart, TtsOutcome

    start = StreamStart(7, "audio/pcm", 24000)
    outcome = TtsOutcome(7, 0.1, 3, None, None, "audio/pcm")

    def work(ctx: WorkContext) -> Iterator[Any]:
        yield start
        yield b"ab"
        yield b"cd"
        return outcome

    stream = AudioStream(make_scheduler().submit(work, stream=True))
    assert stream.open(WAIT) == start == stream.start
    assert list(stream.chunks()) == [b"ab", b"cd"] and stream.outcome == outcome

    def refused(ctx: WorkContext) -> Iterator[Any]:
        raise InputError("the text is empty")
        yield start  # pragma: no cover

    with pytest.raises(InputError, match="empty"):
        AudioStream(make_scheduler().submit(refused, stream=True)).open(WAIT)


def test_consumer_abandonment_cancels(make_scheduler: Any) -> None:
    scheduler = make_scheduler(stream_buffer=1)
    closed = threading.Event()

    def work(ctx: WorkContext) -> Iterator[int]:
        try:
            yield from range(10_000)
        finally:
            closed.set()

    ticket = scheduler.submit(work, stream=True)
    chunks = ticket.chunks(WAIT)
    assert [next(chunks) for _ in range(3)] == [0, 1, 2]
    chunks.close()  # what a disconnected HTTP client's response generator does
    assert ticket.wait(WAIT) and ticket.state == "cancelled"
    assert closed.wait(WAIT)


def test_async_helpers(make_scheduler: Any) -> None:
    scheduler = make_scheduler(concurrency=2, stream_buffer=2)

    def stream(ctx: WorkContext) -> Iterator[int]:
        for i in range(6):
            time.sleep(0.005)
            yield i

    endless_closed = threading.Event()

    def endless(ctx: WorkContext) -> Iterator[int]:
        try:
            while True:
                yield 0
        finally:
            endless_closed.set()

    async def main() -> None:
        ticket = scheduler.submit(stream, stream=True)
        assert [item async for item in ticket.achunks(timeout=WAIT)] == list(range(6))
        assert await scheduler.submit(lambda ctx: 7).result_async(WAIT) == 7

        gate = threading.Event()
        slow = scheduler.submit(blocker(gate))
        assert await slow.wait_async(timeout=0.05) is False
        gate.set()
        assert await slow.wait_async(timeout=WAIT) is True

        abandoned = scheduler.submit(endless, stream=True)
        chunks = abandoned.achunks(timeout=WAIT)
        assert await chunks.__anext__() == 0
        await chunks.aclose()
        assert await abandoned.wait_async(WAIT) and abandoned.state == "cancelled"

    asyncio.run(main())
    assert endless_closed.wait(WAIT)


def test_on_state_callbacks_in_order(make_scheduler: Any) -> None:
    scheduler = make_scheduler(concurrency=1)
    seen: dict[str, list[str]] = {}

    def record(ticket: Ticket, state: str) -> None:
        seen.setdefault(ticket.id, []).append(state)

    gate = threading.Event()
    first = scheduler.submit(blocker(gate), job_id="first", on_state=record)
    wait_until(lambda: first.state == "running")
    second = scheduler.submit(lambda ctx: 1, job_id="second", on_state=record)
    second.cancel()
    with pytest.raises(JobStateError, match="already queued or running"):
        scheduler.submit(lambda ctx: 1, job_id="first")
    gate.set()
    first.result(WAIT)
    assert seen == {"first": ["running", "done"], "second": ["cancelled"]}


def test_graceful_shutdown_leaves_nothing_hanging() -> None:
    baseline = threading.active_count()
    scheduler = Scheduler(concurrency=2, queue_size=3, request_timeout_s=30)
    finishing = scheduler.submit(lambda ctx: time.sleep(0.05) or "finished")
    stuck = scheduler.submit(blocker(threading.Event()))
    wait_until(lambda: finishing.state == "running" and stuck.state == "running")
    queued = [scheduler.submit(blocker(threading.Event())) for _ in range(3)]  # the first takes the free slot

    report = scheduler.shutdown(grace_s=0.3)
    assert report == {"failed_queued": 2, "finished_in_grace": 1, "stopped_running": 2, "stuck_workers": 0}
    assert finishing.result(0) == "finished"
    for ticket in [stuck, *queued]:
        assert ticket.done and ticket.state == "failed"
        with pytest.raises(ShuttingDown, match="shut down before this job"):
            ticket.result(0)
    with pytest.raises(ShuttingDown, match="shutting down"):
        scheduler.submit(lambda ctx: None)
    assert not scheduler.accepting
    assert threading.active_count() == baseline
    assert scheduler.shutdown()["failed_queued"] == 0  # idempotent


def test_a_shutdown_runs_the_requests_already_queued_and_leaves_queued_jobs_for_the_next_start() -> None:
    """Short requests waiting behind a job's segment were refused at once, while the job used the grace."""
    scheduler = Scheduler(concurrency=1, queue_size=4, request_timeout_s=30)
    made: list[str] = []

    def job(ctx: WorkContext) -> int:
        for index in range(40):
            ctx.next_unit()
            made.append(f"unit{index}")
            time.sleep(0.01)
        return 40

    running = scheduler.submit(job, owner="key:A", work_class="background")
    wait_until(lambda: len(made) >= 2)
    waiting_job = scheduler.submit(job, owner="key:C", work_class="background")
    requests = [scheduler.submit(lambda ctx: "spoken", owner="key:B") for _ in range(2)]
    report = scheduler.shutdown(grace_s=WAIT)
    assert [ticket.result(0) for ticket in requests] == ["spoken", "spoken"]
    assert running.result(0) == 40  # it finished within the grace
    with pytest.raises(ShuttingDown, match="before this job started"):
        waiting_job.result(0)
    assert report == {"failed_queued": 1, "finished_in_grace": 3, "stopped_running": 0, "stuck_workers": 0}


def test_shutdown_async() -> None:
    scheduler = Scheduler(1, 1, None)
    ticket = scheduler.submit(lambda ctx: time.sleep(0.02) or "ok")
    wait_until(lambda: ticket.state != "queued")
    assert asyncio.run(scheduler.shutdown_async(grace_s=WAIT))["stuck_workers"] == 0
    assert ticket.result(0) == "ok"


def test_durations_ignore_a_wall_clock_step(make_scheduler: Any, monkeypatch: Any) -> None:
    from cosyserve.service.activity import ticket_times

    metrics = Metrics(system=False)
    scheduler = make_scheduler(concurrency=1, metrics=metrics)
    gate, wall = threading.Event(), time.time

    ticket = scheduler.submit(blocker(gate))
    wait_until(lambda: ticket.state == "running")
    monkeypatch.setattr(time, "time", lambda: wall() - 3600)  # NTP stepped the clock an hour back
    gate.set()
    assert ticket.result(WAIT) == "released"
    times = ticket_times(ticket)
    assert 0 <= times["wait_s"] < WAIT and 0 <= times["run_s"] < WAIT
    wait_until(lambda: metrics.registry.get_sample_value("cosyserve_job_duration_seconds_count") == 1)
    assert 0 <= metrics.registry.get_sample_value("cosyserve_job_duration_seconds_sum") < WAIT


def test_metrics_hooks(make_scheduler: Any) -> None:
    metrics = Metrics(system=False)
    scheduler = make_scheduler(concurrency=1, metrics=metrics)
    for ticket in [scheduler.submit(lambda ctx: None) for _ in range(3)]:
        ticket.result(WAIT)

    def bad(ctx: WorkContext) -> None:
        raise InputError("bad")

    with pytest.raises(InputError):
        scheduler.submit(bad).result(WAIT)
    wait_until(lambda: scheduler.stats()["running"] == 0)
    registry = metrics.registry
    assert registry.get_sample_value("cosyserve_jobs_total", {"state": "done"}) == 3
    assert registry.get_sample_value("cosyserve_queue_depth") == 0
    assert registry.get_sample_value("cosyserve_in_flight") == 0
    assert registry.get_sample_value("cosyserve_jobs_total", {"state": "failed"}) == 1
    assert registry.get_sample_value("cosyserve_errors_total", {"kind": "invalid_input"}) == 1
    assert registry.get_sample_value("cosyserve_job_duration_seconds_count") == 4
    stats = scheduler.stats()
    assert stats["finished"]["done"] == 3 and len(stats["recent_durations_s"]) == 4


def test_bounded_load() -> None:
    """50 submissions from 8 threads, concurrency 2, queue 4: accepted ones finish, the rest get QueueFull."""
    baseline = threading.active_count()
    scheduler = Scheduler(concurrency=2, queue_size=4, request_timeout_s=10)
    accepted: list[Ticket] = []
    rejected: list[QueueFull] = []
    lock = threading.Lock()
    random_source = random.Random(0)
    delays = [random_source.uniform(0.002, 0.02) for _ in range(50)]

    def client(indices: range) -> None:
        for i in indices:
            try:
                ticket = scheduler.submit(lambda ctx, d=delays[i]: time.sleep(d) or d)
            except QueueFull as full:
                with lock:
                    rejected.append(full)
            else:
                with lock:
                    accepted.append(ticket)
            time.sleep(0.001)

    threads = [threading.Thread(target=client, args=(range(i, 50, 8),)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    assert len(accepted) + len(rejected) == 50
    assert accepted and rejected
    assert all(full.retry_after_s >= 1 for full in rejected)
    for ticket in accepted:
        assert ticket.wait(WAIT), "an accepted ticket hangs"
        assert ticket.state == "done"
    assert scheduler.shutdown(grace_s=WAIT)["stuck_workers"] == 0
    assert threading.active_count() == baseline


def test_retry_after_is_the_time_the_waiting_work_takes_to_start(make_scheduler: Any) -> None:
    """Clients turned away wait until a place in the queue frees: the first waiting request starts when a
    running one ends (from measured unit times). It was when the last one starts: 160 s where a place
    freed in 2, past the 120 s OpenAI's SDKs wait, so they gave up at once."""
    scheduler = make_scheduler(concurrency=2, queue_size=4)
    for seconds in (4.0, 4.0):  # two finished syntheses: 4 s each
        scheduler._slots.times.observe("interactive", seconds)
    gate = threading.Event()
    running = [scheduler.submit(blocker(gate)) for _ in range(2)]
    wait_until(lambda: all(t.state == "running" for t in running))
    queued = [scheduler.submit(blocker(gate)) for _ in range(4)]
    with pytest.raises(QueueFull) as info:
        scheduler.submit(blocker(gate))
    assert info.value.retry_after_s == 4  # the first of the 4 waiting starts as a 4 s synthesis ends
    gate.set()
    for ticket in running + queued:
        ticket.result(WAIT)


def test_a_key_with_nothing_waiting_gets_a_place_in_a_full_queue(make_scheduler: Any) -> None:
    """One key filled the shared queue and another key's single request got 429 (a team's run)."""
    scheduler = make_scheduler(concurrency=1, queue_size=2)
    gate = threading.Event()
    first = scheduler.submit(blocker(gate), owner="key:alice")
    wait_until(lambda: first.state == "running")
    backlog = [scheduler.submit(blocker(gate), owner="key:alice") for _ in range(2)]
    with pytest.raises(QueueFull):
        scheduler.submit(blocker(gate), owner="key:alice")  # her backlog is full
    bobs = scheduler.submit(blocker(gate), owner="key:bob")  # his first: a place past the full queue
    with pytest.raises(QueueFull):
        scheduler.submit(blocker(gate), owner="key:bob")  # his second waits its turn like anyone's
    carols = scheduler.submit(blocker(gate), owner="key:carol")
    with pytest.raises(QueueFull):  # twice the queue's size at most, whoever asks
        scheduler.submit(blocker(gate), owner="key:dave")
    gate.set()
    for ticket in [first, *backlog, bobs, carols]:
        ticket.result(WAIT)


def test_a_failures_log_lines_carry_the_request_that_submitted_it(make_scheduler: Any) -> None:
    """A 500's answer names its request id; the traceback logged from the worker thread carried none."""
    import io
    import logging

    from cosyserve.service.logs import clear_recent_logs, configure_logging, recent_logs, request_context

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    configure_logging("INFO", stream=io.StringIO())
    clear_recent_logs()
    try:
        scheduler = make_scheduler()

        def work(ctx: WorkContext) -> None:
            logging.getLogger("cosyserve.engine").warning("inside the work")
            raise RuntimeError("a bug")

        with request_context("req-123"):
            ticket = scheduler.submit(work)
        with pytest.raises(RuntimeError):
            ticket.result(WAIT)
        wait_until(lambda: any("a bug" in e["message"] for e in recent_logs(50)))
        lines = [e for e in recent_logs(50) if "inside the work" in e["message"] or "a bug" in e["message"]]
        assert {e.get("request_id") for e in lines} == {"req-123"}, lines
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        clear_recent_logs()


def test_the_status_counts_a_stopped_job_as_the_metrics_do(make_scheduler: Any) -> None:
    """/admin/status counted a job stopped early (it keeps its finished part as its value) as done."""
    from types import SimpleNamespace

    scheduler = make_scheduler()
    ticket = scheduler.submit(lambda ctx: SimpleNamespace(stopped=Cancelled("cancelled by the client")))
    ticket.wait(WAIT)
    wait_until(lambda: sum(scheduler.stats()["finished"].values()) == 1)
    assert scheduler.stats()["finished"]["cancelled"] == 1 and scheduler.stats()["finished"]["done"] == 0


def test_a_request_whose_client_hung_up_ends_as_a_disconnect_not_a_conflict(make_scheduler: Any) -> None:
    """Counted as 409 `cancelled` (115 of them in a soak, inflating 4xx alerts); a hang-up is a 499."""
    from starlette.requests import ClientDisconnect

    from cosyserve.api.streaming import await_ticket

    class GoneRequest:
        async def is_disconnected(self) -> bool:
            return True

    scheduler = make_scheduler()
    ticket = scheduler.submit(blocker(threading.Event()))
    with pytest.raises(ClientDisconnect):
        asyncio.run(await_ticket(GoneRequest(), ticket))  # type: ignore[arg-type]
    assert ticket.state == "cancelled"
