"""Engine slots granted one unit at a time: the scheduler's books of who waits, who holds, who runs.

A ticket waits *queued* until it is granted its first slot; then a worker thread takes it (it is
*started*) and it holds the slot until its work ends or calls `WorkContext.next_unit`, which gives the
slot back and waits (*paused*) for the next grant. Grants follow the `FairPolicy`. There are more worker
threads than slots (`threads` = slots + `background_running`), so background tickets paused between
their units never keep an interactive request from getting a thread; at most `background_running`
background tickets are started at once.

Every method is called with the scheduler's lock held; nothing here blocks or calls out.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from cosyserve.service.scheduling.fair_policy import (
    ANONYMOUS,
    BACKGROUND,
    CLASSES,
    INTERACTIVE,
    FairPolicy,
    FairSettings,
    Waiter,
    WorkClass,
)
from cosyserve.service.scheduling.tickets import Ticket
from cosyserve.service.scheduling.wait_estimates import (
    Holder,
    Queued,
    ServiceTimes,
    estimate_waits,
    units_left,
)


class EngineSlots:
    """`slots` engine slots shared by queued and paused tickets (see the module docstring)."""

    def __init__(
        self,
        slots: int,
        fair: FairSettings | None = None,
        background_running: int = 4,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if background_running < 1:
            raise ValueError(f"background_running must be at least 1, got {background_running}")
        self.slots = slots
        self.background_running = background_running
        self.threads = slots + background_running
        self.policy = FairPolicy(fair)
        self.times = ServiceTimes()
        self._clock = clock
        self._seq = itertools.count()
        self._waiter: dict[Ticket, Waiter] = {}
        self.queued: list[Ticket] = []  # not started, in submit order
        self.handoff: deque[Ticket] = deque()  # granted a first slot, waiting for a thread to take it
        self.started: set[Ticket] = set()  # taken by a thread (running, paused, or finishing)
        self.paused: dict[Ticket, bool] = {}  # between units: True once granted the next one
        self.holding: dict[Ticket, tuple[float, float]] = {}  # -> (granted at, estimated unit seconds)
        self.units_done: dict[Ticket, int] = {}
        self.units: dict[Ticket, int] = {}  # units a ticket has in all, as its submitter said
        self._version = 0  # bumped on every change: the wait estimates are kept until it moves
        self._estimates: tuple[int, float, dict[str, tuple[int, float]]] = (-1, 0.0, {})

    # -- tickets coming and going -------------------------------------------------------------------------

    def add(self, ticket: Ticket, work_class: WorkClass, key: str | None, units: int | None = None) -> None:
        """`units`: how many units its work has (None: unknown; the estimate assumes a typical count)."""
        self._waiter[ticket] = Waiter(ticket.id, work_class, key or ANONYMOUS, next(self._seq))
        if units is not None:
            self.units[ticket] = max(1, units)
        self.queued.append(ticket)
        self._changed()

    def queued_for(self, key: str | None) -> int:
        """How many tickets of `key` wait for their first slot."""
        key = key or ANONYMOUS
        return sum(1 for ticket in self.queued if self._waiter[ticket].key == key)

    def withdraw(self, ticket: Ticket) -> bool:
        """Take a ticket that has not started out (its granted slot, if any, goes back); True if it was."""
        if ticket in self.queued:
            self.queued.remove(ticket)
        elif ticket in self.handoff:
            self.handoff.remove(ticket)
            self.holding.pop(ticket, None)
        else:
            return False
        self._forget(ticket)
        return True

    def take(self) -> Ticket | None:
        """A ticket granted its first slot, for an idle worker thread (None: nothing to take)."""
        if not self.handoff:
            return None
        ticket = self.handoff.popleft()
        self.started.add(ticket)
        self._changed()
        return ticket

    def ended(self, ticket: Ticket) -> float | None:
        """Its work returned: the slot it held goes back. Returns the last unit's seconds (None: none)."""
        unit_s = self.release(ticket)
        if ticket in self.started and self.work_class(ticket) == BACKGROUND:
            self.times.observe_ticket_units(self.units_done.get(ticket, 0))
        self.started.discard(ticket)
        self.paused.pop(ticket, None)
        self._forget(ticket)
        return unit_s

    def drain_queued(self, work_class: str | None = None) -> list[Ticket]:
        """Every ticket not started (of `work_class` only, when given): a shutdown fails them."""
        drained = [t for t in [*self.handoff, *self.queued] if work_class in (None, self.work_class(t))]
        for ticket in drained:
            self.withdraw(ticket)
        return drained

    # -- units --------------------------------------------------------------------------------------------

    def release(self, ticket: Ticket) -> float | None:
        """A unit ended: settle its slot; returns how long it held it (None: it held none)."""
        held = self.holding.pop(ticket, None)
        if held is None:
            return None
        granted_at, estimate_s = held
        now = self._clock()
        waiter = self._waiter[ticket]
        self.policy.settled(waiter, estimate_s, now - granted_at, now)
        self.times.observe(waiter.work_class, now - granted_at)
        self.units_done[ticket] = self.units_done.get(ticket, 0) + 1
        self._changed()
        return now - granted_at

    def pause(self, ticket: Ticket) -> None:
        self.paused[ticket] = False
        self._changed()

    def resume(self, ticket: Ticket) -> None:
        """Leaves the wait between units (granted, or given up: cancelled)."""
        self.paused.pop(ticket, None)
        self._changed()

    def granted(self, ticket: Ticket) -> bool:
        return self.paused.get(ticket, False)

    def grant(self) -> int:
        """Give every free slot to whom the policy chooses; returns how many were granted."""
        count = 0
        while len(self.holding) < self.slots:
            candidates = self._eligible()
            held = self.held_by_class()
            chosen = self.policy.choose(candidates, held, self.slots, self._clock())
            if chosen is None:
                break
            ticket = next(t for t in self._tickets_waiting() if self._waiter[t] is chosen)
            estimate_s = self.times.unit_s(chosen.work_class)
            self.policy.granted(chosen, estimate_s)
            self.holding[ticket] = (self._clock(), estimate_s)
            if ticket in self.paused:
                self.paused[ticket] = True
            else:
                self.queued.remove(ticket)
                self.handoff.append(ticket)
            count += 1
            self._changed()
        return count

    def _tickets_waiting(self) -> list[Ticket]:
        return [*self.queued, *(t for t, granted in self.paused.items() if not granted)]

    def _eligible(self) -> list[Waiter]:
        """Paused tickets always; queued ones while a thread is free (background: while fewer than
        `background_running` background tickets are started)."""
        eligible = [self._waiter[t] for t, granted in self.paused.items() if not granted]
        threads_busy = len(self.started) + len(self.handoff)
        if threads_busy >= self.threads:
            return eligible
        background = sum(1 for t in [*self.started, *self.handoff] if self.work_class(t) == BACKGROUND)
        for ticket in self.queued:
            waiter = self._waiter[ticket]
            if waiter.work_class != BACKGROUND or background < self.background_running:
                eligible.append(waiter)
        return eligible

    # -- reading ------------------------------------------------------------------------------------------

    def work_class(self, ticket: Ticket) -> str:
        waiter = self._waiter.get(ticket)
        return waiter.work_class if waiter is not None else "interactive"

    def held_by_class(self) -> dict[str, int]:
        held = {name: 0 for name in CLASSES}
        for ticket in self.holding:
            held[self._waiter[ticket].work_class] += 1
        return held

    def occupied(self) -> int:
        """Slots taken for the queue's purposes: held, or kept by a ticket between its units."""
        return len(self.holding) + sum(1 for t, granted in self.paused.items() if not granted)

    def estimates(self) -> dict[str, tuple[int, float]]:
        """(position, seconds until its first grant) of every ticket not started, by id."""
        now = self._clock()
        version, computed_at, cached = self._estimates
        if version == self._version:
            elapsed = now - computed_at
            return {tid: (pos, max(0.0, eta - elapsed)) for tid, (pos, eta) in cached.items()}
        # granted but not yet taken by a thread (handoff): holders whose first unit just began
        holders = [
            Holder(self._waiter[t], now - granted_at, self._units_after(t))
            for t, (granted_at, _estimate) in self.holding.items()
        ]
        waiting = [
            Queued(self._waiter[t], self._units_after(t), queued=False)
            for t, granted in self.paused.items()
            if not granted
        ]
        waiting += [Queued(self._waiter[t], self._fresh_units(t), queued=True) for t in self.queued]
        found = estimate_waits(
            self.policy, self.slots, holders, waiting, self.times, now, self.background_running
        )
        ahead = len(self.handoff)  # granted already: next to start
        found = {tid: (position + ahead, eta) for tid, (position, eta) in found.items()}
        for index, ticket in enumerate(self.handoff):
            found[ticket.id] = (index, 0.0)
        self._estimates = (self._version, now, found)
        return found

    def position(self, ticket: Ticket) -> int | None:
        """0 for the next ticket to start; None once it started."""
        if ticket not in self.queued and ticket not in self.handoff:
            return None
        found = self.estimates().get(ticket.id)
        return found[0] if found is not None else len(self.queued) + len(self.handoff)

    def estimated_wait_s(self, ticket: Ticket) -> float:
        """Seconds until `ticket` is granted its first slot (0 once started)."""
        if ticket not in self.queued and ticket not in self.handoff:
            return 0.0
        found = self.estimates().get(ticket.id)
        if found is not None:
            return found[1]
        # beyond what the estimate plays forward: every unit now waiting, shared by the slots
        waiting = len(self.queued) + len(self.paused) + len(self.holding)
        return waiting * self.times.unit_s(self.work_class(ticket)) / self.slots

    def next_start_s(self) -> float:
        """When the first ticket now queued starts, freeing its place in the queue (one interactive unit
        shared by the slots when none is)."""
        etas = [eta for ticket_id, (_, eta) in self.estimates().items() if ticket_id in self._queued_ids()]
        if not etas:
            return self.times.unit_s(INTERACTIVE) / self.slots
        return min(etas)

    def _queued_ids(self) -> set[str]:
        return {ticket.id for ticket in self.queued}

    def stats(self) -> dict[str, Any]:
        share = self.policy.used_share(self._clock())
        return {
            "classes": self.by_class(),
            "unit_seconds": self.times.snapshot(),
            "engine_share": {name: round(value, 3) for name, value in share.items()},
        }

    def by_class(self) -> dict[str, dict[str, Any]]:
        """Queued, started and holding tickets per class (stats)."""
        counts = {name: {"queued": 0, "started": 0, "holding": 0} for name in CLASSES}
        for ticket in [*self.queued, *self.handoff]:
            counts[self.work_class(ticket)]["queued"] += 1
        for ticket in self.started:
            counts[self.work_class(ticket)]["started"] += 1
        for ticket in self.holding:
            counts[self.work_class(ticket)]["holding"] += 1
        return counts

    def _units_after(self, ticket: Ticket) -> int:
        if self.work_class(ticket) != BACKGROUND:
            return 0
        done = self.units_done.get(ticket, 0)  # units it ended; the current (or next) one is not among them
        return units_left(done, ticket.progress, self.times.typical_units, self.units.get(ticket))

    def _fresh_units(self, ticket: Ticket) -> int:
        if self.work_class(ticket) != BACKGROUND:
            return 0
        return units_left(0, 0.0, self.times.typical_units, self.units.get(ticket))

    def _forget(self, ticket: Ticket) -> None:
        self._waiter.pop(ticket, None)
        self.units_done.pop(ticket, None)
        self.units.pop(ticket, None)
        active = {(w.work_class, w.key) for w in self._waiter.values()}
        self.policy.forget(active)
        self._changed()

    def _changed(self) -> None:
        self._version += 1
