"""What the scheduler reports: its metrics hooks, the tickets it finished, its recent run times.

`Scheduler` keeps one `SchedulerReport`: it forwards queue depth, each ticket's end and each wait
estimate's error to the metrics (when there are any), logs failed work, and keeps the counts and recent
durations its `stats()` shows. Counting (`ran`, `count_finished`) happens under the scheduler's lock;
the metrics calls happen outside it.
"""

from __future__ import annotations

from collections import Counter, deque
from typing import Any, Protocol

from cosyserve.errors import error_code
from cosyserve.service.logs import log_failure
from cosyserve.service.requests import TERMINAL_STATES
from cosyserve.service.scheduling.tickets import Ticket, ended_as

RECENT_DURATIONS = 100


class SchedulerMetrics(Protocol):
    """What the scheduler reports; `cosyserve.service.metrics.Metrics` implements it."""

    def observe_queue(self, depth: int, in_flight: int) -> None: ...

    def observe_job(self, state: str, run_s: float | None, wait_s: float) -> None: ...

    def count_error(self, kind: str) -> None: ...

    def observe_wait_estimate(self, work_class: str, estimated_s: float, actual_s: float) -> None: ...


class SchedulerReport:
    """Counts and forwards what happens to tickets (see the module docstring)."""

    def __init__(self, metrics: SchedulerMetrics | None) -> None:
        self.metrics = metrics
        self._durations: deque[float] = deque(maxlen=RECENT_DURATIONS)
        self._finished: Counter[str] = Counter()

    def queue(self, depth: int, in_flight: int) -> None:
        if self.metrics is not None:
            self.metrics.observe_queue(depth, in_flight)

    def started(self, ticket: Ticket) -> None:
        """The wait estimate's error: what was said at submit, against the wait it had."""
        observe = getattr(self.metrics, "observe_wait_estimate", None)
        if callable(observe) and ticket.estimated_wait_at_submit is not None and ticket.wait_s is not None:
            observe(ticket.work_class, ticket.estimated_wait_at_submit, ticket.wait_s)

    def ran(self, seconds: float) -> None:
        self._durations.append(seconds)

    def count_finished(self, state: str) -> None:
        self._finished[state] += 1

    def finished(self, ticket: Ticket) -> None:
        """`ticket` ended: its run and wait times, and its error when it failed (logged and counted)."""
        state, error = ended_as(ticket)
        if self.metrics is not None:
            self.metrics.observe_job(state, ticket.run_s, ticket.wait_s or 0.0)
        if state == "failed" and error is not None:
            kind = error_code(error)
            with ticket.logged_as_its_request():
                log_failure(kind, str(error), job_id=ticket.id, exc=error)
            if self.metrics is not None:
                self.metrics.count_error(kind)  # job failures are counted here, not by the API

    def stats(self) -> dict[str, Any]:
        """Finished tickets by state and recent run times (for `Scheduler.stats`)."""
        durations = list(self._durations)
        return {
            "finished": {state: self._finished[state] for state in sorted(TERMINAL_STATES)},
            "recent_durations_s": [round(d, 3) for d in durations[-20:]],
            "mean_duration_s": round(sum(durations) / len(durations), 3) if durations else None,
        }
