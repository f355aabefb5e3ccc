"""Honest waits: measured unit service times per class, and each queued ticket's place and start time.

`ServiceTimes` keeps a moving average (EWMA) of how long one unit holds an engine slot, per class.
`estimate_waits` plays the queue forward on a copy of the fair policy: slots free when their unit's
expected time is up, a started background ticket comes back for its next unit (as many as its progress
says are left), and each free slot goes to whom the policy would choose. A queued ticket's ETA is the
time it is first granted, its position the number of queued tickets granted before it. Retry-After and
the status API read the same figures.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass

from cosyserve.service.scheduling.fair_policy import CLASSES, FairPolicy, Waiter

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


def units_left(units_done: int, progress: float, typical_units: float) -> int:
    """Units a started ticket still has after the current one: from its progress once it reported some,
    else what a background ticket typically has (`ServiceTimes.typical_units`)."""
    if progress <= 0.0 or units_done <= 0:
        return max(0, round(typical_units) - max(1, units_done))
    return max(0, math.ceil(units_done * (1.0 - progress) / progress) - 1)


def estimate_waits(
    policy: FairPolicy,
    slots: int,
    holders: list[Holder],
    waiting: list[Queued],
    times: ServiceTimes,
    now: float,
) -> dict[str, tuple[int, float]]:
    """For each queued ticket (`Queued.queued`): (position, seconds until its first grant). Tickets the
    play did not reach within `MAX_STEPS` are left out. `policy` is copied, never changed."""
    policy = policy.copy()
    order = itertools.count()
    events: list[tuple[float, int, Holder | None]] = []  # (time a slot frees, tie-breaker, its holder)
    holding = {name: 0 for name in CLASSES}
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
        chosen = policy.choose([q.waiter for q in pool], holding, slots, at)
        if chosen is None:
            later = [t for t, _, h in events if h is not None and t > at]
            if later:  # the slot stays idle until the next unit ends
                heapq.heappush(events, (min(later), next(order), None))
            continue
        entry = next(q for q in pool if q.waiter is chosen)
        pool.remove(entry)
        if entry.queued:
            found[chosen.ticket_id] = (len(found), max(0.0, at - now))
        unit_s = times.unit_s(chosen.work_class)
        policy.granted(chosen, unit_s)
        holding[chosen.work_class] += 1
        heapq.heappush(events, (at + unit_s, next(order), Holder(chosen, 0.0, entry.units_after)))
    return found
