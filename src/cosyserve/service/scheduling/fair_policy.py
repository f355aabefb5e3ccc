"""Who gets the next engine slot: interactive work before background work, keys sharing fairly.

Work is granted the engine one *unit* at a time (a whole interactive request; one segment of a long job,
one item of a batch, one cue of a dub). When a slot frees, the policy picks among the waiting units:

- the class: `interactive` first, unless background work (jobs, batches, dubs) has had less than its
  share (`background_share`) of the engine time both classes used lately (decayed with `SHARE_HALF_LIFE_S`),
  so batches always progress; background units never hold more than `background_slots` slots;
- within a class, the key: start-time fair queueing over engine seconds. Each key has a finish tag (the
  engine seconds it was granted, estimated at the grant and corrected when the unit ends); the key with
  the lowest `max(class clock, finish tag)` goes next, and the class clock moves to the tag granted, so a
  key that was idle banks no credit and one key's 200 items cannot starve another key's one;
- within a key: first come, first served (a ticket between its units keeps its place).

Pure bookkeeping: no threads, no clocks of its own (times are passed in), deterministic for tests.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

WorkClass = Literal["interactive", "background"]
INTERACTIVE: WorkClass = "interactive"
BACKGROUND: WorkClass = "background"
CLASSES: tuple[WorkClass, ...] = (INTERACTIVE, BACKGROUND)
SHARE_HALF_LIFE_S = 30.0  # how fast the engine time each class used is forgotten
ANONYMOUS = ""  # the key of work without an owner


@dataclass(frozen=True)
class FairSettings:
    """How the engine is shared (`QueueSettings`: background_share, background_slots)."""

    background_share: float = 0.1  # least share of engine time background gets while interactive waits
    background_slots: int | None = None  # most slots background units hold at once (None: all)

    def __post_init__(self) -> None:
        if not 0.0 <= self.background_share <= 1.0:
            raise ValueError(f"background_share must be between 0 and 1, got {self.background_share}")
        if self.background_slots is not None and self.background_slots < 1:
            raise ValueError(f"background_slots must be at least 1, got {self.background_slots}")


@dataclass(frozen=True)
class Waiter:
    """A unit waiting for a slot: its ticket's class, key and arrival order."""

    ticket_id: str
    work_class: WorkClass
    key: str
    seq: int


@dataclass
class _ClassState:
    clock: float = 0.0  # the start tag of the last unit granted in this class
    finish: dict[str, float] = field(default_factory=dict)  # key -> engine seconds granted (its tag)
    used_s: float = 0.0  # decayed engine seconds this class used


class FairPolicy:
    """Chooses the next waiter; `granted` / `settled` keep the books (see the module docstring)."""

    def __init__(self, settings: FairSettings | None = None) -> None:
        self.settings = settings or FairSettings()
        self._classes = {name: _ClassState() for name in CLASSES}
        self._decayed_at: float | None = None

    def copy(self) -> FairPolicy:
        """An independent copy (the wait estimate plays the future on it)."""
        twin = FairPolicy(self.settings)
        twin._decayed_at = self._decayed_at
        for name, state in self._classes.items():
            twin._classes[name] = _ClassState(state.clock, dict(state.finish), state.used_s)
        return twin

    # -- choosing -----------------------------------------------------------------------------------------

    def choose(
        self, waiters: Iterable[Waiter], holding: Mapping[str, int], slots: int, now: float
    ) -> Waiter | None:
        """The waiter to grant a free slot to (None: nobody may have it). `holding`: slots each class
        holds now; `slots`: the engine's slots in all."""
        by_class: dict[str, list[Waiter]] = {name: [] for name in CLASSES}
        for waiter in waiters:
            by_class[waiter.work_class].append(waiter)
        limit = self.settings.background_slots
        if limit is not None and holding.get(BACKGROUND, 0) >= min(limit, slots):
            by_class[BACKGROUND] = []
        for name in self._class_order(now):
            if by_class[name]:
                return self._next_in_class(name, by_class[name])
        return None

    def _class_order(self, now: float) -> tuple[WorkClass, WorkClass]:
        self._decay(now)
        interactive, background = (self._classes[name].used_s for name in CLASSES)
        total = interactive + background
        if total > 0 and background < self.settings.background_share * total:
            return (BACKGROUND, INTERACTIVE)
        return (INTERACTIVE, BACKGROUND)

    def _next_in_class(self, name: WorkClass, waiters: list[Waiter]) -> Waiter:
        state = self._classes[name]

        def order(waiter: Waiter) -> tuple[float, int]:
            return (max(state.clock, state.finish.get(waiter.key, 0.0)), waiter.seq)

        return min(waiters, key=order)

    # -- the books ----------------------------------------------------------------------------------------

    def granted(self, waiter: Waiter, estimate_s: float) -> None:
        """`waiter` got a slot for a unit expected to take `estimate_s` engine seconds."""
        state = self._classes[waiter.work_class]
        tag = max(state.clock, state.finish.get(waiter.key, 0.0))
        state.clock = tag
        state.finish[waiter.key] = tag + max(0.0, estimate_s)

    def settled(self, waiter: Waiter, estimate_s: float, actual_s: float, now: float) -> None:
        """The unit granted with `estimate_s` ended after `actual_s`: correct the key's tag, count the
        class's use."""
        state = self._classes[waiter.work_class]
        if waiter.key in state.finish:
            state.finish[waiter.key] = max(state.clock, state.finish[waiter.key] + actual_s - estimate_s)
        self._decay(now)
        state.used_s += max(0.0, actual_s)

    def forget(self, keys_active: Iterable[tuple[str, str]]) -> None:
        """Drop the tags of keys with nothing queued or running once their class's clock passed them
        (such a tag changes nothing any more: the key starts from the clock)."""
        active = set(keys_active)
        for name, state in self._classes.items():
            state.finish = {
                k: tag for k, tag in state.finish.items() if (name, k) in active or tag > state.clock
            }

    def used_share(self, now: float) -> dict[str, float]:
        """Each class's share of the engine time used lately (for stats)."""
        self._decay(now)
        total = sum(state.used_s for state in self._classes.values())
        return {name: (state.used_s / total if total else 0.0) for name, state in self._classes.items()}

    def _decay(self, now: float) -> None:
        if self._decayed_at is not None and now > self._decayed_at:
            factor = math.exp(-(now - self._decayed_at) * math.log(2) / SHARE_HALF_LIFE_S)
            for state in self._classes.values():
                state.used_s *= factor
        if self._decayed_at is None or now > self._decayed_at:
            self._decayed_at = now
