"""Background work whose worker died and whose task message is gone is found from the jobs table.

The jobs table, not the queue, says what must run. A worker that dies stops renewing its job's lease, and
Redis hands the late-acknowledged message to another worker after `visibility_timeout_s`. That message can
be lost: Redis restarted without persistence, or kombu dropped it (a message restored while its first
consumer still ran keeps its delivery tag, and acknowledging either copy removes the other's entry: a
batch whose worker was killed once stayed "running" for good in the cluster test).

So workers look, about once a lease (one of them per turn, by a Redis key), for running jobs whose lease ran
out more than a lease ago and that no live worker says it runs (leases are wall-clock times: a host whose
clock runs ahead, or jumped, would otherwise take a live worker's job from it; heartbeats are Redis
expiries, which no host's clock moves):
- a batch or a dub (everything it needs is in the database) has its task sent again, at most once per
  attempt within `visibility_timeout_s`. A copy too many is harmless: a claim takes a job once (the
  attempt is the lock), and a task finding its job taken or ended does nothing;
- a long-text job's message carries its request (the prompt recording too), which is nowhere else: once
  even kombu's redelivery would have come (`visibility_timeout_s` and a restore sweep after the lease), it
  fails with `worker_lost`, saying to submit it again, instead of staying "running" for ever.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from cosyserve.errors import JobStateError
from cosyserve.service.distributed.relay import PREFIX
from cosyserve.service.stores.job_table import JobRecord, utc_now
from cosyserve.service.stores.jobs import JobStore

log = logging.getLogger(__name__)

WORKER_LOST = "worker_lost"


@dataclass(frozen=True)
class SweepResult:
    resent: list[str] = field(default_factory=list)  # batches and dubs whose task was sent again
    failed: list[str] = field(default_factory=list)  # long-text jobs that could not be sent again


class LostJobSweep:
    """Finds running jobs nobody holds any more and sends them again or ends them. Thread-safe."""

    def __init__(
        self,
        jobs: JobStore,
        client: Any,
        resend: Callable[[JobRecord], None],
        *,
        lease_s: float,
        visibility_timeout_s: float,
        restore_interval_s: float = 10.0,
        released: Callable[[str], None] = lambda job_id: None,
        running_elsewhere: Callable[[], Collection[str]] = frozenset,
        clock: Callable[[], datetime] = utc_now,
        prefix: str = PREFIX,
    ) -> None:
        self.jobs = jobs
        self.client = client  # redis-py: the sweep's turn and what it sent
        self.resend = resend  # sends a batch's or a dub's task again
        self.released = released  # gives back what a failed job held (its quota reservation)
        self.running_elsewhere = running_elsewhere  # ids of the jobs live workers run (their heartbeats)
        self.lease_s = lease_s
        self.visibility_timeout_s = visibility_timeout_s
        self.restore_interval_s = restore_interval_s  # how often kombu looks for unacknowledged messages
        self.clock = clock
        self.turn_key = f"{prefix}:lost-jobs:turn"
        self.sent_prefix = f"{prefix}:lost-jobs:sent"

    def maybe_sweep(self) -> SweepResult:
        """Sweep if no worker swept in the last lease; what was sent again or ended."""
        turn_ms = max(1000, int(self.lease_s * 1000))
        if not self.client.set(self.turn_key, "1", nx=True, px=turn_ms):
            return SweepResult()
        return self.sweep()

    def sweep(self) -> SweepResult:
        now = self.clock()
        result = SweepResult()
        give_up = now - timedelta(seconds=self.visibility_timeout_s + self.restore_interval_s + self.lease_s)
        expired = self.jobs.lease_expired(now - timedelta(seconds=self.lease_s))
        alive = set(self.running_elsewhere()) if expired else set()
        for record in expired:
            if record.id in alive:
                self._clocks_differ(record)
                continue
            if record.kind == "tts":
                if record.lease_until is not None and record.lease_until < give_up:
                    self._fail(record, result)
            elif self._first_send(record):
                log.warning(
                    "job %s (%s, attempt %d): its worker stopped and no worker took it again; its task is "
                    "sent again",
                    record.id,
                    record.kind,
                    record.attempt,
                )
                self.resend(record)
                result.resent.append(record.id)
        return result

    def _clocks_differ(self, record: JobRecord) -> None:
        """A live worker runs a job whose lease looks long over: this host's clock and that worker's
        disagree (once per attempt in the log, as `_first_send` counts)."""
        if self.client.set(f"{self.sent_prefix}:skew:{record.id}:{record.attempt}", "1", nx=True, ex=3600):
            log.warning(
                "job %s: its lease ran out at %s by this host's clock, but worker %s still runs it: are the "
                "hosts' clocks in step (NTP)? It is left to that worker",
                record.id,
                record.lease_until,
                record.worker or "unknown",
            )

    def _first_send(self, record: JobRecord) -> bool:
        """Whether this attempt's task was not sent again within `visibility_timeout_s` (then it is now)."""
        key = f"{self.sent_prefix}:{record.id}:{record.attempt}"
        return bool(self.client.set(key, "1", nx=True, ex=max(1, int(self.visibility_timeout_s))))

    def _fail(self, record: JobRecord, result: SweepResult) -> None:
        message = (
            f"the worker running this job stopped (last seen {record.worker or 'unknown'}) and its task was "
            "lost with it, so no worker can go on with it: submit the job again"
        )
        try:
            self.jobs.finish_failed(record.id, WORKER_LOST, message, attempt=record.attempt)
        except JobStateError:  # taken again or ended meanwhile
            return
        log.warning("job %s: %s", record.id, message)
        self.released(record.id)
        result.failed.append(record.id)
