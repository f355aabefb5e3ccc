"""Jobs for long texts: submit, poll (state, progress, signed result URL), list, cancel."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import RedirectResponse
from starlette.concurrency import run_in_threadpool

from cosyserve.api.deps import (
    CurrentPrincipal,
    get_service,
    output_spec,
    record_recording_consent,
    upload_limit,
)
from cosyserve.api.inputs import read_params, with_transcript
from cosyserve.api.schemas import ERRORS, JobError, JobList, JobParams, JobPartial, JobView, body_doc
from cosyserve.errors import JobStateError
from cosyserve.limits import MAX_LIST_OFFSET
from cosyserve.service.access.principals import Principal
from cosyserve.service.assembly import Service
from cosyserve.service.local.voice_pins import SNAPSHOTS
from cosyserve.service.requests import WorkState
from cosyserve.service.stores.jobs import JobNotFound, JobRecord
from cosyserve.service.stores.output_refs import DELETED

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


def job_view(service: Service, record: JobRecord) -> JobView:
    data = record.to_dict()
    ticket = service.scheduler.get(record.id)
    position = wait = None
    progress = record.progress
    if ticket is not None and not record.is_terminal:
        progress = max(progress, ticket.progress)
        position = ticket.position
        wait = round(ticket.estimated_wait_s(), 1) if position is not None else None
    result_url = None
    if record.output_id:  # failed or cancelled with a result: stopped early, what it made is kept
        fmt = (record.params or {}).get("format")
        rate = (record.params or {}).get("sample_rate")
        query = {"format": fmt if fmt != "wav" else None, "sample_rate": rate}
        result_url = service.access.signed_url(f"/v1/outputs/{record.output_id}", query)
    error = JobError(code=record.error_code, message=record.error_message) if record.error_code else None
    return JobView(
        id=record.id,
        state=record.state,  # type: ignore[arg-type]
        progress=round(progress, 4),
        created_at=data["created_at"],
        started_at=data["started_at"],
        finished_at=data["finished_at"],
        position=position,
        estimated_wait_s=wait,
        error=error,
        output_id=record.output_id,
        result_url=result_url,
        result_deleted=bool((record.result_extra or {}).get(DELETED)),
        duration_s=record.duration_s,
        charged_s=record.charged_s,
        seed=record.seed,
        params={key: value for key, value in (record.params or {}).items() if key != SNAPSHOTS},
        warnings=list((record.result_extra or {}).get("warnings", [])),
        quality=(record.result_extra or {}).get("quality"),
        kind=record.kind,
        owner=record.owner,
        partial=partial_view(record),
    )


def partial_view(record: JobRecord) -> JobPartial | None:
    """How far a job that stopped early got (None: it did not stop early, or it kept nothing)."""
    if record.state == "done" or not record.is_terminal:
        return None
    partial = (record.result_extra or {}).get("partial")  # none: it kept nothing (or ended before reports)
    return JobPartial(**partial) if isinstance(partial, dict) else None


def _own_job(service: Service, principal: Principal, job_id: str) -> JobRecord:
    record = service.jobs.get(job_id)
    if record is None or not principal.may_see(record.owner):
        raise JobNotFound(f"no job {job_id!r}: list your jobs with GET /v1/jobs")
    return record


@router.post(
    "",
    status_code=202,
    response_model=JobView,
    responses=ERRORS,
    summary="Submit a long text as a job",
    description="Same fields as POST /v1/tts (JSON or multipart; no streaming). The text may be up to "
    "50x the per-request limit; it is synthesised piece by piece. Poll GET /v1/jobs/{id}.",
    openapi_extra=body_doc(JobParams, "prompt_wav"),
)
async def create_job(request: Request, response: Response, principal: CurrentPrincipal) -> JobView:
    service = get_service(request)
    service.access.check_quota(principal)
    params, audio, _ = await read_params(request, JobParams, "prompt_wav", upload_limit(request))
    spec = output_spec(request, principal, "jobs", format=params.format, sample_rate=params.sample_rate)
    record_recording_consent(request, principal, spec, recording=audio is not None, consent=params.consent)
    synthesis = await with_transcript(service, params, audio)
    record = await run_in_threadpool(service.backend.submit_job, synthesis, spec)
    response.headers["Location"] = f"/v1/jobs/{record.id}"
    return job_view(service, record)


@router.get("", response_model=JobList, responses=ERRORS, summary="List jobs (yours; admins: all)")
def list_jobs(
    request: Request,
    principal: CurrentPrincipal,
    state: WorkState | None = None,
    limit: int = Query(50, ge=1, le=500),
    offset: int = Query(0, ge=0, le=MAX_LIST_OFFSET),
) -> JobList:
    service = get_service(request)
    owner = principal.listed_owner
    records = service.jobs.list(owner=owner, state=state, limit=limit + 1, offset=offset)
    return JobList(data=[job_view(service, r) for r in records[:limit]], has_more=len(records) > limit)


@router.get("/{job_id}", response_model=JobView, responses=ERRORS, summary="A job's state and result")
def get_job(job_id: str, request: Request, principal: CurrentPrincipal) -> JobView:
    service = get_service(request)
    return job_view(service, _own_job(service, principal, job_id))


@router.get(
    "/{job_id}/result",
    status_code=307,
    response_class=RedirectResponse,
    responses=ERRORS,
    summary="Redirect to the result's signed download URL",
)
def job_result(job_id: str, request: Request, principal: CurrentPrincipal) -> Response:
    service = get_service(request)
    view = job_view(service, _own_job(service, principal, job_id))
    if view.result_deleted:
        raise JobStateError(f"job {job_id}'s result was deleted: submit the job again to make it anew")
    if view.result_url is None:
        raise JobStateError(f"job {job_id} is {view.state}: it has no result to download")
    return RedirectResponse(view.result_url, status_code=307)


@router.delete(
    "/{job_id}",
    status_code=202,
    response_model=JobView,
    responses=ERRORS,
    summary="Cancel a queued or running job",
)
def cancel_job(job_id: str, request: Request, principal: CurrentPrincipal) -> JobView:
    service = get_service(request)
    _own_job(service, principal, job_id)
    return job_view(service, service.backend.cancel_job(job_id))
