"""Time zones for what people read: output file names in the zone the operator lives in.

`output_timezone("local")` is this machine's zone, `"UTC"` is UTC, anything else an IANA name such as
`Asia/Shanghai` (users of the Chinese deployment guides read Beijing time). The sidecar of every output
records the UTC instant as well, so nothing depends on the zone the name was written in.
"""

from __future__ import annotations

from datetime import datetime, timezone, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError


def output_timezone(name: str | None) -> tzinfo | None:
    """The zone for `name`; None stands for the machine's local zone. ValueError for an unknown name."""
    key = (name or "local").strip()
    if key.lower() == "local":
        return None
    if key.upper() in ("UTC", "Z", "GMT"):
        return timezone.utc
    try:
        return ZoneInfo(key)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(
            f"unknown time zone {name!r}: use local, UTC or a name such as Asia/Shanghai or Europe/Berlin"
        ) from exc


def local_datetime(unix_s: float, zone: tzinfo | None) -> datetime:
    """`unix_s` as an aware datetime in `zone` (None: the machine's local zone)."""
    return datetime.fromtimestamp(unix_s, timezone.utc).astimezone(zone)
