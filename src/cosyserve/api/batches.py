"""Batches: a script of lines becomes one job and a folder of files.

`POST /v1/batches` takes the items as JSON, JSON lines, CSV (header row) or plain text (one text per
line); `GET /v1/batches/{id}` says how far it got (per item); `DELETE` cancels the rest; the results come
as one ZIP streamed from storage, or item by item. The same routes serve dubs (`api.dub`), which are
batches of subtitle cues.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Path, Query, Request, Response
from fastapi.responses import RedirectResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from cosyserve.api.batch_inputs import Submission, read_submission
from cosyserve.api.batch_schemas import BatchList, BatchParams, BatchView, upload_body_doc
from cosyserve.api.batch_views import BATCH_KINDS, batch_view, own_batch
from cosyserve.api.deps import (
    CurrentPrincipal,
    current_principal,
    get_service,
    output_spec,
    record_recording_consent,
    upload_limit,
)
from cosyserve.api.schemas import ERRORS
from cosyserve.errors import InputError, JobStateError, OutputNotFound
from cosyserve.limits import MAX_LIST_OFFSET
from cosyserve.service.access.principals import Forbidden, Principal
from cosyserve.service.assembly import Service
from cosyserve.service.batches.archive import stream_zip
from cosyserve.service.batches.dub_plan import track_seconds_of_items
from cosyserve.service.batches.dub_report import dub_report, report_csv, report_document, report_json
from cosyserve.service.batches.inputs import SHARED_FIELDS, BatchRules, items_from, kind_of, read_items
from cosyserve.service.batches.submission import BatchSubmission
from cosyserve.service.requests import WorkState
from cosyserve.service.stores.jobs import JobNotFound, JobRecord

router = APIRouter(prefix="/v1/batches", tags=["batches"])
# A dub's timing report, from /v1/batches/{id}/report and /v1/dub/{id}/report alike.
REPORT_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"content": {"application/json": {}, "text/csv": {}}},
    **ERRORS,
}
REPORT_CONTENT = (
    "the file's number, planned and actual start, speech made, played and cut, speed-up, overflow; the "
    "track's length and what it was charged"
)


def batch_rules(service: Service, shared: dict, has_prompt: bool) -> BatchRules:
    limits = service.settings.limits
    return BatchRules(
        limits.max_batch_items,
        limits.max_text_chars,
        has_prompt,
        shared,
        max_track_s=limits.max_dub_track_s,
        thresholds=service.settings.quality.policy().thresholds,
    )


@router.post(
    "",
    status_code=202,
    response_model=BatchView,
    responses=ERRORS,
    summary="Submit a batch of texts as one job",
    description="JSON (`items` beside shared settings), a multipart form (the file as `file`: .csv with a "
    "header row, .jsonl, .json or .txt with one text per line; a recording as `prompt_wav`; shared settings "
    "as fields), or the file itself as the body (text/csv, text/plain, application/x-ndjson) with settings "
    "as query parameters. Items that cannot be spoken fail alone. Poll GET /v1/batches/{id}.",
    openapi_extra=upload_body_doc(BatchParams, ("text/csv", "text/plain", "application/x-ndjson")),
)
async def create_batch(request: Request, response: Response, principal: CurrentPrincipal) -> BatchView:
    service = get_service(request)
    service.access.check_quota(principal)
    got: Submission = await read_submission(request, BatchParams, upload_limit(request))
    params: BatchParams = got.params
    shared = params.shared(SHARED_FIELDS)
    rules = batch_rules(service, shared, got.prompt_wav is not None)
    if got.data is not None:
        items = read_items(got.data, kind_of(got.filename, got.content_type), rules)
    elif params.items is not None:
        items = items_from(params.items, rules)
    else:
        raise InputError("no items: upload the batch file as `file`, or give `items` in a JSON body")
    spec = output_spec(request, principal, "batches")
    record_recording_consent(
        request, principal, spec, recording=got.prompt_wav is not None, consent=params.consent
    )
    batch = BatchSubmission("batch", items, shared, got.prompt_wav)
    record = await run_in_threadpool(service.backend.submit_batch, batch, spec)
    response.headers["Location"] = f"/v1/batches/{record.id}"
    return batch_view(service, record)


@router.get(
    "", response_model=BatchList, responses=ERRORS, summary="List batches and dubs (yours; admins: all)"
)
def list_batches(
    request: Request,
    principal: CurrentPrincipal,
    state: WorkState | None = None,
    limit: int = Query(20, ge=1, le=100),
    offset: int = Query(0, ge=0, le=MAX_LIST_OFFSET),
) -> BatchList:
    service = get_service(request)
    owner = principal.listed_owner
    records = service.jobs.list(owner=owner, state=state, limit=limit + 1, offset=offset, kinds=BATCH_KINDS)
    views = [batch_view(service, record, limit=0) for record in records[:limit]]
    return BatchList(data=views, has_more=len(records) > limit)


@router.get("/{batch_id}", response_model=BatchView, responses=ERRORS, summary="A batch's state and items")
def get_batch(
    batch_id: str,
    request: Request,
    principal: CurrentPrincipal,
    offset: int = Query(0, ge=0, le=MAX_LIST_OFFSET, description="first item shown (0: the first)"),
    limit: int = Query(100, ge=0, le=1000, description="items shown"),
) -> BatchView:
    service = get_service(request)
    return batch_view(service, own_batch(service, principal, batch_id), offset=offset, limit=limit)


@router.delete(
    "/{batch_id}", status_code=202, response_model=BatchView, responses=ERRORS, summary="Cancel the rest"
)
def cancel_batch(batch_id: str, request: Request, principal: CurrentPrincipal) -> BatchView:
    service = get_service(request)
    own_batch(service, principal, batch_id)
    return batch_view(service, service.backend.cancel_job(batch_id))


@router.get(
    "/{batch_id}/archive",
    responses={200: {"content": {"application/zip": {}}}, **ERRORS},
    summary="Every finished item as one ZIP (with manifest.csv and subtitles)",
    description="With `exp` and `sig` (the signed `archive_url`) no API key is needed.",
)
async def batch_archive(
    batch_id: str,
    request: Request,
    exp: str | None = Query(None, max_length=16),
    sig: str | None = Query(None, max_length=128),
) -> StreamingResponse:
    service = get_service(request)
    record = await _signed_or_own(request, service, batch_id, "archive", exp, sig)
    items = await run_in_threadpool(service.batches.items, record.id)
    if not any(item.state == "done" for item in items):
        raise JobStateError(f"batch {batch_id} has no finished item yet: nothing to download")
    track = None
    fmt = (record.params or {}).get("format") or "wav"
    if record.kind == "dub" and record.output_id:
        track = await run_in_threadpool(service.outputs.get, record.output_id)
    headers = {"Content-Disposition": f'attachment; filename="{record.kind}_{record.id}.zip"'}
    body = stream_zip(items, service.outputs, track=track, track_format=fmt, dub=record.kind == "dub")
    return StreamingResponse(body, media_type="application/zip", headers=headers)


@router.get(
    "/{batch_id}/items/{position}",
    status_code=307,
    responses=ERRORS,
    summary="Redirect to one finished item's signed download URL",
)
def batch_item(
    batch_id: str,
    request: Request,
    principal: CurrentPrincipal,
    position: int = Path(ge=1, le=MAX_LIST_OFFSET),
) -> Response:
    service = get_service(request)
    record = own_batch(service, principal, batch_id)
    item = service.batches.item(record.id, position)
    if item is None:
        raise JobNotFound(f"batch {batch_id} has no item {position}: items are numbered from 1")
    view = batch_view(service, record, offset=position - 1, limit=1).items[0]
    if view.url is None and item.state == "done":  # made, then deleted or expired
        raise OutputNotFound(
            f"item {position}'s audio was deleted or expired since it was made: run the item again in a "
            "new batch"
        )
    if view.url is None:
        raise JobStateError(f"item {position} is {item.state}: it has no audio to download")
    return RedirectResponse(view.url, status_code=307)


@router.get(
    "/{batch_id}/report",
    responses=REPORT_RESPONSES,
    summary=f"A dub's report: per cue, {REPORT_CONTENT}",
)
async def batch_report(
    batch_id: str,
    request: Request,
    format: Literal["json", "csv"] = "json",
    exp: str | None = Query(None, max_length=16),
    sig: str | None = Query(None, max_length=128),
) -> Response:
    service = get_service(request)
    record = await _signed_or_own(request, service, batch_id, "report", exp, sig)
    if record.kind != "dub":
        raise InputError(f"{batch_id} is a batch, not a dub: only dubs have a timing report")
    items = await run_in_threadpool(service.batches.items, record.id)
    rows = dub_report(items)
    if format == "csv":
        return Response(report_csv(rows), media_type="text/csv; charset=utf-8")
    planned_s = track_seconds_of_items(item.params for item in items)
    # the track made (a dub stopped early, by a cancel or the quota, made a shorter one, or none)
    track_s = (record.duration_s or 0.0) if record.is_terminal else None
    document = report_document(
        rows, track_s=track_s, planned_track_s=planned_s, charged_s=record.charged_s or 0.0
    )
    return Response(report_json(document), media_type="application/json")


async def _signed_or_own(
    request: Request, service: Service, batch_id: str, what: str, exp: str | None, sig: str | None
) -> JobRecord:
    if exp is not None or sig is not None:
        if not service.access.verify_signed(f"/v1/batches/{batch_id}/{what}", exp, sig):
            raise Forbidden("this download link is invalid or has expired: ask for a new one")
        record = service.jobs.get(batch_id)
        if record is None or record.kind not in BATCH_KINDS:
            raise JobNotFound(f"no batch {batch_id!r}: it may have been purged")
        return record
    principal: Principal = await current_principal(request)
    return own_batch(service, principal, batch_id)
