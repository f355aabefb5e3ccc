"""A batch or a dub as the API, the UI and the CLI hand it to a backend, and the records it leaves.

`BatchSubmission` is what `ServiceBackend.submit_batch` takes (the local and the distributed backend
alike); `record_batch` is how either stores it before it is queued: one job record and one row an item.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cosyserve.service import wire
from cosyserve.service.batches.inputs import ItemSpec
from cosyserve.service.requests import OutputSpec
from cosyserve.service.stores.batches import BatchStore
from cosyserve.service.stores.jobs import JobRecord, JobStore


@dataclass(frozen=True)
class BatchSubmission:
    """A batch (kind "batch") or a dub (kind "dub") of checked items, the settings they share and the
    uploaded recording they speak in (None: each item's voice, or the shared one)."""

    kind: str
    items: list[ItemSpec]
    shared: dict[str, Any]
    prompt_wav: bytes | None = None


def record_batch(
    jobs: JobStore,
    batches: BatchStore,
    batch: BatchSubmission,
    job_id: str,
    spec: OutputSpec,
    reserved_s: float | None,
) -> JobRecord:
    """Store `batch` as job `job_id` (its shared settings and its item count as the job's parameters) and
    its items as rows; an item with a problem is stored failed at once."""
    record = jobs.create(
        {**batch.shared, "items": len(batch.items)},
        kind=batch.kind,
        owner=spec.owner,
        job_id=job_id,
        spec=wire.encode_job_spec(spec),
        reserved_s=reserved_s,
        prompt_wav=batch.prompt_wav,
    )
    batches.add(job_id, [item.as_row() for item in batch.items])
    return record
