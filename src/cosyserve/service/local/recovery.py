"""After a restart: the jobs an earlier process of this server left queued or running run again.

At start, jobs left running go back to the queue (`JobStore.requeue_interrupted`: their attempt counts,
and those that used up the retry limit fail), then every queued job is put back on the scheduler in the
order it was submitted, as room in the bounded queue allows; a job cancelled meanwhile is skipped. A job
an engine restart interrupts while the process runs on comes back the same way (`requeue`).
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
        self._lock = threading.Lock()  # guards `_thread`: one feeding thread while anything is pending

    def start(self) -> None:
        queued, failed = self.runner.jobs.requeue_interrupted(self.max_attempts, self.runner.progressed)
        if failed:
            log.warning(
                "%d jobs failed: interrupted on every attempt they had (job_max_attempts = %d)",
                len(failed),
                self.max_attempts,
            )
        for record in failed:
            try:
                self.runner.ended_interrupted(record)
            except Exception as exc:  # its items or its charge stay as they were; the server starts
                log.error("job %s: could not end what it held: %s", record.id, exc)
        try:
            self.runner.sweep_pieces()
        except OSError as exc:  # they stay until the next start; nothing depends on them
            log.warning("could not remove the kept pieces of ended jobs: %s", exc)
        if not queued:
            return
        log.warning("%d jobs left by an earlier process are queued again", len(queued))
        self._feed([record.id for record in queued])

    def requeue(self, job_id: str) -> None:
        """Put a job that was interrupted (and released to the queue) back on the scheduler."""
        log.info("job %s was interrupted: it is queued again", job_id)
        self._feed([job_id])

    def _feed(self, job_ids: list[str]) -> None:
        with self._lock:
            self.pending.extend(job_ids)
            if self._thread is None:
                self._start_locked()

    def _start_locked(self) -> None:
        if not self._stop.is_set():
            self._thread = threading.Thread(target=self._loop, name="cosyserve-job-feeder", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _loop(self) -> None:
        try:
            self._feed_pending()
        finally:
            with self._lock:
                self._thread = None
                if self.pending:  # came in as the loop ended
                    self._start_locked()

    def _feed_pending(self) -> None:
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
                self._stop.set()  # nothing more is taken: what is pending stays queued for the next start
                return
            except CosyServeError as exc:  # its parameters no longer make a job (a voice was deleted, ...)
                with contextlib.suppress(JobStateError):
                    jobs.finish_with_exception(record.id, exc)
                ended = jobs.get(record.id)
                if ended is not None and ended.is_terminal:  # what it held goes: items, charge, reservation
                    self.runner.ended_interrupted(ended)
                log.warning("queued job %s could not run again: %s", record.id, exc)
            self.pending.popleft()
