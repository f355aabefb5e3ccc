"""While a task runs on a worker: its lease renewed, a cancel passed on to its ticket, its progress published.

A job's watch also lists it among the worker's running jobs (`job_watches`), which a shutdown interrupts.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

from cosyserve.service.distributed.relay import Relay
from cosyserve.service.scheduling.tickets import Ticket
from cosyserve.service.stores.jobs import JobStore

log = logging.getLogger(__name__)

WATCH_INTERVAL_S = 0.25  # how often a running task looks for a cancel and reports progress


class WatchingNode(Protocol):
    """What a watch needs of its worker (`WorkerNode`)."""

    name: str
    lease_s: float
    relay: Relay
    jobs: JobStore
    count_lock: threading.Lock
    job_watches: set[TaskWatch]


class TaskWatch:
    """While a task runs: renew its lease, pass cancels on to its ticket, publish its progress."""

    def __init__(
        self, node: WatchingNode, task_id: str, *, progress: bool = False, job_attempt: int | None = None
    ) -> None:
        self.node = node
        self.task_id = task_id
        self.progress = progress
        self.job_attempt = job_attempt
        self.ticket: Ticket | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"cosyserve-watch-{task_id[:8]}", daemon=True)

    def attach(self, ticket: Ticket) -> Ticket:
        self.ticket = ticket
        return ticket

    def __enter__(self) -> TaskWatch:
        if self.job_attempt is not None:
            with self.node.count_lock:
                self.node.job_watches.add(self)
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        with self.node.count_lock:
            self.node.job_watches.discard(self)
        self._stop.set()
        self._thread.join(timeout=5.0)

    def _loop(self) -> None:
        renew_every = max(0.5, self.node.lease_s / 3)
        renewed = time.monotonic()
        reported = -1.0
        while not self._stop.wait(WATCH_INTERVAL_S):
            try:
                if time.monotonic() - renewed >= renew_every:
                    renewed = time.monotonic()
                    if not self._renew():
                        self._cancel("the job was cancelled or handed to another worker")
                reason = self.node.relay.cancel_reason(self.task_id)
                if reason is not None:
                    self._cancel(reason)
                ticket = self.ticket
                if self.progress and ticket is not None and ticket.progress != reported:
                    reported = ticket.progress
                    self.node.relay.publish(self.task_id, "progress", reported)
            except Exception as exc:  # Redis or the database briefly away: try again next round
                log.warning("task %s: lease/cancel check failed: %s", self.task_id, exc)

    def _renew(self) -> bool:
        if self.job_attempt is None:
            self.node.relay.hold(self.task_id, self.node.name, self.node.lease_s)
            return True
        return self.node.jobs.renew(self.task_id, self.job_attempt, self.node.lease_s)

    def _cancel(self, reason: str) -> None:
        if self.ticket is not None and not self.ticket.done:
            log.info("task %s: %s", self.task_id, reason)
            self.ticket.cancel(reason)
