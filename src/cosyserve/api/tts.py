"""`POST /v1/tts`: text + voice (saved or uploaded) → audio, whole or streamed."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from cosyserve.api.deps import (
    CurrentPrincipal,
    get_service,
    output_spec,
    record_recording_consent,
    upload_limit,
)
from cosyserve.api.inputs import read_params, with_transcript
from cosyserve.api.schemas import AUDIO_CONTENT, ERRORS, TtsParams, body_doc
from cosyserve.api.streaming import audio_response, audio_stream_response, await_ticket, open_stream
from cosyserve.api.verify import explicit_label_opt_out

router = APIRouter(prefix="/v1", tags=["speech"])


@router.post(
    "/tts",
    summary="Synthesise speech",
    description=(
        "Speak `text` in a saved `voice` or a cloned one (`prompt_wav`, with `prompt_text` for zero-shot). "
        "Send JSON (prompt audio as base64) or multipart/form-data (prompt audio as a file). With "
        "`stream=true` the audio arrives in chunks while it is generated. Headers: X-Cosyserve-Seed "
        "(reproduce with `seed`), X-Cosyserve-Output-Id and X-Cosyserve-Duration (not when streamed); "
        "the kept take's scores (X-Takes, X-Take-Passed, X-Take-Failed, X-Take-Similarity, …; not when "
        "streamed): see docs/quality.md."
    ),
    responses={200: {"content": AUDIO_CONTENT, "description": "the audio"}, **ERRORS},
    openapi_extra=body_doc(TtsParams, "prompt_wav"),
)
async def tts(request: Request, principal: CurrentPrincipal) -> Response:
    service = get_service(request)
    service.access.check_quota(principal)
    params, audio, _ = await read_params(request, TtsParams, "prompt_wav", upload_limit(request))
    spec = output_spec(request, principal, "tts", format=params.format, sample_rate=params.sample_rate)
    if not params.explicit_label:
        spec.extra.update(explicit_label_opt_out(principal))
    record_recording_consent(request, principal, spec, recording=audio is not None, consent=params.consent)
    synthesis = await with_transcript(
        service, params, audio
    )  # a saved voice is looked up for this caller where it is used
    if params.stream:
        stream = service.backend.stream_tts(synthesis, spec)
        await open_stream(request, stream)
        return audio_stream_response(stream)
    ticket = service.backend.submit_tts(synthesis, spec)
    return audio_response(await await_ticket(request, ticket))
