"""Keys sharing a cluster's background slots: the rule (no Redis), its bookkeeping in a real redis-server
(a dead worker's entries expire; entries go when a job ends however it ends), and a worker's intake sending
a busy key's task back while another key waits, never a lone key's."""

from __future__ import annotations

import time
import uuid

import pytest
from celery.exceptions import Retry
from tests.test_job_interruptions import FakeTask, worker  # noqa: F401 (the fixture)

from cosyserve.errors import Cancelled
from cosyserve.service.scheduling.key_share import ANONYMOUS_KEY, share_key, yields_to

# -- the rule ---------------------------------------------------------------------------------------------


def test_a_lone_key_never_steps_aside() -> None:
    assert yields_to("a", {"a": 50}, []) is None
    assert yields_to("a", {"a": 50}, ["a"]) is None  # its own queued tasks are no reason


def test_a_busy_key_steps_aside_for_a_waiting_key_that_runs_fewer() -> None:
    assert yields_to("a", {"a": 2}, ["b"]) == "b"  # b runs nothing
    assert yields_to("a", {"a": 2, "b": 1}, ["b"]) == "b"
    assert yields_to("a", {"a": 1}, ["c", "b"]) == "b"  # the earliest name on a tie, for stable logs
    assert yields_to("a", {"a": 3, "b": 1, "c": 2}, ["c", "b"]) == "b"  # the one running fewest


def test_ties_and_keys_running_more_are_no_reason_to_step_aside() -> None:
    # No deadlock: of two waiting keys running as many, neither sends the other's task back forever.
    assert yields_to("a", {"a": 2, "b": 2}, ["b"]) is None
    assert yields_to("b", {"a": 2, "b": 2}, ["a"]) is None
    assert yields_to("a", {"a": 1, "b": 3}, ["b"]) is None
    assert yields_to("a", {}, ["b"]) is None  # a key running nothing always starts


def test_of_the_waiting_keys_the_one_running_fewest_always_starts() -> None:
    running = {"a": 4, "b": 1, "c": 1, "d": 0}
    waiting = ["a", "b", "c", "d"]
    starts = [key for key in waiting if yields_to(key, running, waiting) is None]
    assert starts == ["d"]
    running["d"] = 1  # d got its slot: now b, c and d are level and all may start, a still not
    assert [key for key in waiting if yields_to(key, running, waiting) is None] == ["b", "c", "d"]


def test_jobs_without_an_owner_count_as_one_key() -> None:
    assert share_key(None) == share_key("") == ANONYMOUS_KEY
    assert share_key("key:7") == "key:7"


# -- the bookkeeping in Redis ------------------------------------------------------------------------------


@pytest.fixture()
def shares_pair(redis_url: str):
    """Two processes' views of the same cluster (say two workers), on keys of their own."""
    from cosyserve.service.distributed.background_share import BackgroundShares
    from cosyserve.service.distributed.relay import connect

    client = connect(redis_url)
    prefix = f"test-{uuid.uuid4().hex[:8]}"
    yield (
        BackgroundShares(client, prefix=prefix, waiting_ttl_s=0.5),
        BackgroundShares(client, prefix=prefix, waiting_ttl_s=0.5),
    )
    client.close()


def test_running_and_waiting_per_key(shares_pair) -> None:
    one, two = shares_pair
    one.queued("j1", "key:1")
    one.queued("j2", "key:1")
    two.queued("j3", "key:2")
    view = two.snapshot()
    assert view.running == {} and view.waiting == {"key:1", "key:2"}
    one.started("j1", "key:1", lease_s=30)  # claimed: running, no longer waiting
    two.started("j3", "key:2", lease_s=30)
    view = one.snapshot()
    assert view.running == {"key:1": 1, "key:2": 1} and view.waiting == {"key:1"}
    one.finished("j1", "key:1")  # done, failed, cancelled or interrupted alike
    one.dropped("j2", "key:1")  # cancelled while it waited
    assert one.snapshot().running == {"key:2": 1} and one.snapshot().waiting == frozenset()


def test_a_dead_workers_running_entries_expire_and_a_live_one_renews_its_own(shares_pair) -> None:
    alive, dead = shares_pair
    alive.started("a1", "key:1", lease_s=0.4)
    dead.started("d1", "key:2", lease_s=0.4)
    for _ in range(3):  # the live worker's heartbeat renews; the dead one's stopped
        time.sleep(0.2)
        assert alive.renew(lease_s=0.4) == 1
    assert alive.snapshot().running == {"key:1": 1}
    alive.finished("a1", "key:1")
    assert alive.renew(lease_s=0.4) == 0
    assert alive.snapshot().running == {}  # a finished job is not put back by a later renewal


def test_a_waiting_entry_lasts_while_its_task_goes_round_and_only_if_it_still_waits(shares_pair) -> None:
    api, worker_view = shares_pair
    api.queued("q1", "key:1")
    for _ in range(3):  # the task comes back to a full worker every so often: still waiting
        time.sleep(0.3)
        worker_view.still_queued("q1", "key:1")
    assert worker_view.snapshot().waiting == {"key:1"}
    time.sleep(0.6)  # nobody saw it again (its message lost): it stops counting
    assert worker_view.snapshot().waiting == frozenset()
    worker_view.still_queued("q1", "key:1")  # a claimed or cancelled job's task going round once more
    assert worker_view.snapshot().waiting == frozenset()


# -- a worker's intake -------------------------------------------------------------------------------------


def test_a_busy_keys_third_task_goes_back_while_another_key_waits_never_a_lone_keys(worker) -> None:  # noqa: F811
    from cosyserve.service.distributed.background_share import BackgroundShares

    prefix = f"test-{uuid.uuid4().hex[:8]}"
    worker.intake.shares = mine = BackgroundShares(worker.client, prefix=prefix)
    elsewhere = BackgroundShares(worker.client, prefix=prefix)  # other workers of the cluster
    elsewhere.started("a-first", "key:a", lease_s=60)
    elsewhere.started("a-second", "key:a", lease_s=60)
    jobs = worker.service.jobs
    third = jobs.create({"items": 1}, kind="batch", owner="key:a").id
    lone = jobs.create({"items": 1}, kind="batch", owner="key:a").id
    b_job = jobs.create({"items": 1}, kind="batch", owner="key:b").id
    elsewhere.queued(b_job, "key:b")  # the API node sent b's batch: it waits in the queue
    elsewhere.queued(third, "key:a")
    ran: list[tuple[str, int]] = []

    def run(job_id: str):
        def attempt(number: int):
            ran.append((job_id, number))
            assert mine.snapshot().running.get(share_key(jobs.get(job_id).owner), 0) >= 1
            raise Cancelled("ended by the test")

        return attempt

    task = FakeTask()
    with pytest.raises(Retry):
        worker._claimed(task, third, run(third))
    assert task.retries == [{"countdown": 1.0, "max_retries": None}] and ran == []
    assert jobs.get(third).state == "queued" and jobs.get(third).attempt == 0  # not claimed
    assert mine.snapshot().waiting == {"key:a", "key:b"}  # a's task still counts as waiting
    assert worker.intake.slots.acquire(blocking=False)  # its slot was given back
    worker.intake.slots.release()

    worker._claimed(FakeTask(), b_job, run(b_job))  # b's turn: b runs nothing, a runs two
    assert ran == [(b_job, 1)] and jobs.get(b_job).is_terminal
    view = mine.snapshot()
    assert view.running == {"key:a": 2} and view.waiting == {"key:a"}  # b's entry gone once it ended

    for job_id in (third, lone):  # key a alone now (its own waiting tasks aside): never sent back
        back = FakeTask()
        worker._claimed(back, job_id, run(job_id))
        assert back.retries == []
    assert ran[1:] == [(third, 1), (lone, 1)]
    assert mine.snapshot() == type(view)(running={"key:a": 2}, waiting=frozenset())


def test_the_api_node_counts_a_sent_job_as_waiting_and_forgets_one_it_could_not_send(
    redis_url: str, tmp_path
) -> None:
    from cosyserve.service import wire
    from cosyserve.service.distributed.background_share import BackgroundShares
    from cosyserve.service.distributed.remote import RemoteBackend
    from cosyserve.service.settings import Settings

    settings = Settings(queue={"queue_url": redis_url}, storage={"data_dir": tmp_path})
    remote = RemoteBackend(settings, None, jobs=None, voices=None, batches=None)  # type: ignore[arg-type]
    remote.shares = BackgroundShares(remote.client, prefix=f"test-{uuid.uuid4().hex[:8]}")
    refuse = False

    def send(task: str, args: list, task_id: str | None = None) -> str:
        if refuse:
            raise wire.QueueUnavailable("the queue refused the task")
        return task_id or ""

    remote._send = send  # type: ignore[method-assign]
    try:
        remote._send_background("cosyserve.batch", ["j1"], "j1", None)
        assert remote.shares.snapshot().waiting == {ANONYMOUS_KEY}
        refuse = True
        with pytest.raises(wire.QueueUnavailable):
            remote._send_background("cosyserve.batch", ["j2"], "j2", "key:2")
        assert remote.shares.snapshot().waiting == {ANONYMOUS_KEY}
    finally:
        remote.stop()
