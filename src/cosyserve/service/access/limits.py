"""Per-key limits: a rate limit (token buckets in memory) and a daily audio quota (in the database).

`RateLimiter` answers "may this key make another request now?"; `QuotaTracker` (`access.quota`) counts
the seconds of audio each key produced per UTC day and holds what admitted work reserved, so the daily
allowance is never promised twice.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from cosyserve.service.access.quota import QuotaStatus, QuotaTracker, audio_usage_table
from cosyserve.service.stores.keys import ApiKey

__all__ = ["QuotaStatus", "QuotaTracker", "RateLimiter", "audio_usage_table"]


class RateLimiter:
    """Token buckets per key: up to a minute's allowance at once, refilled continuously. Thread-safe.

    A key's own `rate_limit_per_minute` wins over `default_per_minute`; None or 0 means unlimited.
    Strings (e.g. "ip:1.2.3.4" for anonymous callers) get the default. Reads (`read=True`: a client
    polling its job, listing its files) draw on a bucket of their own, `READS_PER_REQUEST` times the size,
    so that polling never uses up the requests that submit work.
    """

    MAX_BUCKETS = 10_000  # beyond this, full (idle) buckets are forgotten
    READS_PER_REQUEST = 10

    def __init__(self, default_per_minute: float | None = 60, *, clock: Callable[[], float] = time.monotonic):
        self.default_per_minute = default_per_minute
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float, float]] = {}  # id -> (tokens, updated at, capacity)

    def limit_for(self, key: ApiKey | str, *, read: bool = False) -> float | None:
        own = key.rate_limit_per_minute if isinstance(key, ApiKey) else None
        limit = own if own is not None else self.default_per_minute
        if not limit:
            return None
        return limit * self.READS_PER_REQUEST if read else limit

    def acquire(self, key: ApiKey | str, cost: float = 1.0, *, read: bool = False) -> float:
        """0.0 if the request may go ahead (its cost is taken); otherwise the seconds to wait before it
        would be allowed (nothing is taken)."""
        per_minute = self.limit_for(key, read=read)
        if per_minute is None:
            return 0.0
        bucket_id = f"key:{key.id}" if isinstance(key, ApiKey) else key
        if read:
            bucket_id += ":reads"
        capacity, per_second = float(per_minute), per_minute / 60.0
        cost = min(cost, capacity)
        with self._lock:
            now = self._clock()
            tokens, updated, was = self._buckets.get(bucket_id, (capacity, now, capacity))
            if was != capacity:  # an admin changed the limit: what was used still counts, the rest is new
                tokens = max(0.0, capacity - (was - tokens))
            tokens = min(capacity, tokens + (now - updated) * per_second)
            if tokens >= cost:
                self._buckets[bucket_id] = (tokens - cost, now, capacity)
                retry_after = 0.0
            else:
                self._buckets[bucket_id] = (tokens, now, capacity)
                retry_after = (cost - tokens) / per_second
            if len(self._buckets) > self.MAX_BUCKETS:
                self._forget_idle(now)
        return retry_after

    def _forget_idle(self, now: float) -> None:
        # An idle bucket has refilled; dropping it changes nothing. 60 s refills any limit >= 1/min.
        for bucket_id in [b for b, (_, updated, _c) in self._buckets.items() if now - updated > 60.0]:
            del self._buckets[bucket_id]
