"""The UTC days quotas count in, and what a refusal says: when to come back (soon, when only the key's own
work in flight holds the rest; at 00:00 UTC, when the day is spent)."""

from __future__ import annotations

import math
import time
from datetime import datetime, timezone

from cosyserve.service.access.principals import QuotaExceeded

HELD_RETRY_AFTER_S = 5  # refused only by what the key's own running work holds: it settles or frees soon


def exceeded(limit: float, used: float, held: float, needed: float, now: float) -> QuotaExceeded:
    """The refusal of `needed` seconds beside `used` and `held` under `limit`."""
    held_text = f", {held:.1f} s reserved by requests and jobs still running" if held > 0.05 else ""
    left = max(0.0, limit - used - held)
    said = (
        f"the daily audio quota of {limit:g} s has {left:.1f} s left ({used:.1f} s used today{held_text}); "
    )
    if used + needed <= limit:  # it fits once the key's own running work has ended: no need to wait a day
        return QuotaExceeded(
            f"{said}this needs about {needed:.1f} s: retry once the key's running work has finished (or "
            "send less text)",
            HELD_RETRY_AFTER_S,
            held_only=True,
        )
    return QuotaExceeded(
        f"{said}this needs about {needed:.1f} s: send less text (a shorter one; a batch or dub of fewer "
        "items), wait for running work to finish, or retry after 00:00 UTC",
        seconds_until_reset(now),
    )


def seconds_until_reset(now: float | None = None) -> int:
    """Retry-After for a used-up day: whole seconds, rounded up (a client that waits that long is past
    00:00 UTC)."""
    now = time.time() if now is None else now
    return max(1, math.ceil(resets_at(now) - now))


def utc_day(now: float) -> str:
    """The UTC date of unix time `now`, YYYY-MM-DD: the day a quota counts in."""
    return datetime.fromtimestamp(now, timezone.utc).strftime("%Y-%m-%d")


def resets_at(now: float) -> float:
    """Unix time of the next 00:00 UTC after `now`."""
    start = datetime.fromtimestamp(now, timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    return start.timestamp() + 86400.0
