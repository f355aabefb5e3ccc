"""Running tickets' deadlines: when each times out and why, for the scheduler's watchdog.

A ticket waiting between its units for the engine is not running: its clock is suspended (the seconds
it had left are kept) and resumed when it is granted its next unit. Called with the scheduler's lock held.
"""

from __future__ import annotations

import heapq
import itertools
import time
import weakref

from cosyserve.service.scheduling.tickets import Ticket

REQUEST_TIMEOUT = "request"  # `Scheduler.submit(timeout_s=...)`: the scheduler's request timeout applies


class Deadlines:
    """Deadlines by ticket; `expired` hands out those that passed."""

    def __init__(self) -> None:
        # (deadline, tie-breaker, ticket): weak, so a finished ticket and its result are not kept until then
        self._heap: list[tuple[float, int, weakref.ref[Ticket]]] = []
        self._seq = itertools.count()
        self._of: dict[str, tuple[float, str]] = {}  # running ticket id -> (deadline, message)
        self._suspended: dict[str, tuple[float, str]] = {}  # waiting ticket id -> (seconds left, message)

    def arm(self, ticket: Ticket, seconds: float, message: str) -> None:
        """`ticket` times out `seconds` from now (replacing an earlier deadline) with `message`."""
        deadline = time.monotonic() + seconds
        self._of[ticket.id] = (deadline, message)
        heapq.heappush(self._heap, (deadline, next(self._seq), weakref.ref(ticket)))

    def arm_start(self, ticket: Ticket, request_timeout_s: float | None) -> None:
        """The deadline a ticket starts with: the request timeout, its own, or none (`ticket.timeout_s`)."""
        if ticket.timeout_s == REQUEST_TIMEOUT and request_timeout_s is not None:
            message = (
                f"the job ran longer than the {request_timeout_s:g} s request timeout and was "
                "stopped: shorten the text or raise request_timeout_s"
            )
            self.arm(ticket, request_timeout_s, message)
        elif isinstance(ticket.timeout_s, float | int):
            message = f"the job ran longer than its {ticket.timeout_s:g} s timeout and was stopped"
            self.arm(ticket, float(ticket.timeout_s), message)

    def drop(self, ticket_id: str) -> None:
        self._of.pop(ticket_id, None)
        self._suspended.pop(ticket_id, None)

    def suspend(self, ticket_id: str) -> None:
        current = self._of.pop(ticket_id, None)
        if current is not None:
            self._suspended[ticket_id] = (max(0.0, current[0] - time.monotonic()), current[1])

    def resume(self, ticket: Ticket) -> bool:
        """Re-arm a suspended deadline with the seconds it had left; True if there was one."""
        suspended = self._suspended.pop(ticket.id, None)
        if suspended is not None:
            self.arm(ticket, *suspended)
        return suspended is not None

    def expired(self, now: float) -> list[tuple[Ticket, str]]:
        """The tickets whose deadline passed, each with its message (once)."""
        found = []
        while self._heap and self._heap[0][0] <= now:
            ticket = heapq.heappop(self._heap)[2]()
            # an entry older than the ticket's current deadline was replaced (`arm` again)
            current = self._of.get(ticket.id) if ticket is not None else None
            if ticket is not None and current is not None and current[0] <= now:
                found.append((ticket, current[1]))
        return found

    def next_at(self) -> float | None:
        return self._heap[0][0] if self._heap else None
