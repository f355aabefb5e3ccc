"""Times as the UI shows them: in the operator's zone (`--timezone`, the zone output file names are
written in), so a result's row, its day filter and its file name agree whatever the browser's or the
machine's zone."""

from __future__ import annotations

import time
from datetime import datetime, timezone, tzinfo


def local_text(unix_s: float, zone: tzinfo | None, fmt: str) -> str:
    """`unix_s` formatted with `fmt` in `zone` (None: this machine's local zone)."""
    return datetime.fromtimestamp(unix_s, timezone.utc).astimezone(zone).strftime(fmt)


def zone_name(zone: tzinfo | None) -> str:
    """How a column header names `zone`: its IANA name, UTC, or the machine's zone abbreviation."""
    if zone is None:
        return time.strftime("%Z") or "local"
    return str(getattr(zone, "key", None) or zone.tzname(None) or "UTC")
