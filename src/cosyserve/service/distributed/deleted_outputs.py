"""Outputs deleted anywhere in a cluster leave no copy behind on the node that made them.

A result lives on the worker that made it and in the bucket (API nodes read through it). Deleting it
through an API node (`DELETE /v1/outputs/{id}`, the web UI's history) removes the bucket's copy and the
API node's, but the worker's copy stayed on its disk until retention, days later: a cloned voice's audio
its owner had deleted. So each deletion leaves a tombstone in Redis (`cosyserve:deleted-outputs`, a sorted
set of output ids by when), and every worker's heartbeat removes its own copies of the outputs named
there since it last looked (all of them when it starts). Tombstones are kept `KEEP_S`: a worker away
longer than that removes its copies by retention instead.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from cosyserve.service.distributed.relay import PREFIX

log = logging.getLogger(__name__)

KEY = f"{PREFIX}:deleted-outputs"
KEEP_S = 30 * 86400.0


class DeletedOutputs:
    """The cluster's tombstones of deleted outputs, in Redis."""

    def __init__(self, client: Any, *, clock: Callable[[], float] = time.time) -> None:
        self.client = client
        self._clock = clock

    def note(self, output_id: str) -> None:
        """Record a deletion (and forget those older than KEEP_S)."""
        now = self._clock()
        pipe = self.client.pipeline(transaction=False)
        pipe.zadd(KEY, {output_id: now})
        pipe.zremrangebyscore(KEY, "-inf", now - KEEP_S)
        pipe.execute()

    def note_quietly(self, output_id: str) -> None:
        """`note`, logging instead of failing: the deletion itself has happened."""
        try:
            self.note(output_id)
        except Exception as exc:  # the worker's copy then goes at retention
            log.warning("could not tell the workers that output %s was deleted: %s", output_id, exc)

    def since(self, when: float) -> list[tuple[str, float]]:
        """(output id, when deleted) of the deletions at or after `when`, oldest first."""
        rows = self.client.zrangebyscore(KEY, when, "+inf", withscores=True)
        return [(_text(member), float(score)) for member, score in rows]


class DeletedOutputSweep:
    """On a worker: removes its copies of outputs deleted through other nodes."""

    def __init__(self, tombstones: DeletedOutputs, drop_local: Callable[[str], bool]) -> None:
        self.tombstones = tombstones
        self.drop_local = drop_local  # OutputStore.drop_local
        self.after = 0.0  # the newest tombstone seen (a start looks at every one kept)

    def sweep(self) -> int:
        """Remove the copies named by tombstones since the last sweep; returns how many were here."""
        removed = 0
        for output_id, when in self.tombstones.since(self.after):
            if self.drop_local(output_id):
                removed += 1
            self.after = max(self.after, when)  # inclusive next time: a tie is looked at twice, harmlessly
        if removed:
            log.info("removed this worker's copies of %d outputs deleted through another node", removed)
        return removed


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
