"""Dubbing: a subtitle file becomes a timed voice-over.

`POST /v1/dub` takes an SRT or WebVTT file and a voice: every cue is synthesised and placed at its start
in one track as long as the last cue's end (refused at submit past `max_dub_track_s`; charged its length,
`dub_plan`); a cue longer than its slot is sped up by the model up to `max_speed`, and what still does not
fit runs into the gap after it (reported as `overflow_s`), never over the next cue (the rest is cut,
`cut_s`). A dub is a batch of cues (progress, resume after a restart, cancel): `GET /v1/dub/{id}` is
`GET /v1/batches/{id}`; the track and the per-cue report (`dub_report`) have routes of their own.
"""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import RedirectResponse
from starlette.concurrency import run_in_threadpool

from cosyserve.api.batch_inputs import read_submission
from cosyserve.api.batch_schemas import BatchView, DubParams, upload_body_doc
from cosyserve.api.batch_views import batch_view, own_batch, track_url
from cosyserve.api.batches import REPORT_CONTENT, REPORT_RESPONSES, batch_report, batch_rules
from cosyserve.api.deps import (
    CurrentPrincipal,
    get_service,
    output_spec,
    record_recording_consent,
    upload_limit,
)
from cosyserve.api.schemas import ERRORS
from cosyserve.errors import InputError, JobStateError
from cosyserve.frontend.subtitles import parse_subtitles
from cosyserve.limits import MAX_LIST_OFFSET
from cosyserve.service.batches.inputs import SHARED_FIELDS, cue_items
from cosyserve.service.batches.submission import BatchSubmission

router = APIRouter(prefix="/v1/dub", tags=["dubbing"])
SHARED = (*SHARED_FIELDS, "max_speed")  # a batch's shared settings, and how far a cue may be sped up


@router.post(
    "",
    status_code=202,
    response_model=BatchView,
    responses=ERRORS,
    summary="Voice a subtitle file (SRT or WebVTT) as one timed track",
    description="A multipart form (the subtitles as `file`, a recording as `prompt_wav`, settings as "
    "fields), JSON (`subtitles` beside the settings), or the file itself as the body (application/x-subrip, "
    "text/vtt) with settings as query parameters. Poll GET /v1/dub/{id}.",
    openapi_extra=upload_body_doc(DubParams, ("application/x-subrip", "text/vtt")),
)
async def create_dub(request: Request, response: Response, principal: CurrentPrincipal) -> BatchView:
    service = get_service(request)
    service.access.check_quota(principal)
    got = await read_submission(request, DubParams, upload_limit(request))
    params: DubParams = got.params
    source = got.data if got.data is not None else params.subtitles
    if not source:
        raise InputError("no subtitles: upload the SRT or WebVTT file as `file`, or give `subtitles` in JSON")
    cues = parse_subtitles(source, what=got.filename or "the subtitle file")
    shared = params.shared(SHARED)
    item_shared = {**shared, "format": "wav"}  # each cue is kept as WAV; the track has the dub's format
    items = cue_items(cues, batch_rules(service, item_shared, got.prompt_wav is not None))
    spec = output_spec(request, principal, "dub")
    record_recording_consent(
        request, principal, spec, recording=got.prompt_wav is not None, consent=params.consent
    )
    batch = BatchSubmission("dub", items, shared, got.prompt_wav)
    record = await run_in_threadpool(service.backend.submit_batch, batch, spec)
    response.headers["Location"] = f"/v1/dub/{record.id}"
    return batch_view(service, record)


@router.get("/{dub_id}", response_model=BatchView, responses=ERRORS, summary="A dub's state and cues")
def get_dub(
    dub_id: str,
    request: Request,
    principal: CurrentPrincipal,
    offset: int = Query(0, ge=0, le=MAX_LIST_OFFSET),
    limit: int = Query(100, ge=0, le=1000),
) -> BatchView:
    service = get_service(request)
    return batch_view(service, own_batch(service, principal, dub_id, ("dub",)), offset=offset, limit=limit)


@router.delete(
    "/{dub_id}", status_code=202, response_model=BatchView, responses=ERRORS, summary="Cancel a dub"
)
def cancel_dub(dub_id: str, request: Request, principal: CurrentPrincipal) -> BatchView:
    service = get_service(request)
    own_batch(service, principal, dub_id, ("dub",))
    return batch_view(service, service.backend.cancel_job(dub_id))


@router.get(
    "/{dub_id}/track",
    status_code=307,
    responses=ERRORS,
    summary="Redirect to the track's signed download URL (?format=wav|flac|mp3)",
)
def dub_track(
    dub_id: str,
    request: Request,
    principal: CurrentPrincipal,
    format: Literal["wav", "flac", "mp3"] | None = None,
) -> Response:
    service = get_service(request)
    record = own_batch(service, principal, dub_id, ("dub",))
    url = track_url(service, record)
    if url is None or record.output_id is None:
        if not record.is_terminal:
            raise JobStateError(f"dub {dub_id} is {record.state}: it has no track to download yet")
        raise JobStateError(
            f"dub {dub_id} is {record.state} and has no track: its finished cues download as "
            f"GET /v1/batches/{dub_id}/archive"
        )
    if format is not None:
        query = {"format": format} if format != "wav" else None
        url = service.access.signed_url(f"/v1/outputs/{record.output_id}", query)
    return RedirectResponse(url, status_code=307)


@router.get(
    "/{dub_id}/report",
    responses=REPORT_RESPONSES,
    summary=f"Per cue: {REPORT_CONTENT}",
)
async def dub_report(
    dub_id: str, request: Request, principal: CurrentPrincipal, format: Literal["json", "csv"] = "json"
) -> Response:
    service = get_service(request)
    own_batch(service, principal, dub_id, ("dub",))
    return await batch_report(dub_id, request, format, None, None)
