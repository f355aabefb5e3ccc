"""After a restart: the jobs an earlier process of this server left queued or running run again.

At start, jobs left running go back to the queue (`JobStore.requeue_interrupted`: their attempt counts,
and those that used up the retry limit fail), then every queued job is put back on the scheduler in the
order it was submitted, as room in the bounded queue allows; a job cancelled meanwhile is skipped.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import deque

from cosyserve.errors import CosyServeError, JobStateError, QueueFull, ShuttingDown
from cosyserve.service.local.job_runner import LocalJobs

log = logging.getLogger(__name__)

RETRY_S = 1.0  # how long the feeder waits for room in the queue


class JobFeeder:
    """Requeues what an earlier process left and feeds it to the scheduler in a background thread."""

    def __init__(self, runner: LocalJobs, max_attempts: int) -> None:
        self.runner = runner
        self.max_attempts = max_attempts
        self.pending: deque[str] = deque()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        queued, failed = self.runner.jobs.requeue_interrupted(self.max_attempts)
        if failed:
            log.warning("%d jobs were interrupted %d times and failed", failed, self.max_attempts)
        if not queued:
            return
        log.warning("%d jobs left by an earlier process are queued again", len(queued))
        self.pending.extend(record.id for record in queued)
        self._thread = threading.Thread(target=self._loop, name="cosyserve-job-feeder", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _loop(self) -> None:
        jobs = self.runner.jobs
        while self.pending and not self._stop.is_set():
            record = jobs.get(self.pending[0])
            if record is None or record.state != "queued":
                self.pending.popleft()  # cancelled (or purged) while it waited
                continue
            try:
                self.runner.resubmit(record)
            except QueueFull:
                self._stop.wait(RETRY_S)
                continue
            except ShuttingDown:
                return  # it stays queued for the next start
            except CosyServeError as exc:  # its parameters no longer make a job (a voice was deleted, ...)
                with contextlib.suppress(JobStateError):
                    jobs.finish_with_exception(record.id, exc)
                log.warning("queued job %s could not run again: %s", record.id, exc)
            self.pending.popleft()
