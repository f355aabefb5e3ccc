"""What running work gets (`WorkContext`) and what a ticket may ask of its scheduler (`TicketHooks`).

Apart from `tickets` so that a ticket's module stays small; both speak of a ticket only through the few
attributes they read (`RunningTicket`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from cosyserve.errors import Cancelled


class RunningTicket(Protocol):
    """The parts of a `tickets.Ticket` its running work reaches."""

    id: str
    owner: str | None
    submitted_at: float
    submitted_mono: float
    cancel_event: threading.Event
    cancel_reason: str | None
    partial: Any
    taken: int

    def set_progress(self, fraction: float) -> None: ...


@dataclass(frozen=True)
class TicketHooks:
    """What a ticket may ask of the scheduler that queued it (the scheduler hands these out)."""

    withdraw: Callable[[Any], bool]  # take it out of the queue if it still waits there; True if it did
    finished: Callable[[Any], None]  # it reached its final state: count it, log a failure
    position: Callable[[Any], int | None]  # 0: next to start; None: not queued
    estimated_wait_s: Callable[[Any], float]
    set_timeout: Callable[[Any, float, str], None]  # (ticket, seconds from now, message on expiry)
    next_unit: Callable[[Any], None] = lambda ticket: None  # give the slot back, wait for the next
    # give the slot back while waiting(), then wait for the next slot
    without_slot: Callable[[Any, Callable[[], None]], None] = lambda ticket, waiting: waiting()
    woken: Callable[[Any], None] = lambda ticket: None  # its cancel event was set: stop waiting


class WorkContext:
    """What running work gets: the cancel event to check between steps, a progress reporter, and the
    boundary between its units of engine work (`next_unit`)."""

    def __init__(self, ticket: RunningTicket, hooks: TicketHooks) -> None:
        self._ticket = ticket
        self._hooks = hooks

    @property
    def cancel(self) -> threading.Event:
        """Set when the work should stop (client cancel, disconnect, timeout, shutdown)."""
        return self._ticket.cancel_event

    @property
    def items_taken(self) -> int:
        """How many items a stream's reader took so far (what is still buffered never reached it)."""
        return self._ticket.taken

    @property
    def ticket_id(self) -> str:
        return self._ticket.id

    @property
    def owner(self) -> str | None:
        return self._ticket.owner

    @property
    def submitted_at(self) -> float:
        """When the work was submitted (`time.time()`)."""
        return self._ticket.submitted_at

    @property
    def submitted_mono(self) -> float:
        """When the work was submitted (`time.monotonic()`): latencies the client sees count from here."""
        return self._ticket.submitted_mono

    def set_progress(self, fraction: float) -> None:
        self._ticket.set_progress(fraction)

    def set_timeout(self, seconds: float, message: str) -> None:
        """A new deadline: JobTimeout(`message`) unless the work ends within `seconds` (jobs: per segment).
        The clock stops while the work waits between units for the engine."""
        self._hooks.set_timeout(self._ticket, seconds, message)  # the scheduler keeps deadlines

    def share_partial(self, value: Any) -> None:
        """Offer what is finished so far (e.g. a long job's first pieces) to a client that shows it early."""
        self._ticket.partial = value

    def check_cancelled(self) -> None:
        """Raise Cancelled if the work was asked to stop."""
        if self._ticket.cancel_event.is_set():
            raise Cancelled(self._ticket.cancel_reason or "cancelled")

    def next_unit(self) -> None:
        """One unit of engine work ended (a segment, a batch item, a cue): give the engine slot back and
        wait for the next grant, so other work shares the engine fairly between units. Raises Cancelled
        (at once, also while waiting) if the work was asked to stop."""
        self.check_cancelled()
        self._hooks.next_unit(self._ticket)
        self.check_cancelled()

    def without_slot(self, waiting: Callable[[], None]) -> None:
        """Give the engine slot back while `waiting()` blocks on something other than the engine (the
        model reloading), then wait for a slot again as between units: work that needs the engine to
        finish (and let go of the old model) gets it meanwhile. An error from `waiting()` propagates with
        no slot taken again; Cancelled (also while waiting for the slot) if the work was asked to stop."""
        self.check_cancelled()
        self._hooks.without_slot(self._ticket, waiting)
        self.check_cancelled()
