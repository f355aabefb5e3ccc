"""Where a cold start's time goes: imports, loading or building the weights, placing them (the LM's
layouts, calibrated once per machine), the preset, and the first synthesis (first-call set-up)."""

from __future__ import annotations

import os
from dataclasses import dataclass


def seconds_since_process_start() -> float:
    """Seconds since this process started (Linux: /proc), interpreter start-up and imports included;
    0.0 where unknown."""
    try:
        with open("/proc/self/stat", encoding="ascii") as stat, open("/proc/uptime", encoding="ascii") as up:
            start_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime
            uptime = float(up.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))


@dataclass
class ColdStart:
    imports: float  # process start -> the bench begins (Python, torch, cosyserve)
    load: float = 0.0  # reading (memory-mapping) or building the weights
    place: float = 0.0  # placing them: the LM's layouts (copies) and their calibration
    calibration: float = 0.0  # of `place` and `preset`: measuring kernels (0 when cached)
    preset: float = 0.0  # the fast preset's conversion (with its deviation probe unless --no-deviation)
    first_synthesis: float | None = None  # the warm-up pass: first-call allocations and kernel selection

    def to_dict(self, *, measured_deviation: bool) -> dict[str, float | None]:
        """The phases, and `ready`: imports + load + place (+ the preset when no deviation probe ran
        in it), what a service waits for before it can take requests."""
        ready = self.imports + self.load + self.place + (0.0 if measured_deviation else self.preset)
        return {
            "imports": self.imports,
            "load": self.load,
            "place": self.place,
            "calibration": self.calibration,
            "preset": self.preset,
            "first_synthesis": self.first_synthesis,
            "ready": ready,
        }
