"""The cluster's background tasks per key, in Redis: what `scheduling/key_share.py` decides on.

Two sorted sets, each member `<job id>:<key>` (job ids hold no colon) scored by the time (Redis's clock,
in seconds) it stops counting:

- `cosyserve:background:running`: the jobs a worker has claimed and runs. The worker renews its entries
  with its heartbeat (`renew`, every third of the job lease) and removes each when the job ends however it
  ends (done, failed, cancelled, interrupted); a worker that dies stops renewing, and its entries drop out
  once the job lease has passed, as its jobs' leases do.
- `cosyserve:background:waiting`: the jobs queued and not claimed yet. The API node adds one when it
  sends the task; a worker removes it when it claims the job (or finds it ended) and renews it each time it
  sends the task back to the queue; a cancel removes it. An entry nobody renewed within `waiting_ttl_s` (its
  message lost with an API node that died while sending it, say) stops counting.

Expired entries are pruned by whoever reads. Every call is a round trip or two: callers treat a failure
as "no information" (a job then starts first come, first served), never as a reason to fail the job.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cosyserve.service.distributed.relay import PREFIX

log = logging.getLogger(__name__)

WAITING_TTL_S = 120.0  # a queued task's entry lasts this long unless a worker sees the task again
SETS_TTL_S = 24 * 3600  # both sets vanish from a cluster that stopped using them


@dataclass(frozen=True)
class BackgroundSnapshot:
    """The cluster's background work at one moment: tasks running per key, keys with tasks waiting."""

    running: Mapping[str, int] = field(default_factory=dict)
    waiting: frozenset[str] = frozenset()


class BackgroundShares:
    """Running and waiting background tasks per key in Redis; the running ones this process holds are
    renewed by `renew`. Thread-safe."""

    def __init__(self, client: Any, *, prefix: str = PREFIX, waiting_ttl_s: float = WAITING_TTL_S) -> None:
        self.client = client
        self.running_key = f"{prefix}:background:running"
        self.waiting_key = f"{prefix}:background:waiting"
        self.waiting_ttl_s = waiting_ttl_s
        self._held: dict[str, str] = {}  # job id -> key, the running entries this process renews
        self._lock = threading.Lock()  # a renewal never puts back an entry `finished` just removed

    # -- waiting -----------------------------------------------------------------------------------------

    def queued(self, job_id: str, key: str) -> None:
        """The job's task is (again) in the queue: it counts as waiting for `waiting_ttl_s`."""
        self._add(self.waiting_key, {_member(job_id, key): self._now() + self.waiting_ttl_s})

    def send_counted(self, job_id: str, key: str, send: Callable[[], object]) -> None:
        """`send()` the job's task, counted as waiting for `key` (best effort: Redis away, the send fails
        too and says so); a send that fails uncounts it and raises."""
        try:
            self.queued(job_id, key)
        except Exception as exc:
            log.warning("job %s: not counted as waiting for its key: %s", job_id, exc)
        try:
            send()
        except Exception:
            with contextlib.suppress(Exception):
                self.dropped(job_id, key)
            raise

    def still_queued(self, job_id: str, key: str) -> None:
        """Its task was seen in the queue again: renew its entry if it has one (a claimed or cancelled
        job's task may still go round once; it must not count as waiting again)."""
        self._add(self.waiting_key, {_member(job_id, key): self._now() + self.waiting_ttl_s}, xx=True)

    def dropped(self, job_id: str, key: str) -> None:
        """The job will not run (cancelled, ended, or its task was never sent): no longer waiting."""
        self.client.zrem(self.waiting_key, _member(job_id, key))

    # -- running -----------------------------------------------------------------------------------------

    def started(self, job_id: str, key: str, lease_s: float) -> None:
        """This process claimed the job: it runs (renewed by `renew`) and no longer waits."""
        member = _member(job_id, key)
        with self._lock:
            self._held[job_id] = key
            pipe = self.client.pipeline(transaction=True)
            pipe.zadd(self.running_key, {member: self._now() + lease_s})
            pipe.zrem(self.waiting_key, member)
            pipe.expire(self.running_key, int(SETS_TTL_S))
            pipe.execute()

    def finished(self, job_id: str, key: str) -> None:
        """The job stopped running here (done, failed, cancelled or interrupted)."""
        with self._lock:
            self._held.pop(job_id, None)
            self.client.zrem(self.running_key, _member(job_id, key))

    def renew(self, lease_s: float) -> int:
        """Keep this process's running entries for another `lease_s`; how many it holds."""
        with self._lock:
            if not self._held:
                return 0
            until = self._now() + lease_s
            self._add(self.running_key, {_member(job, key): until for job, key in self._held.items()})
            return len(self._held)

    # -- reading -----------------------------------------------------------------------------------------

    def snapshot(self) -> BackgroundSnapshot:
        """What runs and waits now, per key (expired entries pruned first)."""
        now = self._now()
        pipe = self.client.pipeline(transaction=True)
        pipe.zremrangebyscore(self.running_key, "-inf", now)
        pipe.zremrangebyscore(self.waiting_key, "-inf", now)
        pipe.zrange(self.running_key, 0, -1)
        pipe.zrange(self.waiting_key, 0, -1)
        _, _, running, waiting = pipe.execute()
        return BackgroundSnapshot(
            running=dict(Counter(_key_of(member) for member in running)),
            waiting=frozenset(_key_of(member) for member in waiting),
        )

    # -- internals ---------------------------------------------------------------------------------------

    def _add(self, name: str, scores: dict[str, float], *, xx: bool = False) -> None:
        pipe = self.client.pipeline(transaction=False)
        pipe.zadd(name, scores, xx=xx)
        pipe.expire(name, int(SETS_TTL_S))
        pipe.execute()

    def _now(self) -> float:
        """Redis's clock: every worker scores entries on the same one, whatever its own clock says."""
        seconds, micros = self.client.time()
        return seconds + micros / 1e6


def _member(job_id: str, key: str) -> str:
    return f"{job_id}:{key}"


def _key_of(member: bytes | str) -> str:
    text = member.decode() if isinstance(member, bytes) else member
    return text.split(":", 1)[1] if ":" in text else text
