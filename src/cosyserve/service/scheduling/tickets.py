"""A ticket: one piece of submitted work as its client sees it (state, cancel, result, streamed items).

Consumers may block (`wait`, `result`, `chunks`) from any thread or await (`wait_async`, `result_async`,
`achunks`) from an event loop: state changes wake both kinds. Abandoning a stream (breaking out of the
loop, a disconnected client closing the generator) cancels the work.

A ticket and its scheduler talk through two narrow doors: the ticket asks the scheduler only what its
`TicketHooks` offer (leave the queue, report the end, queue position), and the scheduler drives the ticket
only through the methods under "driven by the scheduler" (start, run, finish, request a cancel).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from cosyserve.errors import Cancelled
from cosyserve.service.logs import get_request_id, request_context
from cosyserve.service.requests import TERMINAL_STATES
from cosyserve.service.scheduling.work_context import TicketHooks, WorkContext

__all__ = ["Ticket", "TicketHooks", "WorkContext"]

logger = logging.getLogger(__name__)
ABANDONED = "the client stopped reading the stream"
_END = object()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def ended_as(ticket: Ticket) -> tuple[str, BaseException | None]:
    """How `ticket` ended as its users see it: its state and error, except for work that ended with a
    value saying it `stopped` early (a job stopped by a revoke, its quota or a role change keeps its
    finished part as its value): that one failed (or was cancelled) for that reason. The activity log and
    `cosyserve_jobs_total` counted such jobs as done."""
    stopped = getattr(ticket.value, "stopped", None) if ticket.state == "done" else None
    if isinstance(stopped, BaseException):
        return ("cancelled" if isinstance(stopped, Cancelled) else "failed"), stopped
    return ticket.state, ticket.error


class Ticket:
    """Created by `Scheduler.submit`. States: queued → running → done | failed | cancelled (or straight
    from queued to cancelled/failed). Times are `time.time()` seconds."""

    def __init__(
        self,
        hooks: TicketHooks,
        work: Callable[[WorkContext], Any],
        ticket_id: str,
        owner: str | None,
        stream: bool,
        buffer_size: int,
        on_state: Callable[[Ticket, str], None] | None,
    ) -> None:
        self.id = ticket_id
        self.owner = owner
        self.stream = stream
        self.cancel_event = threading.Event()
        self.cancel_reason: str | None = None
        self.progress = 0.0
        self.partial: Any = None  # what the work shared of its result so far (`WorkContext.share_partial`)
        self.submitted_at = time.time()
        self.started_at: float | None = None
        self.finished_at: float | None = None
        # the same instants on the monotonic clock: durations that a wall-clock step (NTP) cannot bend
        self.submitted_mono = time.monotonic()
        self.started_mono: float | None = None
        self.finished_mono: float | None = None
        self._hooks = hooks
        self.timeout_s: Any = None  # set by the scheduler: its timeout policy for this ticket
        self.work_class = "interactive"  # set by the scheduler: "interactive" or "background"
        self.estimated_wait_at_submit: float | None = None  # the scheduler's estimate when it was queued
        self._work: Callable[[WorkContext], Any] | None = work
        self._on_state = on_state
        self._cond = threading.Condition()
        self._emit_lock = threading.RLock()  # keeps on_state calls in order: running before the end
        self._terminal_emitted = False
        self._state = "queued"
        self._result: Any = None
        self._error: BaseException | None = None
        self.request_id = get_request_id()  # the request that submitted it: its work's log lines carry it
        self._chunks: deque[Any] = deque()
        self.taken = 0  # items its reader took from the buffer (a stream's audio handed to its client)
        self._buffer_size = buffer_size
        self._settled = False  # final state recorded and on_state callbacks done: waiters may go
        self._emitting_thread: int | None = None
        self._async_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def __repr__(self) -> str:
        return f"Ticket(id={self.id!r}, state={self._state!r}, owner={self.owner!r})"

    # -- what clients read --------------------------------------------------------------------------------

    @property
    def state(self) -> str:
        return self._state

    @property
    def done(self) -> bool:
        """Finished, and its `on_state` callback for the final state has returned."""
        return self._settled

    @property
    def finished(self) -> bool:
        """In a final state (its `on_state` callback may still be running)."""
        return self._state in TERMINAL_STATES

    @property
    def value(self) -> Any:
        """The result once done (None before, or when it did not succeed); never blocks."""
        return self._result

    @property
    def error(self) -> BaseException | None:
        """Why it failed or was cancelled, once finished; never blocks."""
        return self._error

    @property
    def position(self) -> int | None:
        """Place in the queue (0: next to start); None once started or finished."""
        return self._hooks.position(self) if self._state == "queued" else None

    def estimated_wait_s(self) -> float:
        return self._hooks.estimated_wait_s(self)

    def set_progress(self, fraction: float) -> None:
        with self._cond:
            self.progress = min(1.0, max(0.0, float(fraction)))
            self._notify_locked()

    def cancel(self, reason: str = "cancelled by the client") -> bool:
        """Ask the work to stop; a queued ticket ends cancelled at once. False if it already finished."""
        withdrawn = self._hooks.withdraw(self)
        if self.finished:
            return False
        self.request_cancel(reason)
        if withdrawn:
            self.finish("cancelled", error=Cancelled(reason))
        return True

    def wait(self, timeout: float | None = None) -> bool:
        """Block until finished; False if `timeout` passed first."""
        if self._emitting_thread == threading.get_ident():
            return self.finished  # called from our own on_state callback: waiting would deadlock
        with self._cond:
            return self._cond.wait_for(lambda: self._settled, timeout)

    def result(self, timeout: float | None = None) -> Any:
        """The work's return value; re-raises its exception (Cancelled, JobTimeout, ShuttingDown, …)."""
        if not self.wait(timeout):
            raise TimeoutError(f"job {self.id} did not finish within {timeout} s")
        return self._outcome()

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if not self.wait(timeout):
            raise TimeoutError(f"job {self.id} did not finish within {timeout} s")
        return self._error

    def chunks(self, timeout: float | None = None) -> Iterator[Any]:
        """Items of a stream ticket as they are produced; raises the work's error after the last one.

        `timeout` bounds the wait for each item (TimeoutError). Leaving the loop early cancels the work.
        Someone must read a stream ticket: an unread one stalls on its full buffer until the request timeout.
        """
        if not self.stream:
            raise TypeError(f"job {self.id} was not submitted with stream=True: use result()")
        return self._iter_chunks(timeout)

    def _iter_chunks(self, timeout: float | None) -> Iterator[Any]:
        with self._cancelled_if_left():
            while (item := self._next_item(timeout)) is not _END:
                yield item
        self._outcome()

    def _next_item(self, timeout: float | None) -> Any:
        with self._cond:
            if not self._cond.wait_for(lambda: self._chunks or self._settled, timeout):
                raise TimeoutError(f"job {self.id} produced nothing for {timeout} s")
            return self._pop_locked()

    @contextlib.contextmanager
    def _cancelled_if_left(self) -> Iterator[None]:
        """A reader that leaves before the end (break, disconnect, timeout) cancels the work."""
        try:
            yield
        except BaseException:
            self.cancel(ABANDONED)
            raise

    # -- the same for asyncio -----------------------------------------------------------------------------

    async def wait_async(self, timeout: float | None = None) -> bool:
        return await self._until(lambda: self._settled, timeout)

    async def wait_started_async(self, timeout: float | None = None) -> bool:
        """True once it left the queue: started, or finished without starting."""
        return await self._until(lambda: self._state != "queued", timeout)

    async def result_async(self, timeout: float | None = None) -> Any:
        if not await self.wait_async(timeout):
            raise TimeoutError(f"job {self.id} did not finish within {timeout} s")
        return self._outcome()

    async def achunks(self, timeout: float | None = None) -> AsyncIterator[Any]:
        """`chunks` for an event loop; closing the async generator (client disconnect) cancels the work."""
        if not self.stream:
            raise TypeError(f"job {self.id} was not submitted with stream=True: use result_async()")
        with self._cancelled_if_left():
            while (item := await self._anext_item(timeout)) is not _END:
                yield item
        self._outcome()

    async def _anext_item(self, timeout: float | None) -> Any:
        if not await self._until(lambda: bool(self._chunks) or self._settled, timeout):
            raise TimeoutError(f"job {self.id} produced nothing for {timeout} s")
        with self._cond:
            return self._pop_locked()

    async def _until(self, predicate: Callable[[], bool], timeout: float | None) -> bool:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            with self._cond:
                if predicate():
                    return True
                future = loop.create_future()
                self._async_waiters.append((loop, future))
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return False
            try:
                await asyncio.wait_for(future, remaining)
            except asyncio.TimeoutError:
                with self._cond:
                    return predicate()

    # -- internals ----------------------------------------------------------------------------------------

    def _outcome(self) -> Any:
        if self._state == "done":
            return self._result
        if self._error is None:  # pragma: no cover - every unsuccessful end records why
            raise RuntimeError(f"job {self.id} ended {self._state} without saying why")
        raise self._error

    def _pop_locked(self) -> Any:
        if self._chunks:
            item = self._chunks.popleft()
            self.taken += 1
            self._notify_locked()  # room for the producer
            return item
        return _END

    def _notify_locked(self) -> None:
        self._cond.notify_all()
        waiters, self._async_waiters = self._async_waiters, []
        for loop, future in waiters:
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody is waiting any more
                loop.call_soon_threadsafe(_resolve, future)

    # -- driven by the scheduler --------------------------------------------------------------------------

    @property
    def wait_s(self) -> float | None:
        """Seconds from submit to start (to its end when it never started; None while it waits)."""
        began = self.started_mono if self.started_mono is not None else self.finished_mono
        return None if began is None else max(0.0, began - self.submitted_mono)

    @property
    def run_s(self) -> float | None:
        """Seconds from start to end (None until it ran and ended)."""
        if self.started_mono is None or self.finished_mono is None:
            return None
        return max(0.0, self.finished_mono - self.started_mono)

    def running_s(self) -> float:
        """Seconds since it started (0 before)."""
        return 0.0 if self.started_mono is None else max(0.0, time.monotonic() - self.started_mono)

    def mark_running(self) -> None:
        """A worker took it (under the scheduler's lock)."""
        with self._cond:
            self._state = "running"
            self.started_at, self.started_mono = time.time(), time.monotonic()
            self._notify_locked()

    def request_cancel(self, reason: str) -> None:
        """Set the cancel event (the work stops at its next check); the state is the scheduler's to end."""
        with self._cond:
            if self.finished or self.cancel_event.is_set():
                return
            self.cancel_reason = reason
            self.cancel_event.set()
            self._notify_locked()  # wakes a producer blocked on a full buffer
        self._hooks.woken(self)  # and work waiting for its next unit (no ticket lock held: lock order)

    def finish(self, state: str, *, result: Any = None, error: BaseException | None = None) -> bool:
        """Move to a final state once; later calls (a late worker after a timeout) change nothing."""
        with self._cond:
            if self.finished:
                return False
            self._state = state
            self._result = result
            self._error = error
            self.finished_at, self.finished_mono = time.time(), time.monotonic()
            if state == "done":
                self.progress = 1.0
            self._notify_locked()
        self._hooks.finished(self)
        self.emit(state)
        with self._cond:
            self._settled = True
            self._notify_locked()
        return True

    def emit(self, state: str) -> None:
        """Call `on_state(self, state)`, at most once after the final state (callback errors are logged)."""
        with self._emit_lock:
            if self._terminal_emitted:
                return
            self._terminal_emitted = state in TERMINAL_STATES
            if self._on_state is None:
                return
            self._emitting_thread = threading.get_ident()
            try:
                self._on_state(self, state)
            except Exception:
                logger.exception("on_state callback failed for job %s (%s)", self.id, state)
            finally:
                self._emitting_thread = None

    def run(self) -> tuple[str, Any, BaseException | None]:
        """Run the work in the calling worker thread; returns (final state, result, error) for `finish`."""
        work, self._work = self._work, None  # drop the closure (and the request's audio) once run
        try:
            if work is None:
                raise RuntimeError(f"job {self.id} was started twice")
            with self.logged_as_its_request():
                output = work(WorkContext(self, self._hooks))
                result = self._pump(output) if self.stream else output
        except BaseException as exc:  # whatever the work raises ends the ticket, never the worker
            if self.cancel_event.is_set() or isinstance(exc, Cancelled):
                error = exc if isinstance(exc, Cancelled) else Cancelled(self.cancel_reason or "cancelled")
                return "cancelled", None, error
            return "failed", None, exc
        return "done", result, None

    def logged_as_its_request(self) -> contextlib.AbstractContextManager[Any]:
        """Log lines written inside carry the submitting request's id (a 500's answer names it, and the
        traceback logged from the worker thread had none)."""
        return request_context(self.request_id) if self.request_id else contextlib.nullcontext()

    def _pump(self, output: Any) -> Any:
        """Move a stream's items into the buffer; the result is `output.result()` if it has one, else the
        generator's return value."""
        iterator = iter(output)
        returned = None
        try:
            while True:
                if self.cancel_event.is_set():
                    raise Cancelled(self.cancel_reason or "cancelled")
                try:
                    item = next(iterator)
                except StopIteration as stop:
                    returned = stop.value
                    break
                if not self._push(item):
                    raise Cancelled(self.cancel_reason or "cancelled")
        except BaseException:
            close = getattr(iterator, "close", None)
            if callable(close):
                with contextlib.suppress(Exception):
                    close()  # runs the generator's cleanup now, not at garbage collection
            raise
        finish = getattr(output, "result", None)
        return finish() if callable(finish) else returned

    def _push(self, item: Any) -> bool:
        """Hand one item to the consumer, waiting while the buffer is full; False if it should stop."""
        with self._cond:
            while len(self._chunks) >= self._buffer_size and self._state == "running":
                if self.cancel_event.is_set():
                    break
                self._cond.wait(1.0)
            if self._state != "running" or self.cancel_event.is_set():
                return False
            self._chunks.append(item)
            self._notify_locked()
        return True
