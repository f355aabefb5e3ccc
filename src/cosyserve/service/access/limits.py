"""Per-key limits: a rate limit (token buckets in memory) and a daily audio quota (in the database).

`RateLimiter` answers "may this key make another request now?"; `QuotaTracker` counts the seconds of
audio each key produced per UTC day (the `audio_usage` table, so the count survives restarts and is shared
by every node) and answers "is today's allowance used up?".
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from cosyserve.errors import InputError
from cosyserve.service.stores.db import create_tables, table
from cosyserve.service.stores.keys import ApiKey


def audio_usage_table(metadata: sa.MetaData) -> sa.Table:
    return table(
        metadata,
        "audio_usage",
        sa.Column("key_id", sa.Integer, primary_key=True),
        sa.Column("day", sa.String(10), primary_key=True),  # UTC date, YYYY-MM-DD
        sa.Column("seconds", sa.Float, nullable=False),
    )


class RateLimiter:
    """Token buckets per key: up to a minute's allowance at once, refilled continuously. Thread-safe.

    A key's own `rate_limit_per_minute` wins over `default_per_minute`; None or 0 means unlimited.
    Strings (e.g. "ip:1.2.3.4" for anonymous callers) get the default.
    """

    MAX_BUCKETS = 10_000  # beyond this, full (idle) buckets are forgotten

    def __init__(self, default_per_minute: float | None = 60, *, clock: Callable[[], float] = time.monotonic):
        self.default_per_minute = default_per_minute
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float]] = {}  # id -> (tokens, updated at)

    def limit_for(self, key: ApiKey | str) -> float | None:
        own = key.rate_limit_per_minute if isinstance(key, ApiKey) else None
        limit = own if own is not None else self.default_per_minute
        return limit or None

    def acquire(self, key: ApiKey | str, cost: float = 1.0) -> float:
        """0.0 if the request may go ahead (its cost is taken); otherwise the seconds to wait before it
        would be allowed (nothing is taken)."""
        per_minute = self.limit_for(key)
        if per_minute is None:
            return 0.0
        bucket_id = f"key:{key.id}" if isinstance(key, ApiKey) else key
        capacity, per_second = float(per_minute), per_minute / 60.0
        cost = min(cost, capacity)
        with self._lock:
            now = self._clock()
            tokens, updated = self._buckets.get(bucket_id, (capacity, now))
            tokens = min(capacity, tokens + (now - updated) * per_second)
            if tokens >= cost:
                self._buckets[bucket_id] = (tokens - cost, now)
                retry_after = 0.0
            else:
                self._buckets[bucket_id] = (tokens, now)
                retry_after = (cost - tokens) / per_second
            if len(self._buckets) > self.MAX_BUCKETS:
                self._forget_idle(now)
        return retry_after

    def _forget_idle(self, now: float) -> None:
        # An idle bucket has refilled; dropping it changes nothing. 60 s refills any limit >= 1/min.
        for bucket_id in [b for b, (_, updated) in self._buckets.items() if now - updated > 60.0]:
            del self._buckets[bucket_id]


@dataclass(frozen=True)
class QuotaStatus:
    allowed: bool
    used_s: float  # audio seconds already produced today (UTC)
    limit_s: float | None  # None: unlimited
    remaining_s: float | None
    resets_at: float  # unix time of the next UTC midnight


class QuotaTracker:
    """Seconds of audio produced per key per UTC day, in the `audio_usage` table (survives restarts).

    `check` before synthesis with an estimate, `add` the real duration after. Two requests checked at
    the same moment can both pass; the overshoot is at most one request's audio.
    """

    def __init__(
        self,
        engine: sa.Engine,
        metadata: sa.MetaData,
        *,
        default_daily_seconds: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.engine = engine
        self.table = audio_usage_table(metadata)
        create_tables(engine, self.table)
        self.default_daily_seconds = default_daily_seconds
        self._clock = clock

    def check(self, key: ApiKey, needed_s: float = 0.0) -> QuotaStatus:
        own = key.daily_audio_seconds_quota
        limit = own if own is not None else self.default_daily_seconds
        now = self._clock()
        used = self.used(key, now=now)
        day_start = datetime.fromtimestamp(now, timezone.utc).replace(
            hour=0, minute=0, second=0, microsecond=0
        )
        resets_at = day_start.timestamp() + 86400.0
        if not limit:
            return QuotaStatus(True, used, None, None, resets_at)
        return QuotaStatus(used + needed_s <= limit, used, limit, max(0.0, limit - used), resets_at)

    def used(self, key: ApiKey | int, *, now: float | None = None) -> float:
        """Seconds used today (UTC) by `key`."""
        conditions = self._where(key, self._clock() if now is None else now)
        with self.engine.connect() as conn:
            value = conn.execute(sa.select(self.table.c.seconds).where(*conditions)).scalar()
        return float(value or 0.0)

    def add(self, key: ApiKey | int, seconds: float) -> float:
        """Count `seconds` of produced audio for today; returns today's new total."""
        if seconds < 0:
            raise InputError(f"audio seconds to add must be >= 0, got {seconds}")
        now = self._clock()
        conditions = self._where(key, now)
        for _ in range(3):  # the insert can race with another process's insert; then update its row
            try:
                with self.engine.begin() as conn:
                    update = self.table.update().where(*conditions)
                    if not conn.execute(update.values(seconds=self.table.c.seconds + seconds)).rowcount:
                        row = {"key_id": _key_id(key), "day": _day(now), "seconds": seconds}
                        conn.execute(self.table.insert().values(**row))
            except IntegrityError:
                continue
            return self.used(key, now=now)
        raise InputError("could not record audio usage (database busy); try again")

    def _where(self, key: ApiKey | int, now: float) -> tuple[sa.ColumnElement[bool], ...]:
        return (self.table.c.key_id == _key_id(key), self.table.c.day == _day(now))


def _key_id(key: ApiKey | int) -> int:
    return key.id if isinstance(key, ApiKey) else int(key)


def _day(now: float) -> str:
    return datetime.fromtimestamp(now, timezone.utc).strftime("%Y-%m-%d")
