"""How a cluster worker takes a background task (long-text job, batch, dub) from the queue.

A task runs here only within this worker's `background_running` slots, and only when its key's turn has
come: while another key waits that runs fewer background tasks in the whole cluster, the task goes back to
the queue for a second (`scheduling/key_share.py`; the counts in Redis, `distributed/background_share.py`).
Then the job is claimed (one attempt at a time in the cluster), run while its lease is renewed, and, when a
shutdown or an engine restart interrupts it, sent to the queue again.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any, NoReturn, Protocol

from cosyserve.errors import Cancelled, CosyServeError, Interrupted, JobStateError
from cosyserve.service.distributed.background_share import BackgroundShares
from cosyserve.service.distributed.relay import WorkerRegistry
from cosyserve.service.distributed.task_watch import TaskWatch, WatchingNode
from cosyserve.service.local.backend import LocalBackend
from cosyserve.service.logs import log_failure
from cosyserve.service.scheduling.key_share import share_key, yields_to

log = logging.getLogger(__name__)

KNOWN_OWNERS = 4096  # job id -> key remembered for tasks going round the queue (oldest forgotten first)


class IntakeNode(WatchingNode, Protocol):
    """What the intake needs of its worker (`WorkerNode`) beyond what a task's watch does."""

    client: Any  # redis-py, for the keys' shares
    registry: WorkerRegistry  # the workers' heartbeats: which jobs live workers run
    local: LocalBackend
    stopping: threading.Event

    def counted(self) -> Any: ...


class JobIntake:
    """A worker's background tasks: its slots, keys' turns, claims and attempts. Thread-safe."""

    def __init__(self, node: IntakeNode, slots: int) -> None:
        self.node = node
        self.slots = threading.BoundedSemaphore(slots)
        self.shares = BackgroundShares(node.client)  # keys sharing the cluster's background slots
        self._owners: dict[str, str] = {}  # job id -> its key, for tasks sent back to the queue
        self._owners_lock = threading.Lock()

    def claimed(self, task: Any, job_id: str, run: Any) -> None:
        """Claim the job, run it as this attempt while renewing its lease; end its record on failure."""
        # Not claimed by a worker on its way out, nor beyond its background slots (its pool is for
        # interactive tasks too): back to the queue, for another worker or a moment later.
        if self.node.stopping.is_set() or not self.slots.acquire(blocking=False):
            self._send_back(task, job_id, self._known_key(job_id))
        try:
            self._take_turn(task, job_id)
            self._claimed_here(task, job_id, run)
        finally:
            self.slots.release()

    def _take_turn(self, task: Any, job_id: str) -> None:
        """Send a queued job's task back while another key waits that runs fewer background tasks in the
        cluster than this job's key (`scheduling/key_share.py`); a key alone is never sent back."""
        record = self.node.jobs.get(job_id)
        if record is None or record.state != "queued":  # ended, or running elsewhere: `_claimed_here`'s
            return
        key = self._remember(job_id, record.owner)
        try:
            cluster = self.shares.snapshot()
        except Exception as exc:  # Redis briefly away: first come, first served
            log.warning("job %s: no view of the cluster's background work (%s)", job_id, exc)
            return
        other = yields_to(key, cluster.running, cluster.waiting)
        if other is not None:
            log.debug("job %s of %s steps aside for %s (fewer running, waiting)", job_id, key, other)
            self._quietly(self.shares.queued, job_id, key)
            self._send_back(task, job_id, None)

    def _send_back(self, task: Any, job_id: str, key: str | None) -> NoReturn:
        """Back to the queue for a second; the job still counts as waiting for its key (if it did)."""
        if key is not None:
            self._quietly(self.shares.still_queued, job_id, key)
        raise task.retry(countdown=1.0, max_retries=None)

    def _claimed_here(self, task: Any, job_id: str, run: Any) -> None:
        jobs = self.node.jobs
        live_elsewhere = self._run_by_a_live_worker(job_id)
        record = None if live_elsewhere else jobs.claim(job_id, self.node.name, self.node.lease_s)
        if record is None:
            current = jobs.get(job_id)
            if current is None or current.is_terminal:
                log.info("job %s: nothing to do (%s)", job_id, current.state if current else "gone")
                self.node.local.job_runner.ended_unrun(job_id)  # e.g. cancelled while it waited
                if current is not None:
                    self._quietly(self.shares.dropped, job_id, share_key(current.owner))
                self._forget(job_id)
                return
            # Another worker holds it and is alive: look again once its lease could have run out.
            raise task.retry(countdown=max(1.0, self.node.lease_s), max_retries=None)
        key = share_key(record.owner)
        self._quietly(self.shares.started, job_id, key, self.node.lease_s)
        try:
            interrupted = self._run_attempt(job_id, record.attempt, run)
        finally:
            self._quietly(self.shares.finished, job_id, key)
            self._forget(job_id)
        if interrupted is not None:  # its record went back to the queue
            log.warning("job %s: interrupted (%s); its task is sent again", job_id, interrupted)
            self._quietly(self.shares.queued, job_id, key)
            raise task.retry(countdown=0, max_retries=None)

    def _run_attempt(self, job_id: str, attempt: int, run: Any) -> Interrupted | None:
        """Run the claimed job to its end; the interruption that stopped it, if one did."""
        jobs = self.node.jobs
        if attempt > 1:
            log.warning("job %s: attempt %d (an earlier worker stopped while running it)", job_id, attempt)
        try:
            reason = self.node.relay.cancel_reason(job_id)
            if reason is not None:
                raise Cancelled(reason)
            with self.node.counted(), TaskWatch(self.node, job_id, job_attempt=attempt) as watch:
                ticket = watch.attach(run(attempt))
                ticket.wait()
                return ticket.error if isinstance(ticket.error, Interrupted) else None
        except BaseException as exc:  # it never reached the scheduler: end the record here
            with contextlib.suppress(JobStateError):
                jobs.finish_with_exception(job_id, exc, attempt=attempt)
            current = jobs.get(job_id)
            if current is None or current.is_terminal:  # what it still holds of its key's quota
                self.node.local.reservations.release_job(job_id)
            if not isinstance(exc, CosyServeError):
                log_failure("worker", f"job {job_id} failed: {exc}", exc=exc)
        return None

    # -- helpers -----------------------------------------------------------------------------------------

    def _run_by_a_live_worker(self, job_id: str) -> bool:
        """Whether a live worker says it runs the job (a redelivered task must not take it over because
        this host's clock is ahead of that worker's, whatever its lease says)."""
        try:
            return job_id in self.node.registry.running_jobs()
        except Exception as exc:  # Redis briefly away: the lease decides alone
            log.warning("job %s: no view of the workers' heartbeats (%s)", job_id, exc)
            return False

    def _known_key(self, job_id: str) -> str | None:
        """The key of a job whose task goes round the queue (its record read once per worker); None when
        there is no such job or the database cannot say now."""
        with self._owners_lock:
            key = self._owners.get(job_id)
        if key is not None:
            return key
        try:
            record = self.node.jobs.get(job_id)
        except Exception as exc:  # the task goes back to the queue all the same
            log.warning("job %s: could not read its owner (%s)", job_id, exc)
            return None
        return self._remember(job_id, record.owner) if record is not None else None

    def _remember(self, job_id: str, owner: str | None) -> str:
        key = share_key(owner)
        with self._owners_lock:
            if len(self._owners) >= KNOWN_OWNERS:
                del self._owners[next(iter(self._owners))]
            self._owners[job_id] = key
        return key

    def _forget(self, job_id: str) -> None:
        with self._owners_lock:
            self._owners.pop(job_id, None)

    def _quietly(self, bookkeeping: Any, *args: Any) -> None:
        """Keys' shares are best effort: a Redis hiccup costs fairness for a moment, never the job."""
        try:
            bookkeeping(*args)
        except Exception as exc:
            log.warning("background share bookkeeping failed (%s): %s", bookkeeping.__name__, exc)
