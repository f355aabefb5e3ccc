"""What a batch or a dub looks like to its client: state, counts, time left, items, signed links.

Shared by the batch and dub routers (and the web UI, through its bridge): a batch is a job of kind "batch"
or "dub" whose items are in the batch store.
"""

from __future__ import annotations

from typing import Any

from cosyserve.api.batch_schemas import BatchItemView, BatchView
from cosyserve.api.jobs import partial_view
from cosyserve.api.schemas import JobError
from cosyserve.service.access.principals import Principal
from cosyserve.service.assembly import Service
from cosyserve.service.batches.dub_timeline import placement
from cosyserve.service.batches.status import batch_status
from cosyserve.service.local.voice_pins import SNAPSHOTS
from cosyserve.service.quality.reporting import needs_listen
from cosyserve.service.stores.batches import BatchItem
from cosyserve.service.stores.jobs import JobNotFound, JobRecord

BATCH_KINDS = ("batch", "dub")


def own_batch(
    service: Service, principal: Principal, batch_id: str, kinds: tuple[str, ...] = BATCH_KINDS
) -> JobRecord:
    """The caller's batch (admins: anyone's); JobNotFound otherwise (someone else's looks absent)."""
    record = service.jobs.get(batch_id)
    if record is None or record.kind not in kinds or not principal.may_see(record.owner):
        noun = "dub" if kinds == ("dub",) else "batch"
        raise JobNotFound(f"no {noun} {batch_id!r}: list yours with GET /v1/batches")
    return record


def batch_view(service: Service, record: JobRecord, *, offset: int = 0, limit: int = 100) -> BatchView:
    status = batch_status(service.batches, service.scheduler, record)
    counts = status.counts
    data = record.to_dict()
    error = JobError(code=record.error_code, message=record.error_message) if record.error_code else None
    base = f"/v1/batches/{record.id}"
    signed = service.access.signed_url
    items = service.batches.items(record.id, offset=offset, limit=limit)
    fmt = (record.params or {}).get("format") or "wav"
    return BatchView(
        id=record.id,
        kind=record.kind,  # type: ignore[arg-type]
        owner=record.owner,
        state=record.state,  # type: ignore[arg-type]
        progress=status.progress,
        total=counts.total,
        done=counts.done,
        failed=counts.failed,
        cancelled=counts.cancelled,
        created_at=data["created_at"],
        started_at=data["started_at"],
        finished_at=data["finished_at"],
        position=status.position,
        estimated_wait_s=_wait_s(service, record.id) if status.position is not None else None,
        estimated_time_left_s=status.time_left_s,
        error=error,
        duration_s=record.duration_s,
        charged_s=round(record.charged_s or 0.0, 3),
        archive_url=signed(f"{base}/archive") if counts.done else None,
        track_url=track_url(service, record),
        report_url=signed(f"{base}/report") if record.kind == "dub" else None,
        params=_shown(record.params or {}),
        partial=partial_view(record),
        items=[item_view(service, item, fmt) for item in items],
        check_these=[item.position for item in items if needs_listen(item.result)],
    )


def track_url(service: Service, record: JobRecord) -> str | None:
    if record.kind != "dub" or not record.output_id:
        return None
    fmt = (record.params or {}).get("format") or "wav"
    query = {"format": fmt} if fmt != "wav" else None
    return service.access.signed_url(f"/v1/outputs/{record.output_id}", query)


def item_view(service: Service, item: BatchItem, batch_format: str = "wav") -> BatchItemView:
    params = item.params
    url = None
    if item.state == "done" and item.output_id:
        fmt = params.get("format") or batch_format
        query = {"format": fmt} if fmt not in ("wav", "pcm") else None
        url = service.access.signed_url(f"/v1/outputs/{item.output_id}", query)
    view: dict[str, Any] = {
        "position": item.position,
        "name": item.name,
        "state": item.state,
        "text": str(params.get("text") or ""),
        "voice": params.get("voice"),
        "error": JobError(code=item.error_code, message=item.error_message) if item.error_code else None,
        "output_id": item.output_id,
        "url": url,
        "duration_s": item.duration_s,
        "seed": item.seed,
        "quality": (item.result or {}).get("quality"),
    }
    if "start_s" in params:
        view.update(
            start_s=params["start_s"], end_s=params["end_s"], cue=str(params.get("cue_id") or item.position)
        )
        if item.state == "done" and item.duration_s is not None:
            placed = placement(item.duration_s, params["start_s"], params["end_s"], params["limit_s"])
            view.update(
                speed=(item.result or {}).get("speed", 1.0),
                overflow_s=placed.overflow_s,
                cut_s=placed.cut_s,
                played_s=placed.played_s,
            )
    return BatchItemView(**view)


def _shown(params: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in params.items() if key not in ("prompt_wav", SNAPSHOTS)}


def _wait_s(service: Service, job_id: str) -> float | None:
    """Seconds until a queued batch starts (the scheduler's estimate), None when it is not queued here."""
    ticket = service.scheduler.get(job_id)
    return round(ticket.estimated_wait_s(), 1) if ticket is not None else None
