"""Stored results: list, download (signed URL or API key), manifest, subtitles, delete.

Outputs are stored as WAV at the model's rate; `format` / `sample_rate` on a download transcode it (a
long one, such as a dub's track, file to file in blocks, never whole in memory).
A signed URL (`?exp=&sig=`, from job results and listings) works without an API key until it expires.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import soundfile
from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import FileResponse
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from cosyserve.api.deps import CurrentPrincipal, current_principal, get_service
from cosyserve.api.held_file import HeldFileResponse
from cosyserve.api.schemas import AUDIO_CONTENT, ERRORS, AudioFormat, OutputList, OutputView
from cosyserve.limits import MAX_LIST_OFFSET
from cosyserve.service.access.principals import Forbidden, Principal
from cosyserve.service.assembly import Service
from cosyserve.service.audio_formats import IN_MEMORY_LIMIT_BYTES, encode, mime_type, transcode_file
from cosyserve.service.labels.labeller import Labeller
from cosyserve.service.stores.output_files import temp_output_path
from cosyserve.service.stores.outputs import OutputNotFound, StoredOutput
from cosyserve.service.subtitles import manifest_timings, to_srt, to_vtt

router = APIRouter(prefix="/v1/outputs", tags=["outputs"])


def output_view(service: Service, output: StoredOutput) -> OutputView:
    manifest = output.manifest
    return OutputView(
        id=output.id,
        created_at=manifest.get("created_at"),
        duration_s=manifest.get("duration_s"),
        size_bytes=manifest.get("size_bytes"),
        sample_rate=manifest.get("sample_rate"),
        seed=manifest.get("seed"),
        owner=manifest.get("owner"),
        url=service.access.signed_url(output.url_path),
        manifest_url=f"{output.url_path}/manifest",
    )


def _visible(service: Service, principal: Principal, output_id: str) -> StoredOutput:
    output = service.outputs.get(output_id)
    if not principal.may_see(output.manifest.get("owner")):
        raise OutputNotFound(f"no output {output_id}; it may have expired or been deleted")
    return output


@router.get("", response_model=OutputList, responses=ERRORS, summary="List stored results (newest first)")
def list_outputs(
    request: Request,
    principal: CurrentPrincipal,
    limit: int = Query(50, ge=1, le=1000),
    offset: int = Query(0, ge=0, le=MAX_LIST_OFFSET),
    request_id: str | None = Query(None, max_length=64, description="only the output of this request"),
) -> OutputList:
    service = get_service(request)
    owner = principal.listed_owner
    if request_id is not None:  # (only the newest 1000 were searched: an older one was "not saved")
        found = service.outputs.of_request(request_id, owner)
        return OutputList(data=[output_view(service, found)] if found is not None else [])
    outputs, more = service.outputs.page(owner, limit, offset)
    return OutputList(data=[output_view(service, o) for o in outputs], has_more=more)


@router.get(
    "/{output_id}",
    responses={200: {"content": AUDIO_CONTENT, "description": "the audio"}, **ERRORS},
    summary="Download a result",
    description="With `exp` and `sig` (a signed URL) no API key is needed.",
)
async def download_output(
    output_id: str,
    request: Request,
    format: AudioFormat | None = None,
    sample_rate: int | None = Query(None, ge=8000, le=48000),
    exp: str | None = Query(None, max_length=16),
    sig: str | None = Query(None, max_length=128),
) -> Response:
    service = get_service(request)
    if exp is not None or sig is not None:
        if not service.access.verify_signed(f"/v1/outputs/{output_id}", exp, sig):
            raise Forbidden("this download link is invalid or has expired: ask for a new one")
        output = await run_in_threadpool(service.outputs.get, output_id)
    else:
        principal = await current_principal(request)
        output = await run_in_threadpool(_visible, service, principal, output_id)
    stored_rate = output.manifest.get("sample_rate")
    if (format in (None, "wav")) and sample_rate in (None, stored_rate):
        with removed_meanwhile(output):
            return HeldFileResponse(output.path, media_type="audio/wav", filename=output.filename)
    fmt = format or "wav"
    with removed_meanwhile(output):
        size = output.path.stat().st_size
    if size > IN_MEMORY_LIMIT_BYTES:  # a long dub track: file to file, in blocks
        temp = await run_in_threadpool(_transcode_to_file, service, output, fmt, sample_rate)
        cleanup = BackgroundTask(temp.unlink, missing_ok=True)
        return FileResponse(
            temp, media_type=mime_type(fmt), filename=f"{output.id}.{fmt}", background=cleanup
        )
    data = await run_in_threadpool(_transcode, output, fmt, sample_rate, service.outputs.labels)
    headers = {"Content-Disposition": f'attachment; filename="{output.id}.{fmt}"'}
    return Response(data, media_type=mime_type(fmt), headers=headers)


GONE_MESSAGE = "this output was deleted or has expired (retention) while it was being fetched"


@contextlib.contextmanager
def removed_meanwhile(output: StoredOutput) -> Iterator[None]:
    """OutputNotFound when reading `output`'s file finds it gone (removed after its lookup)."""
    try:
        yield
    except (FileNotFoundError, soundfile.LibsndfileError) as exc:
        if output.path.exists():
            raise
        raise OutputNotFound(GONE_MESSAGE) from exc


def _transcode(output: StoredOutput, fmt: str, sample_rate: int | None, labels: Labeller | None) -> bytes:
    with removed_meanwhile(output):
        audio, rate = soundfile.read(output.path, dtype="float32")
    data = encode(audio, fmt, source_rate=rate, sample_rate=sample_rate)
    return labels.label_stored(data, fmt, output) if labels is not None else data


def _transcode_to_file(service: Service, output: StoredOutput, fmt: str, sample_rate: int | None) -> Path:
    """The output in `fmt` as a temp file beside it (removed once sent; by retention after a crash)."""
    temp = temp_output_path(service.outputs.root, fmt)
    try:
        with removed_meanwhile(output):
            transcode_file(output.path, temp, fmt, sample_rate=sample_rate)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return temp


@router.get("/{output_id}/manifest", responses=ERRORS, summary="A result's provenance manifest")
def get_manifest(output_id: str, request: Request, principal: CurrentPrincipal) -> dict:
    return _visible(get_service(request), principal, output_id).manifest


@router.get(
    "/{output_id}/subtitles",
    responses={200: {"content": {"application/x-subrip": {}, "text/vtt": {}}}, **ERRORS},
    summary="Sentence timestamps as SRT or WebVTT",
)
def get_subtitles(
    output_id: str,
    request: Request,
    principal: CurrentPrincipal,
    format: Literal["srt", "vtt"] = "srt",
) -> Response:
    output = _visible(get_service(request), principal, output_id)
    timings = manifest_timings(output.manifest)
    if format == "vtt":
        return Response(to_vtt(timings), media_type="text/vtt; charset=utf-8")
    return Response(to_srt(timings), media_type="application/x-subrip; charset=utf-8")


@router.delete("/{output_id}", status_code=204, responses=ERRORS, summary="Delete a result")
def delete_output(output_id: str, request: Request, principal: CurrentPrincipal) -> Response:
    service = get_service(request)
    _visible(service, principal, output_id)
    service.outputs.delete(output_id)
    return Response(status_code=204)
