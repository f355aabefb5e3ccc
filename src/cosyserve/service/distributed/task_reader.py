"""An API node's side of one interactive task (`/v1/tts`, OpenAI speech, an enrolment) on a worker: its
relay items read until `done`, the worker's error raised, a client's cancel passed on, and a task that no
worker will finish reported as `WorkerLost` (503, retry) instead of waiting out the request timeout.

How a lost task shows:
- a worker holds the task's lease from the moment it takes the message off the queue (Celery's
  `task_received`, `received_tasks.py`) until it answered; a lease that lapses before `done` or `error` is a
  worker that died with it;
- a worker that died between taking the message and holding the lease (a process frozen with a read
  already answered by Redis, then killed) leaves no lease at all. Interactive tasks are acknowledged when
  taken, so nothing hands the message out again. So when a worker that was alive while the request waited
  has gone, the task is not held and its message is no longer in the queue's list, on two looks a check
  apart, it is lost.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from cosyserve.service import wire
from cosyserve.service.distributed.celery_app import QUEUE
from cosyserve.service.distributed.relay import Relay, RelayItem
from cosyserve.service.scheduling.scheduler import WorkContext

log = logging.getLogger(__name__)

LEASE_CHECK_S = 1.0  # how often a waiting request checks that its worker still holds the task
QUEUE_PAGE = 200  # messages read at a time when looking for a task in the queue's list


class TaskReader:
    """Reads interactive tasks' relay streams for an API node. Thread-safe (one call per task)."""

    def __init__(self, relay: Relay, workers: Callable[[], list[dict[str, Any]]], where: str) -> None:
        self.relay = relay
        self.workers = workers  # the live workers' heartbeats (cached briefly by the caller)
        self.where = where  # the broker, for messages

    def items(self, task_id: str, ctx: WorkContext) -> Iterator[RelayItem]:
        """The task's relay items up to and including `done`; raises the worker's error, Cancelled when
        the client cancels (the worker is told), WorkerLost when no worker will finish it, QueueUnavailable
        when Redis goes away."""
        from redis.exceptions import RedisError

        try:
            yield from self._items(task_id, ctx)
        except RedisError as exc:
            raise wire.QueueUnavailable(
                f"lost the connection to the queue at {self.where} while waiting for the result "
                f"({type(exc).__name__}): retry in a few seconds"
            ) from exc

    def _items(self, task_id: str, ctx: WorkContext) -> Iterator[RelayItem]:
        after, held, last_check = "0-0", False, 0.0
        seen: set[str] = set()  # workers alive at some point while this task waited
        missing = 0  # looks in a row that found the task neither held nor queued after a worker went
        while True:
            if ctx.cancel.is_set():
                self.cancel_quietly(task_id)
                ctx.check_cancelled()
            items = self.relay.read(task_id, after, block_ms=250)
            for item in items:
                after = item.id
                if item.kind == "progress":
                    ctx.set_progress(float(wire.from_json(item.data)))
                    continue
                if item.kind == "error":
                    raise wire.decode_error(wire.from_json(item.data))
                yield item
                if item.kind == "done":
                    return
            if items or time.monotonic() - last_check < LEASE_CHECK_S:
                continue
            last_check = time.monotonic()
            if self.relay.holder(task_id) is not None:
                held, missing = True, 0
            elif held:
                if not self.relay.read(task_id, after, block_ms=0):
                    self.cancel_quietly(task_id)
                    raise wire.WorkerLost(
                        "the worker running this request stopped before it finished: retry the request"
                    )
            else:
                missing = missing + 1 if self._taken_by_a_lost_worker(task_id, seen) else 0
                if missing >= 2:
                    self.cancel_quietly(task_id)  # should that worker come back, it skips the task
                    raise wire.WorkerLost(
                        "the worker that took this request stopped before it began: retry the request"
                    )

    def _taken_by_a_lost_worker(self, task_id: str, seen: set[str]) -> bool:
        """Whether a worker went away while the task waited, and the task is off the queue, unheld."""
        alive = {str(worker.get("name")) for worker in self.workers()}
        seen |= alive
        if not seen - alive:
            return False
        return not self.queued(task_id) and self.relay.holder(task_id) is None

    def queued(self, task_id: str) -> bool:
        """Whether the task's message still waits in the interactive queue's Redis list (kombu keeps a
        queue's messages as JSON in a list named after it; the task id is in their headers)."""
        needle, client = task_id.encode(), self.relay.client
        start = 0
        while page := client.lrange(QUEUE, start, start + QUEUE_PAGE - 1):
            if any(needle in message for message in page):
                return True
            start += QUEUE_PAGE
        return False

    def drop_quietly(self, task_id: str) -> None:
        try:
            self.relay.drop(task_id)
        except Exception as exc:  # the stream expires by itself
            log.debug("could not drop the relay stream of task %s: %s", task_id, exc)

    def cancel_quietly(self, task_id: str) -> None:
        try:
            self.relay.request_cancel(task_id)
        except Exception as exc:
            log.warning("could not pass a cancel for task %s to the workers: %s", task_id, exc)
