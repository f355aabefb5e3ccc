"""How long a process took to get ready: imports, model load, and its first synthesis, each logged once.

Times are counted from the process's own start (read from /proc where there is one), so interpreter
start-up and imports are included: the figure an operator waits for.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

log = logging.getLogger("cosyserve.startup")


def process_started_monotonic() -> float:
    """`time.monotonic()` at this process's start (Linux: /proc/self/stat); now where unknown."""
    now = time.monotonic()
    try:
        with open("/proc/self/stat", encoding="ascii") as stat, open("/proc/uptime", encoding="ascii") as up:
            start_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime
            uptime_s = float(up.read().split()[0])
        age = uptime_s - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return now
    return now - max(0.0, age)


class StartupClock:
    """Phases of getting ready, as seconds since the process started; thread-safe, each logged once."""

    def __init__(self, started: float | None = None) -> None:
        self.started = process_started_monotonic() if started is None else started
        self._marks: dict[str, float] = {}
        self._lock = threading.Lock()

    def since_start(self) -> float:
        return round(time.monotonic() - self.started, 2)

    def mark(self, phase: str, **figures: Any) -> bool:
        """Record that `phase` ended now (with extra figures to log); False if it was recorded before."""
        with self._lock:
            if phase in self._marks:
                return False
            self._marks[phase] = self.since_start()
        details = "".join(f", {name} {value}" for name, value in figures.items())
        log.info("start-up: %s at %.2f s after the process started%s", phase, self._marks[phase], details)
        return True

    def first_synthesis(self, compute_s: float, audio_s: float) -> None:
        """The first synthesis after start (a cold one: kernels and memory are set up on first use)."""
        self.mark("first synthesis done", compute_s=round(compute_s, 2), audio_s=round(audio_s, 2))

    def as_dict(self) -> dict[str, float]:
        with self._lock:
            return dict(self._marks)
