"""Honest waits: measured unit service times per class, and each queued ticket's place and start time.

`ServiceTimes` keeps a moving average (EWMA) of how long one unit holds an engine slot, per class.
`estimate_waits` plays the queue forward on a copy of the fair policy: slots free when their unit's
expected time is up, a started background ticket comes back for its next unit (as many as its progress
says are left; a fresh one, as many as its submitter said it has), and each free slot goes to whom the
policy would choose, with the scheduler's caps: at most `background_slots` slots held by background units
(the policy's own check) and at most `background_running` background tickets started at once (a queued
one starts only when a started one ended). A queued ticket's ETA is the time it is first granted, its
position the number of queued tickets granted before it. Retry-After and the status API read the same
figures.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass

from cosyserve.service.scheduling.fair_policy import BACKGROUND, CLASSES, FairPolicy, Waiter

DEFAULT_UNIT_S = 10.0  # a unit's expected time before any was measured
EWMA_WEIGHT = 0.2  # weight of the newest measurement
DEFAULT_UNITS = 10  # units of a background ticket before one finished
MAX_STEPS = 5000  # grants played forward at most (beyond: no estimate)


class ServiceTimes:
    """Seconds one unit holds a slot, per class (moving averages of measurements)."""

    def __init__(self, default_s: float = DEFAULT_UNIT_S) -> None:
        self.default_s = default_s
        self._mean: dict[str, float] = {}
        self._count: dict[str, int] = {}
        self._units = float(DEFAULT_UNITS)  # units of a background ticket (moving average)
        self._ended = False

    def observe(self, work_class: str, seconds: float) -> None:
        seconds = max(0.0, seconds)
        if work_class not in self._mean:
            self._mean[work_class] = seconds
        else:
            self._mean[work_class] += EWMA_WEIGHT * (seconds - self._mean[work_class])
        self._count[work_class] = self._count.get(work_class, 0) + 1

    def unit_s(self, work_class: str) -> float:
        """The expected seconds of one unit of `work_class` (the other class's measure, else the default,
        before one was measured)."""
        if work_class in self._mean:
            return self._mean[work_class]
        measured = [self._mean[name] for name in CLASSES if name in self._mean]
        return measured[0] if measured else self.default_s

    def observe_ticket_units(self, units: int) -> None:
        """A background ticket ended after `units` units (what a typical one has)."""
        self._units = self._units + EWMA_WEIGHT * (units - self._units) if self._ended else float(units)
        self._ended = True

    @property
    def typical_units(self) -> float:
        return self._units

    def snapshot(self) -> dict[str, dict[str, float | int]]:
        return {
            name: {"unit_s": round(self._mean[name], 3), "units": self._count[name]} for name in self._mean
        }


@dataclass(frozen=True)
class Holder:
    """A unit running now: who, since how many seconds, and how many units its ticket has after it."""

    waiter: Waiter
    elapsed_s: float
    units_after: int


@dataclass(frozen=True)
class Queued:
    """A unit waiting: who, and how many units its ticket has after it (fresh tickets: `queued=True`)."""

    waiter: Waiter
    units_after: int
    queued: bool


def units_left(units_done: int, progress: float, typical_units: float, units: int | None = None) -> int:
    """Units a ticket still has after its current (or next) one, `units_done` units ended before it: from
    its progress once it reported some (the rate it made progress at), else from `units` (what its
    submitter said it has), else what a background ticket typically has (`ServiceTimes.typical_units`)."""
    if progress <= 0.0 or units_done <= 0:
        total = units if units is not None else round(typical_units)
        return max(0, total - max(1, units_done))
    return max(0, math.ceil(units_done * (1.0 - progress) / progress - 1e-9) - 1)  # 1e-9: float noise


def estimate_waits(
    policy: FairPolicy,
    slots: int,
    holders: list[Holder],
    waiting: list[Queued],
    times: ServiceTimes,
    now: float,
    background_running: int | None = None,
) -> dict[str, tuple[int, float]]:
    """For each queued ticket (`Queued.queued`): (position, seconds until its first grant). Tickets the
    play did not reach within `MAX_STEPS` are left out. `policy` is copied, never changed.
    `background_running`: background tickets started at once, at most (None: no cap)."""
    policy = policy.copy()
    order = itertools.count()
    events: list[tuple[float, int, Holder | None]] = []  # (time a slot frees, tie-breaker, its holder)
    holding = {name: 0 for name in CLASSES}
    started = _StartedBackground(holders, waiting, background_running)
    for holder in holders:
        unit_s = times.unit_s(holder.waiter.work_class)
        residual = max(unit_s - holder.elapsed_s, 0.1 * unit_s)
        heapq.heappush(events, (now + residual, next(order), holder))
        holding[holder.waiter.work_class] += 1
    for _ in range(max(0, slots - len(holders))):
        heapq.heappush(events, (now, next(order), None))
    pool = list(waiting)
    targets = sum(1 for q in pool if q.queued)
    found: dict[str, tuple[int, float]] = {}
    for _ in range(MAX_STEPS):
        if len(found) == targets or not events:
            break
        at, _tie, ending = heapq.heappop(events)
        if ending is not None:
            holding[ending.waiter.work_class] -= 1
            unit_s = times.unit_s(ending.waiter.work_class)
            policy.settled(ending.waiter, unit_s, unit_s, at)
            if ending.units_after > 0:
                pool.append(Queued(ending.waiter, ending.units_after - 1, queued=False))
            else:
                started.ended(ending.waiter)
        chosen = policy.choose([q.waiter for q in pool if started.may_run(q)], holding, slots, at)
        if chosen is None:
            later = [t for t, _, h in events if h is not None and t > at]
            if later:  # the slot stays idle until the next unit ends
                heapq.heappush(events, (min(later), next(order), None))
            continue
        entry = next(q for q in pool if q.waiter is chosen)
        pool.remove(entry)
        if entry.queued:
            found[chosen.ticket_id] = (len(found), max(0.0, at - now))
            started.began(chosen)
        unit_s = times.unit_s(chosen.work_class)
        policy.granted(chosen, unit_s)
        holding[chosen.work_class] += 1
        heapq.heappush(events, (at + unit_s, next(order), Holder(chosen, 0.0, entry.units_after)))
    return found


class _StartedBackground:
    """How many background tickets are started (holding a slot or between units) as the play goes on:
    a fresh background ticket may start only below the cap (`EngineSlots._eligible`). The cap on threads
    in all needs no check here: it is slots + the background cap, so it binds only when no slot is free."""

    def __init__(self, holders: list[Holder], waiting: list[Queued], cap: int | None) -> None:
        self.cap = cap
        self.count = sum(1 for h in holders if h.waiter.work_class == BACKGROUND)
        self.count += sum(1 for q in waiting if not q.queued and q.waiter.work_class == BACKGROUND)

    def may_run(self, entry: Queued) -> bool:
        if not entry.queued or entry.waiter.work_class != BACKGROUND or self.cap is None:
            return True
        return self.count < self.cap

    def began(self, waiter: Waiter) -> None:
        if waiter.work_class == BACKGROUND:
            self.count += 1

    def ended(self, waiter: Waiter) -> None:
        if waiter.work_class == BACKGROUND:
            self.count -= 1
