"""Interactive tasks a worker has taken off the queue but not started yet, each holding its relay lease.

Interactive tasks are acknowledged when a worker takes them (`celery_app.py`), and a worker may take one
while it is busy (Celery's prefetch). Were the lease held only once the task runs, a worker that died
with a taken task in hand would leave its API node waiting for the whole request timeout: nothing holds
the task, nothing hands it out again. So a worker holds the lease from Celery's `task_received` (sent in
the consumer as soon as the message is read), renews it with its heartbeat while the task waits, and the
task's own watch takes over once it runs (`task_watch.py`).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from cosyserve.service.distributed.celery_app import ENROL_TASK, TTS_TASK
from cosyserve.service.distributed.relay import Relay

log = logging.getLogger(__name__)

INTERACTIVE_TASKS = frozenset({TTS_TASK, ENROL_TASK})


class ReceivedTasks:
    """Leases of the interactive tasks taken and not yet started on one worker. Thread-safe."""

    def __init__(self, relay: Relay, worker: str, lease_s: float) -> None:
        self.relay = relay
        self.worker = worker
        self.lease_s = lease_s
        self._waiting: set[str] = set()
        self._lock = threading.Lock()

    def on_received(self, sender: Any = None, request: Any = None, **_: Any) -> None:
        """Celery's `task_received`: an interactive task is now this worker's."""
        if request is None or getattr(request, "name", None) not in INTERACTIVE_TASKS:
            return
        task_id = str(request.id)
        with self._lock:
            self._waiting.add(task_id)
        try:
            self.relay.hold(task_id, self.worker, self.lease_s)
        except Exception as exc:  # Redis briefly away: the heartbeat holds it at its next beat
            log.warning("could not hold the lease of task %s: %s", task_id, exc)

    def started(self, task_id: str) -> None:
        """The task runs now: its watch renews the lease from here on."""
        with self._lock:
            self._waiting.discard(task_id)

    def renew(self) -> None:
        """Hold every waiting task's lease for another `lease_s` (the heartbeat calls this)."""
        with self._lock:
            waiting = list(self._waiting)
        for task_id in waiting:
            self.relay.hold(task_id, self.worker, self.lease_s)

    def __len__(self) -> int:
        with self._lock:
            return len(self._waiting)
