"""Quotas that hold for jobs: a job reserves its estimated audio seconds when it is submitted (under its
own id, in the shared reservation ledger: `access.quota`), is charged segment by segment (or item by
item) against that reservation as it runs, and stops with `quota_exceeded` once its key's daily quota is
used up, keeping what it finished. What it still holds is released when its record ends.

A job whose estimate does not fit beside the key's usage and other reservations is refused at submit;
one whose key's day is used up as its turn comes (an admin lowered the quota below the usage, say) fails
before making anything. A job is stopped only between segments: past its estimate, the overshoot is at
most one segment's audio.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cosyserve.service.access.estimate import estimate_audio_s
from cosyserve.service.access.principals import QuotaExceeded
from cosyserve.service.access.quota import QuotaTracker
from cosyserve.service.access.quota_days import seconds_until_reset
from cosyserve.service.stores.jobs import JobStore
from cosyserve.service.stores.keys import ApiKey

__all__ = ["JobQuota", "estimate_audio_s"]


@dataclass(frozen=True)
class JobQuota:
    """The quota side of running jobs for keys (jobs without a key are never limited)."""

    quota: QuotaTracker
    jobs: JobStore
    key_lookup: Callable[[int], ApiKey | None]  # a key by id (None: revoked or deleted)

    def charge(self, key_id: int | None, job_id: str, seconds: float) -> bool:
        """Charge `seconds` of audio to the job's key against its reservation; False once the key's quota
        is used up. A job that already ended is charged nothing (what it made is not kept)."""
        if not self.jobs.charge(job_id, seconds):
            return True  # the work stops on its own: its ticket ended
        key = self.key_lookup(key_id) if key_id is not None else None
        if key is None:
            return True
        self.quota.settle_part(job_id, key, seconds)
        return not self.quota.used_up(key, job_id)

    def refund_discarded(self, key_id: int | None, job_id: str, keep_s: float = 0.0) -> float:
        """An attempt starts the job over (or goes on after `keep_s` seconds of audio earlier attempts made
        and kept): what else they were charged made audio nobody gets, so it is taken off the key's usage
        and back into the job's reservation; returns the seconds."""
        seconds = self.jobs.take_charged(job_id, keep_s)
        key = self.key_lookup(key_id) if key_id is not None else None
        if seconds > 0 and key is not None:
            self.quota.refund_part(job_id, key, seconds)
        return seconds

    def allows_id(self, key_id: int | None, job_id: str | None = None) -> bool:
        """Whether the job's key has quota left on the day that admitted the job (today without it)."""
        key = self.key_lookup(key_id) if key_id is not None else None
        return key is None or not self.quota.used_up(key, job_id)

    def exceeded(self, key_id: int | None, *, started: bool = True) -> QuotaExceeded:
        """The error a job stops with when its key's quota ran out (`started`: while it ran; else before
        it made anything: used up, or lowered below the usage, while it waited)."""
        key = self.key_lookup(key_id) if key_id is not None else None
        status = self.quota.check(key) if key is not None else None
        limit = f"{status.limit_s:g} s " if status is not None and status.limit_s else ""
        resets = seconds_until_reset()
        if not started:
            return QuotaExceeded(
                f"the key's daily audio quota {limit}was used up while the job waited: nothing was made or "
                "charged; submit it again after 00:00 UTC or with a larger quota",
                max(1, resets),
            )
        return QuotaExceeded(
            f"the key's daily audio quota {limit}ran out while the job ran: what it finished is kept and "
            "downloadable; the rest can run after 00:00 UTC or with a larger quota",
            max(1, resets),
        )
