"""`POST /v1/audio/speech`, compatible with OpenAI's, so OpenAI SDKs work by changing the base URL.

`voice` names a saved voice (OpenAI's built-in names exist only if you enrol voices under them);
`instructions` becomes the instruct text; `speed` must be within 0.5-2.0 (OpenAI allows 0.25-4.0; any
other speed is one 400 that says so);
`stream_format="sse"` sends `speech.audio.delta` / `speech.audio.done` events like OpenAI's (after `queued`
events while it waits behind other work: `api.streaming`), and an explicit
`stream_format="audio"` streams raw audio chunks as they are generated (without it the whole file comes at
once, with the X-Cosyserve-Output-Id and X-Cosyserve-Duration headers).
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from cosyserve.api.deps import CurrentPrincipal, get_service, output_spec, usable_voice
from cosyserve.api.errors import naming, reworded
from cosyserve.api.schemas import AUDIO_CONTENT, ERRORS, SpeechParams
from cosyserve.api.streaming import (
    audio_response,
    audio_stream_response,
    await_ticket,
    open_stream,
    open_unless_queued,
    sse_response,
)
from cosyserve.errors import InputError, TextError
from cosyserve.limits import MAX_SPEED, MIN_SPEED
from cosyserve.service.audio_formats import check_sample_rate
from cosyserve.service.requests import SynthesisRequest
from cosyserve.service.stores.voices import VoiceNotFound

router = APIRouter(prefix="/v1", tags=["openai"])


@router.post(
    "/audio/speech",
    summary="OpenAI-compatible speech",
    responses={
        200: {"content": {**AUDIO_CONTENT, "text/event-stream": {}}, "description": "audio or SSE"},
        **ERRORS,
    },
)
async def speech(body: SpeechParams, request: Request, principal: CurrentPrincipal) -> Response:
    service = get_service(request)
    service.access.check_quota(principal)
    if body.response_format == "aac":
        message = "response_format 'aac' is not supported here: use mp3, opus, flac, wav or pcm"
        raise naming(InputError(message), "response_format")
    if not MIN_SPEED <= body.speed <= MAX_SPEED:
        message = f"speed {body.speed:g} is outside what CosyVoice supports: use {MIN_SPEED} to {MAX_SPEED}"
        raise naming(InputError(message), "speed")
    try:
        check_sample_rate(body.response_format, body.sample_rate)
    except InputError as exc:
        raise naming(exc, "sample_rate") from None
    name = body.voice_name
    try:
        usable_voice(request, principal, name)
    except VoiceNotFound:
        missing = VoiceNotFound(
            f"no saved voice {name!r}. `voice` must name a voice saved on this server: create one with "
            "POST /v1/voices (multipart: name, audio, transcript) or `cosyserve voices add NAME --wav FILE`; "
            "GET /v1/voices lists them"
        )
        raise naming(missing, "voice") from None
    synthesis = SynthesisRequest(
        text=body.input,
        voice=name,
        instruct=body.instructions or None,
        seed=body.seed,
        speed=body.speed if "speed" in body.model_fields_set else None,  # unset: the voice's default
    )
    spec = output_spec(
        request,
        principal,
        "openai",
        format=body.response_format,
        sample_rate=body.sample_rate,
        extra={"model": body.model},
    )
    try:
        if body.stream_format == "sse":
            stream = service.backend.stream_tts(synthesis, spec)
            await open_unless_queued(request, stream)  # a waiting stream begins with `queued` events
            return sse_response(stream, len(body.input))
        if "stream_format" in body.model_fields_set:  # asked for "audio" explicitly: chunks as generated
            stream = service.backend.stream_tts(synthesis, spec)
            await open_stream(request, stream)
            return audio_stream_response(stream)
        ticket = service.backend.submit_tts(synthesis, spec)
        return audio_response(await await_ticket(request, ticket))
    except TextError as exc:  # its text is this endpoint's `input`
        said = str(exc).replace("the text", "the input", 1).replace("text is", "input is", 1)
        raise naming(reworded(exc, said), "input") from None
