"""Saved voices: list, enrol (JSON or multipart), read, update, delete, preview.

Who may do what is `service.access.voice_rules` (the same rule the web UI applies): a user key sees and
uses its own and the shared voices (any other answers 404, like a missing one), changes only its own, and
only owners and admins get the original recording or its transcript. Admins see, change and share all.
"""

from __future__ import annotations

import mimetypes

from fastapi import APIRouter, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from cosyserve.api.deps import (
    CurrentPrincipal,
    get_service,
    output_spec,
    request_id,
    upload_limit,
    usable_voice,
)
from cosyserve.api.held_file import HeldFileResponse
from cosyserve.api.inputs import parse_lexicon, read_params
from cosyserve.api.schemas import AUDIO_CONTENT, ERRORS, body_doc
from cosyserve.api.streaming import audio_response, await_ticket
from cosyserve.api.voice_schemas import ConsentStatement, VoiceCreateParams, VoiceList, VoiceUpdate, VoiceView
from cosyserve.errors import InputError, VoiceNotFound
from cosyserve.limits import MAX_LIST_OFFSET
from cosyserve.service.access import voice_rules
from cosyserve.service.access.principals import Principal
from cosyserve.service.local.voice_pins import refuse_if_in_use
from cosyserve.service.requests import EnrolmentRequest, SynthesisRequest, VoiceDefaults
from cosyserve.service.stores.voices import Voice

router = APIRouter(prefix="/v1/voices", tags=["voices"])
PREVIEW_MAX_CHARS = 100


def view(principal: Principal, voice: Voice) -> VoiceView:
    return VoiceView(**voice_rules.view(principal, voice), preview_url=f"/v1/voices/{voice.id}/preview")


@router.get("", response_model=VoiceList, responses=ERRORS, summary="List saved voices (yours and shared)")
def list_voices(
    request: Request,
    principal: CurrentPrincipal,
    limit: int | None = Query(None, ge=1, le=1000, description="at most this many (default: all)"),
    offset: int = Query(0, ge=0, le=MAX_LIST_OFFSET, description="skip this many first"),
) -> VoiceList:
    voices = get_service(request).voices.list(principal.voices)  # (limit and offset were ignored)
    end = offset + limit if limit is not None else len(voices)
    return VoiceList(data=[view(principal, v) for v in voices[offset:end]], has_more=len(voices) > end)


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
async def create_voice(request: Request, principal: CurrentPrincipal) -> VoiceView:
    service = get_service(request)
    params, audio, suffix = await read_params(request, VoiceCreateParams, "audio", upload_limit(request))
    if audio is None:
        raise InputError("no recording: upload the voice's audio as `audio` (multipart) or base64 (JSON)")
    defaults = VoiceDefaults(
        instruct=params.instruct or None, speed=params.speed, seed=params.seed, denoise=params.denoise or None
    )
    lexicon = parse_lexicon(params.lexicon)
    auth = service.settings.auth
    owner, shared, consent = voice_rules.enrolment(
        principal, auth, consent=params.consent, shared=params.shared
    )
    enrolment = EnrolmentRequest(
        params.name,
        audio,
        params.transcript,
        suffix,
        defaults,
        lexicon,
        owner=owner,
        shared=shared,
        consent=consent,
    )
    ticket = service.backend.submit_enrolment(enrolment, request_id=request_id(request))
    voice: Voice = await await_ticket(request, ticket)
    return view(principal, voice)


@router.get("/consent", response_model=ConsentStatement, responses=ERRORS, summary="What enrolling confirms")
def consent_statement(request: Request, principal: CurrentPrincipal) -> ConsentStatement:
    auth = get_service(request).settings.auth
    return ConsentStatement(statement=auth.voice_consent_statement, required=auth.voice_consent_required)


@router.get("/{voice_id}", response_model=VoiceView, responses=ERRORS, summary="One voice")
def get_voice(voice_id: str, request: Request, principal: CurrentPrincipal) -> VoiceView:
    return view(principal, usable_voice(request, principal, voice_id))


def _changeable(request: Request, principal: Principal, voice_id: str) -> Voice:
    """The voice, if `principal` may change it: admins any, others their own (shared ones: 403)."""
    voice = usable_voice(request, principal, voice_id)
    voice_rules.check_changeable(principal, voice)
    return voice


@router.patch("/{voice_id}", response_model=VoiceView, responses=ERRORS, summary="Rename or change a voice")
def update_voice(
    voice_id: str, body: VoiceUpdate, request: Request, principal: CurrentPrincipal
) -> VoiceView:
    voice = _changeable(request, principal, voice_id)
    voice_rules.check_sharing(principal, body.shared)
    defaults = VoiceDefaults(**body.defaults.model_dump()) if body.defaults is not None else None
    updated = get_service(request).voices.update(
        voice.id,
        name=body.name,
        transcript=body.transcript,
        defaults=defaults,
        lexicon=body.lexicon,
        shared=body.shared,
    )
    return view(principal, updated)


@router.delete("/{voice_id}", status_code=204, responses=ERRORS, summary="Delete a voice")
def delete_voice(voice_id: str, request: Request, principal: CurrentPrincipal) -> Response:
    service = get_service(request)
    voice = _changeable(request, principal, voice_id)
    refuse_if_in_use(service.jobs, voice, principal)  # 409 voice_in_use: its jobs keep it until they end
    service.voices.delete(voice.id)
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
    voice = await run_in_threadpool(usable_voice, request, principal, voice_id)
    if text is None:  # the recording itself (fetched from the shared database if not on this node yet)
        voice_rules.check_recording(principal, voice)
        path = await run_in_threadpool(service.voices.audio_file, voice)
        media_type = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        try:
            return HeldFileResponse(path, media_type=media_type)
        except FileNotFoundError:  # deleted since it was looked up
            raise VoiceNotFound(
                f"the voice {voice_id!r} was deleted while its recording was fetched"
            ) from None
    service.access.check_quota(principal)
    spec = output_spec(request, principal, "preview")
    ticket = service.backend.submit_tts(SynthesisRequest(text=text, voice=voice.id), spec)
    return audio_response(await await_ticket(request, ticket))
