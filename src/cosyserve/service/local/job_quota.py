"""Quotas that hold for jobs: a job sets aside its estimated audio seconds when it is submitted, is charged
segment by segment (or item by item) as it runs, and stops with `quota_exceeded` once its key's daily
quota is used up, keeping what it finished.

The set-aside seconds (`jobs.reserved_s`, less what was charged since) count against the key when its
next job is submitted, so several jobs queued at once cannot promise more audio than the quota has left.
A job is stopped only between segments: the overshoot is at most one segment's audio.
"""

from __future__ import annotations

import time
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass

from cosyserve.service.access.limits import QuotaTracker
from cosyserve.service.access.principals import QuotaExceeded
from cosyserve.service.stores.jobs import JobStore
from cosyserve.service.stores.keys import ApiKey

CJK_SECONDS_PER_CHAR = 0.25  # a Chinese/Japanese/Korean character: about a syllable
OTHER_SECONDS_PER_CHAR = 0.07  # a letter or digit of other scripts: about 14 per second of speech


def estimate_audio_s(text: str) -> float:
    """Roughly how many seconds of speech `text` makes (for reservations, not for billing)."""
    seconds = 0.0
    for char in text:
        if unicodedata.east_asian_width(char) in ("W", "F") and char.isalnum():
            seconds += CJK_SECONDS_PER_CHAR
        elif char.isalnum():
            seconds += OTHER_SECONDS_PER_CHAR
    return round(seconds, 1)


@dataclass(frozen=True)
class JobQuota:
    """The quota side of running jobs for keys (jobs without a key are never limited)."""

    quota: QuotaTracker
    jobs: JobStore
    key_lookup: Callable[[int], ApiKey | None]  # a key by id (None: revoked or deleted)

    def admit(self, key: ApiKey | None, owner: str | None) -> None:
        """QuotaExceeded when `key`'s quota has nothing left once its queued and running jobs' set-aside
        seconds are counted."""
        if key is None:
            return
        status = self.quota.check(key)
        if status.limit_s is None:
            return
        reserved = self.jobs.reserved_s(owner) if owner else 0.0
        if status.used_s + reserved >= status.limit_s:
            raise QuotaExceeded(
                f"the daily audio quota of {status.limit_s:g} s is used up ({status.used_s:.1f} s used "
                f"today, {reserved:.1f} s set aside by this key's unfinished jobs): it resets at 00:00 UTC",
                max(1, int(status.resets_at - time.time())),
            )

    def charge(self, key_id: int | None, job_id: str, seconds: float) -> bool:
        """Charge `seconds` of audio to the job's key; False once the key's quota is used up."""
        self.jobs.charge(job_id, seconds)
        key = self.key_lookup(key_id) if key_id is not None else None
        if key is None:
            return True
        self.quota.add(key, seconds)
        return self.allows(key)

    def allows_id(self, key_id: int | None) -> bool:
        key = self.key_lookup(key_id) if key_id is not None else None
        return key is None or self.allows(key)

    def allows(self, key: ApiKey) -> bool:
        status = self.quota.check(key)
        return status.limit_s is None or status.used_s < status.limit_s

    def exceeded(self, key_id: int | None) -> QuotaExceeded:
        """The error a job stops with when its key's quota ran out."""
        key = self.key_lookup(key_id) if key_id is not None else None
        status = self.quota.check(key) if key is not None else None
        limit = f"{status.limit_s:g} s " if status is not None and status.limit_s else ""
        resets = int(status.resets_at - time.time()) if status is not None else 3600
        return QuotaExceeded(
            f"the key's daily audio quota {limit}ran out while the job ran: what it finished is kept and "
            "downloadable; the rest can run after 00:00 UTC or with a larger quota",
            max(1, resets),
        )
