"""Saved voices: list, enrol (JSON or multipart), read, update, delete, preview.

Changing the library needs the admin role when auth is on; any caller may list and use voices.
"""

from __future__ import annotations

import mimetypes

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import FileResponse
from starlette.concurrency import run_in_threadpool

from cosyserve.api.deps import AdminPrincipal, CurrentPrincipal, get_service, output_spec, request_id
from cosyserve.api.inputs import parse_lexicon, read_params
from cosyserve.api.schemas import (
    AUDIO_CONTENT,
    ERRORS,
    VoiceCreateParams,
    VoiceList,
    VoiceUpdate,
    VoiceView,
    body_doc,
)
from cosyserve.api.streaming import audio_response, await_ticket
from cosyserve.api.tts import upload_limit
from cosyserve.errors import InputError
from cosyserve.service.requests import EnrolmentRequest, SynthesisRequest, VoiceDefaults
from cosyserve.service.stores.voices import Voice

router = APIRouter(prefix="/v1/voices", tags=["voices"])
PREVIEW_MAX_CHARS = 100


def view(voice: Voice) -> VoiceView:
    return VoiceView(**voice.public(), preview_url=f"/v1/voices/{voice.id}/preview")


@router.get("", response_model=VoiceList, responses=ERRORS, summary="List saved voices")
def list_voices(request: Request, _: CurrentPrincipal) -> VoiceList:
    return VoiceList(data=[view(v) for v in get_service(request).voices.list()])


@router.post(
    "",
    status_code=201,
    response_model=VoiceView,
    responses=ERRORS,
    summary="Enrol a voice from a recording",
    description="The recording is analysed once (3-30 s of clean speech; give its transcript for the "
    "best clone). Multipart: upload it as `audio`; JSON: `audio` as base64.",
    openapi_extra=body_doc(VoiceCreateParams, "audio"),
)
async def create_voice(request: Request, _: AdminPrincipal) -> VoiceView:
    service = get_service(request)
    params, audio, suffix = await read_params(request, VoiceCreateParams, "audio", upload_limit(request))
    if audio is None:
        raise InputError("no recording: upload the voice's audio as `audio` (multipart) or base64 (JSON)")
    defaults = VoiceDefaults(
        instruct=params.instruct or None, speed=params.speed, seed=params.seed, denoise=params.denoise or None
    )
    enrolment = EnrolmentRequest(
        params.name, audio, params.transcript, suffix, defaults, parse_lexicon(params.lexicon)
    )
    ticket = service.backend.submit_enrolment(enrolment, request_id=request_id(request))
    voice: Voice = await await_ticket(request, ticket)
    return view(voice)


@router.get("/{voice_id}", response_model=VoiceView, responses=ERRORS, summary="One voice")
def get_voice(voice_id: str, request: Request, _: CurrentPrincipal) -> VoiceView:
    return view(get_service(request).voices.get(voice_id))


@router.patch("/{voice_id}", response_model=VoiceView, responses=ERRORS, summary="Rename or change a voice")
def update_voice(voice_id: str, body: VoiceUpdate, request: Request, _: AdminPrincipal) -> VoiceView:
    defaults = VoiceDefaults(**body.defaults.model_dump()) if body.defaults is not None else None
    voice = get_service(request).voices.update(
        voice_id, name=body.name, transcript=body.transcript, defaults=defaults, lexicon=body.lexicon
    )
    return view(voice)


@router.delete("/{voice_id}", status_code=204, responses=ERRORS, summary="Delete a voice")
def delete_voice(voice_id: str, request: Request, _: AdminPrincipal) -> Response:
    get_service(request).voices.delete(voice_id)
    return Response(status_code=204)


@router.get(
    "/{voice_id}/preview",
    responses={200: {"content": AUDIO_CONTENT, "description": "audio"}, **ERRORS},
    summary="Hear a voice",
    description="Without `text`: the enrolled recording. With `text`: that text spoken in the voice (WAV).",
)
async def preview_voice(
    voice_id: str,
    request: Request,
    principal: CurrentPrincipal,
    text: str | None = Query(None, min_length=1, max_length=PREVIEW_MAX_CHARS),
) -> Response:
    service = get_service(request)
    voice = await run_in_threadpool(service.voices.get, voice_id)
    if text is None:  # the recording itself (fetched from the shared database if not on this node yet)
        path = await run_in_threadpool(service.voices.audio_file, voice)
        media_type = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        return FileResponse(path, media_type=media_type)
    service.access.check_quota(principal)
    spec = output_spec(request, principal, "preview")
    ticket = service.backend.submit_tts(SynthesisRequest(text=text, voice=voice.id), spec)
    return audio_response(await await_ticket(request, ticket))
