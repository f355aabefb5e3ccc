"""A bounded queue in front of a pool of worker threads and a few engine slots: how synthesis work gets run.

Work is interactive (a request a client waits for) or background (jobs, batches, dubs). The engine's
`concurrency` slots are granted one unit of work at a time by a fair policy (`slots`, `fair_policy`);
background work gives its slot back between units (`WorkContext.next_unit`), so an interactive request
waits about one unit at most. Positions, waits and Retry-After come from measured unit times
(`wait_estimates`); what it reports to the metrics and stats is kept in `reporting`.

The engine is PyTorch, which releases the GIL in its kernels, so work runs on threads (never on the event
loop). Work is a callable taking a `WorkContext`; with `stream=True` it returns an iterable whose items the
worker hands to the consumer through a small per-ticket buffer (the producer blocks when the consumer falls
behind). Every ticket ends done, failed or cancelled, whatever happens (cancel, timeout, shutdown, …).

Lock order: scheduler lock, then ticket lock. Ticket callbacks (`on_state`) run with no lock held.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, Literal

from cosyserve.errors import Interrupted, JobStateError, JobTimeout, QueueFull, ShuttingDown
from cosyserve.service.scheduling.deadlines import REQUEST_TIMEOUT, Deadlines
from cosyserve.service.scheduling.fair_policy import BACKGROUND, INTERACTIVE, FairSettings, WorkClass
from cosyserve.service.scheduling.reporting import SchedulerMetrics, SchedulerReport
from cosyserve.service.scheduling.slots import EngineSlots
from cosyserve.service.scheduling.tickets import Ticket, TicketHooks, WorkContext, ended_as

__all__ = ["Scheduler", "SchedulerMetrics", "Ticket", "WorkContext"]

logger = logging.getLogger(__name__)


class Scheduler:
    """Runs submitted work on `concurrency` engine slots, granted unit by unit; at most `queue_size`
    tickets wait for their first slot (more are refused with QueueFull and a Retry-After)."""

    def __init__(
        self,
        concurrency: int,
        queue_size: int,
        request_timeout_s: float | None = 300.0,
        metrics: SchedulerMetrics | None = None,
        *,
        stream_buffer: int = 8,
        name: str = "cosyserve-worker",
        fair: FairSettings | None = None,
        background_running: int = 4,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        if queue_size < 0:
            raise ValueError(f"queue_size must be 0 or more, got {queue_size}")
        if stream_buffer < 1:
            raise ValueError(f"stream_buffer must be at least 1, got {stream_buffer}")
        self.concurrency = concurrency
        self.queue_size = queue_size
        self.request_timeout_s = request_timeout_s or None
        self._report = SchedulerReport(metrics)
        self.stream_buffer = stream_buffer
        self._lock = threading.Condition(threading.RLock())
        self._slots = EngineSlots(concurrency, fair, background_running)
        self.background_running = background_running  # background tickets started at once, at most
        self._active: dict[str, Ticket] = {}  # queued or running, by id
        self._executing: set[Ticket] = set()  # tickets whose work occupies a worker (may be finished)
        self._interrupted: set[Ticket] = set()  # executing tickets the server stopped (`cancel_running`)
        self._accepting = True
        self._stopping = False
        self._deadlines = Deadlines()
        self._hooks = TicketHooks(
            withdraw=self._withdraw,
            finished=self._ticket_finished,
            position=self.position,
            estimated_wait_s=self.estimated_wait_s,
            set_timeout=self._set_timeout,
            next_unit=self._next_unit,
            without_slot=self._without_slot,
            woken=self._woken,
        )
        self._workers = [
            threading.Thread(target=self._worker_loop, name=f"{name}-{i}", daemon=True)
            for i in range(self._slots.threads)
        ]
        self._watchdog = threading.Thread(target=self._watchdog_loop, name=f"{name}-watchdog", daemon=True)
        for thread in [*self._workers, self._watchdog]:
            thread.start()
        self._report_queue()

    # -- submitting ---------------------------------------------------------------------------------------

    def submit(
        self,
        work: Callable[[WorkContext], Any],
        *,
        job_id: str | None = None,
        owner: str | None = None,
        stream: bool = False,
        on_state: Callable[[Ticket, str], None] | None = None,
        timeout_s: float | Literal["request"] | None = REQUEST_TIMEOUT,
        work_class: WorkClass = INTERACTIVE,
        fair_key: str | None = None,
        units: int | None = None,
    ) -> Ticket:
        """Queue `work`; raises QueueFull (with `retry_after_s`) or ShuttingDown instead of waiting.

        `timeout_s`: how long the work may run once started: the request timeout by default; None for no
        limit until the work sets its own with `ctx.set_timeout` (jobs: one per segment). `work_class`:
        "interactive" (a client waits) or "background" (calls `ctx.next_unit()` between units);
        `fair_key`: whom it counts against when keys share the engine (default: `owner`); `units`: how
        many units background work has (its wait estimates use it until the work reports progress).

        `work(ctx)` runs on a worker thread; with `stream=True` it returns an iterable (see `Ticket.chunks`).
        `on_state(ticket, state)` is called with "running" when the work starts (unless it never does) and
        once with the final state; waiters wake only after that final call returned, so a job record it
        updates is current when `result()` returns. Inside it, read `ticket.value` / `ticket.error`.
        """
        with self._lock:
            if not self._accepting:
                raise ShuttingDown(
                    "the server is shutting down and accepts no new work: retry after it restarts"
                )
            ticket_id = job_id or uuid.uuid4().hex
            if ticket_id in self._active:
                raise JobStateError(f"job {ticket_id} is already queued or running")
            waiting = len(self._slots.queued)  # a granted ticket waiting for its thread holds a slot already
            room = self.queue_size + max(0, self.concurrency - self._slots.occupied())
            key = fair_key if fair_key is not None else owner
            # a key with nothing waiting gets a place past a full queue (up to twice its size): one key's
            # backlog must not lock the others out of a queue in which keys then take turns
            first_of_its_key = waiting < 2 * room and self._slots.queued_for(key) == 0
            if waiting >= room and not first_of_its_key:
                retry = self._retry_after_locked()
                raise QueueFull(
                    f"the queue is full ({self.queue_size} waiting, {len(self._executing)} running): "
                    f"retry in about {retry} s",
                    retry_after_s=retry,
                )
            ticket = Ticket(self._hooks, work, ticket_id, owner, stream, self.stream_buffer, on_state)
            ticket.timeout_s = timeout_s
            ticket.work_class = work_class
            self._slots.add(ticket, work_class, fair_key if fair_key is not None else owner, units)
            self._active[ticket_id] = ticket
            self._grant_locked()
            ticket.estimated_wait_at_submit = self._slots.estimated_wait_s(ticket)
        self._report_queue()
        return ticket

    def get(self, ticket_id: str) -> Ticket | None:
        """A queued or running ticket by id (finished ones are the job store's business)."""
        return self._active.get(ticket_id)  # a dict read: atomic

    def cancel(self, ticket_id: str, reason: str = "cancelled by the client") -> bool:
        ticket = self.get(ticket_id)
        return ticket.cancel(reason) if ticket is not None else False

    def cancel_running(self, reason: str, only: Callable[[Ticket], bool] | None = None) -> int:
        """Interrupt running work (an engine restart: all of it; a worker's shutdown: its jobs, `only`):
        each ends `cancelled` with `Interrupted` at its next check, which puts a job back in the queue;
        returns how many."""
        with self._lock:
            running = [t for t in self._executing if not t.finished and (only is None or only(t))]
            self._interrupted.update(running)
        for ticket in running:
            ticket.request_cancel(reason)
        return len(running)

    def position(self, ticket: Ticket) -> int | None:
        """0 for the next ticket to start; None once it started."""
        with self._lock:
            return self._slots.position(ticket)

    def estimated_wait_s(self, ticket: Ticket) -> float:
        """Seconds until `ticket` starts (0 once started), from measured unit times and the fair policy."""
        with self._lock:
            return self._slots.estimated_wait_s(ticket)

    # -- state and statistics ----------------------------------------------------------------------------

    @property
    def accepting(self) -> bool:
        return self._accepting

    def stats(self) -> dict[str, Any]:
        """For the admin panel and /health: queue depth, running work, settings and recent durations."""
        with self._lock:
            return {
                "concurrency": self.concurrency,
                "queue_size": self.queue_size,
                "request_timeout_s": self.request_timeout_s,
                "accepting": self._accepting,
                "queued": len(self._slots.queued) + len(self._slots.handoff),
                "running": len(self._executing),
                **self._report.stats(),
                **self._slots.stats(),
            }

    def _retry_after_locked(self) -> int:
        # Room in the queue comes when the first work now waiting starts (it was the last one's start:
        # 160 s where a place freed in 2, and OpenAI's SDKs do not wait past 120 s, so they gave up).
        return max(1, math.ceil(self._slots.next_start_s()))

    def _report_queue(self) -> None:
        if self._report.metrics is not None:
            with self._lock:
                depth = len(self._slots.queued) + len(self._slots.handoff)
                in_flight = len(self._executing)
            self._report.queue(depth, in_flight)

    # -- the tickets' hooks -------------------------------------------------------------------------------

    def _withdraw(self, ticket: Ticket) -> bool:
        with self._lock:
            queued = ticket.state == "queued" and self._slots.withdraw(ticket)
            if queued:
                self._grant_locked()  # a slot granted to it goes to the next
        if queued:
            self._report_queue()
        return queued

    def _woken(self, ticket: Ticket) -> None:
        with self._lock:  # work waiting between units sees its cancel at once
            self._lock.notify_all()

    def _ticket_finished(self, ticket: Ticket) -> None:
        with self._lock:
            self._active.pop(ticket.id, None)
            self._deadlines.drop(ticket.id)
            self._report.count_finished(ended_as(ticket)[0])  # as metrics do: a stopped job is not "done"
        self._report.finished(ticket)

    def _next_unit(self, ticket: Ticket) -> None:
        """Between two units: the slot goes back, and the work waits here until it is granted the next
        one (or is cancelled, or the scheduler stops). Its timeout's clock stops meanwhile."""
        with self._lock:
            if ticket not in self._slots.holding:
                return  # not run by this scheduler's slots (called twice, or after a stop)
            self._slots.release(ticket)
            self._deadlines.suspend(ticket.id)
            self._wait_for_slot_locked(ticket)
        self._report_queue()

    def _without_slot(self, ticket: Ticket, waiting: Callable[[], None]) -> None:
        """The slot goes back while `waiting()` runs (outside the lock; the ticket is neither queued nor
        paused meanwhile, so no slot is granted to it), then as `_next_unit`. If `waiting()` raises, the
        ticket takes no slot again: its work is ending."""
        with self._lock:
            holding = ticket in self._slots.holding
            if holding:
                self._slots.release(ticket)
                self._deadlines.suspend(ticket.id)
                self._grant_locked()
        self._report_queue()
        waiting()
        if not holding:
            return
        with self._lock:
            self._wait_for_slot_locked(ticket)
        self._report_queue()

    def _wait_for_slot_locked(self, ticket: Ticket) -> None:
        """Paused until the ticket is granted a slot (or is cancelled, or the scheduler stops)."""
        self._slots.pause(ticket)
        self._grant_locked()
        while not self._slots.granted(ticket):
            if ticket.cancel_event.is_set() or self._stopping:
                break
            self._lock.wait()
        self._slots.resume(ticket)
        if ticket.id in self._active and self._deadlines.resume(ticket):
            self._lock.notify_all()  # the watchdog may need to wake earlier

    def _grant_locked(self) -> None:
        if self._slots.grant():
            self._lock.notify_all()

    # -- workers ------------------------------------------------------------------------------------------

    def _worker_loop(self) -> None:
        while True:
            with self._lock:
                while (ticket := self._slots.take()) is None and not self._stopping:
                    self._lock.wait()
                if ticket is None:
                    return
                self._executing.add(ticket)
                ticket.mark_running()
                self._report.started(ticket)
                self._deadlines.arm_start(ticket, self.request_timeout_s)
                self._lock.notify_all()  # the watchdog may need to wake earlier
            began = time.monotonic()
            self._report_queue()
            outcome: tuple[str, Any, BaseException | None] = ("failed", None, RuntimeError("worker crashed"))
            try:
                ticket.emit("running")
                outcome = ticket.run()
            finally:
                # Free the slot before waking the client, so it can submit again at once.
                with self._lock:
                    self._executing.discard(ticket)
                    self._slots.ended(ticket)
                    interrupted = ticket in self._interrupted
                    self._interrupted.discard(ticket)
                    self._report.ran(time.monotonic() - began)
                    self._slots.grant()
                    self._lock.notify_all()
                self._report_queue()
                state, result, error = outcome
                if interrupted and state == "cancelled":  # the server's stop, not its client's
                    error = Interrupted(ticket.cancel_reason or "interrupted by the server")
                ticket.finish(state, result=result, error=error)

    def _set_timeout(self, ticket: Ticket, seconds: float, message: str) -> None:
        """`ticket` times out `seconds` from now (replacing an earlier deadline) with `message`."""
        with self._lock:
            if ticket in self._executing:
                self._deadlines.arm(ticket, seconds, message)
                self._lock.notify_all()  # the watchdog may need to wake earlier

    def _watchdog_loop(self) -> None:
        while True:
            with self._lock:
                if self._stopping:
                    return
                now = time.monotonic()
                expired = self._deadlines.expired(now)
                if not expired:
                    next_at = self._deadlines.next_at()
                    self._lock.wait(next_at - now if next_at is not None else None)
                    continue
            for ticket, message in expired:
                if ticket.state == "running":
                    ticket.request_cancel("timeout")
                    ticket.finish("failed", error=JobTimeout(message))

    # -- shutdown -----------------------------------------------------------------------------------------

    def shutdown(self, grace_s: float = 30.0, join_s: float = 2.0) -> dict[str, int]:
        """Stop accepting, fail queued background work (jobs wait for the next start), give running work and
        the requests already queued `grace_s` (they were refused at once, while a job used the grace), then
        fail what is left; join the threads.

        Returns counts: `failed_queued`, `finished_in_grace`, `stopped_running`, `stuck_workers` (work that
        ignored its cancel event; its daemon thread is left behind, its ticket is already failed).
        """
        with self._lock:
            first_call = self._accepting
            self._accepting = False
            jobs = self._slots.drain_queued(BACKGROUND)
            running_at_start = len(self._executing) + len(self._slots.queued) + len(self._slots.handoff)
        if not first_call:
            self._join(join_s)
            return {"failed_queued": 0, "finished_in_grace": 0, "stopped_running": 0, "stuck_workers": 0}
        self._report_queue()
        _fail(jobs, "the server shut down before this job started")
        deadline = time.monotonic() + max(0.0, grace_s)
        with self._lock:
            pending = lambda: self._executing or self._slots.queued or self._slots.handoff  # noqa: E731
            while pending() and (remaining := deadline - time.monotonic()) > 0:
                self._lock.wait(remaining)
            requests = self._slots.drain_queued()  # the requests the grace did not reach
            leftover = [ticket for ticket in self._executing if not ticket.finished]
        _fail(requests, "the server shut down before this job started")
        _fail(leftover, "the server shut down before this job finished")
        return {
            "failed_queued": len(jobs) + len(requests),
            "finished_in_grace": running_at_start - len(leftover) - len(requests),
            "stopped_running": len(leftover),
            "stuck_workers": self._join(join_s),
        }

    def _join(self, join_s: float) -> int:
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        deadline = time.monotonic() + join_s
        for thread in [*self._workers, self._watchdog]:
            thread.join(max(0.0, deadline - time.monotonic()))
        return sum(thread.is_alive() for thread in self._workers)

    async def shutdown_async(self, grace_s: float = 30.0, join_s: float = 2.0) -> dict[str, int]:
        """`shutdown` without blocking the event loop (for the app's lifespan handler)."""
        return await asyncio.to_thread(self.shutdown, grace_s, join_s)

    def __enter__(self) -> Scheduler:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.shutdown()


def _fail(tickets: list[Ticket], why: str) -> None:
    for ticket in tickets:
        ticket.request_cancel("server shutting down")
        ticket.finish("failed", error=ShuttingDown(why))
