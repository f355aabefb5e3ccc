"""An interactive task whose worker died before running it ends `worker_lost` (503, retry), not a request
timeout (found by a team's run: a worker frozen with a queue read already answered, then killed, left a
`/v1/tts` waiting 300 s for a 504 that said to shorten the text). Against a real redis-server: the API
node's reader (`task_reader.py`) and the worker's leases for tasks it took and has not started
(`received_tasks.py`)."""

from __future__ import annotations

import json
import time
import uuid
from types import SimpleNamespace

from celery import signals as celery_signals

from cosyserve.service import wire
from cosyserve.service.distributed.celery_app import JOB_TASK, QUEUE, TTS_TASK
from cosyserve.service.distributed.received_tasks import ReceivedTasks
from cosyserve.service.distributed.relay import Relay, WorkerRegistry
from cosyserve.service.outcomes import TtsOutcome
from cosyserve.service.requests import OutputSpec, SynthesisRequest
from test_distributed_units import _Context, _run_in_thread, _wait_for_task, dispatcher  # noqa: F401

OUTCOME = TtsOutcome(3, 1.0, 25, "o", None, "audio/wav", (), b"RIFF")


def _start(dispatcher):  # noqa: F811
    thread, box = _run_in_thread(
        dispatcher.tts_work(SynthesisRequest(text="hi", voice="v"), OutputSpec(), False), _Context()
    )
    return thread, box, _wait_for_task(dispatcher)


def test_a_task_taken_by_a_worker_that_then_vanished_is_worker_lost(dispatcher) -> None:  # noqa: F811
    WorkerRegistry(dispatcher.client).beat(f"gone-{uuid.uuid4().hex[:6]}", {"model": "m"}, ttl_s=1.5)
    dispatcher.workers(fresh=True)
    started = time.monotonic()
    thread, box, task = _start(dispatcher)  # the test's send puts nothing in the queue: "taken"
    thread.join(20)
    assert not thread.is_alive()
    assert isinstance(box.get("error"), wire.WorkerLost), box
    assert "retry" in str(box["error"]) and time.monotonic() - started < 15
    assert dispatcher.relay.cancel_reason(task) is not None  # should that worker come back, it skips it


def test_a_task_still_in_the_queue_waits_for_a_worker_after_another_vanished(dispatcher) -> None:  # noqa: F811
    registry = WorkerRegistry(dispatcher.client)
    registry.beat(f"gone-{uuid.uuid4().hex[:6]}", {"model": "m"}, ttl_s=1.0)
    dispatcher.workers(fresh=True)
    thread, box, task = _start(dispatcher)
    message = json.dumps({"headers": {"id": task, "task": TTS_TASK}, "body": "…"}).encode()
    dispatcher.client.lpush(QUEUE, message)  # as kombu keeps a waiting message
    try:
        time.sleep(6)  # the worker's heartbeat lapsed and the reader looked several times
        assert thread.is_alive() and not box, box  # still waiting: a live worker may take it
        assert dispatcher.reader.queued(task)
        dispatcher.client.lrem(QUEUE, 0, message)  # a live worker takes it and answers
        dispatcher.relay.hold(task, "alive", 5)
        dispatcher.relay.publish(task, "done", wire.encode_outcome(OUTCOME))
        thread.join(10)
        assert box.get("value") == OUTCOME, box
    finally:
        dispatcher.client.lrem(QUEUE, 0, message)


def test_a_task_a_live_worker_took_and_has_not_started_is_held(dispatcher) -> None:  # noqa: F811
    """A busy worker may take an interactive task before it can run it: its lease is held from then on."""
    relay = Relay(dispatcher.client)
    received = ReceivedTasks(relay, "w-busy", lease_s=1.0)
    celery_signals.task_received.connect(received.on_received, weak=False)
    try:
        task, job = uuid.uuid4().hex, uuid.uuid4().hex
        celery_signals.task_received.send(sender=None, request=SimpleNamespace(id=task, name=TTS_TASK))
        celery_signals.task_received.send(sender=None, request=SimpleNamespace(id=job, name=JOB_TASK))
    finally:
        celery_signals.task_received.disconnect(received.on_received)
    assert relay.holder(task) == "w-busy" and relay.holder(job) is None and len(received) == 1
    for _ in range(3):  # the heartbeat renews it while it waits
        time.sleep(0.5)
        received.renew()
    assert relay.holder(task) == "w-busy"
    received.started(task)  # its watch renews it from here on; the heartbeat no longer does
    assert len(received) == 0
    time.sleep(1.2)
    assert relay.holder(task) is None
