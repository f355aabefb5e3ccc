"""How far a batch (or a dub) got: its counts, progress, place in the queue and estimated time left, the
same for the API and the web UI."""

from __future__ import annotations

from dataclasses import dataclass

from cosyserve.service.scheduling.scheduler import Scheduler
from cosyserve.service.stores.batches import BatchCounts, BatchStore
from cosyserve.service.stores.jobs import JobRecord


@dataclass(frozen=True)
class BatchStatus:
    record: JobRecord
    counts: BatchCounts
    progress: float  # 0 to 1
    position: int | None  # in the queue (0: next); None once started
    time_left_s: float | None  # from the items done so far (None: none done yet, or it ended)


def batch_status(batches: BatchStore, scheduler: Scheduler, record: JobRecord) -> BatchStatus:
    counts = batches.counts(record.id)
    progress, position, left = record.progress, None, None
    if not record.is_terminal:
        if counts.mean_run_s is not None:
            left = (counts.queued + counts.running) * counts.mean_run_s
        ticket = scheduler.get(record.id)
        if ticket is not None:
            progress = max(progress, ticket.progress)
            position = ticket.position
            if position is not None and left is not None:
                left += ticket.estimated_wait_s()
    elif record.state == "done":
        progress = 1.0
    return BatchStatus(
        record, counts, round(progress, 4), position, round(left, 1) if left is not None else None
    )
