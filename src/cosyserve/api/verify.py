"""`POST /v1/verify`: upload an audio file, get back whether its AI labels are intact (docs/labels.md)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, File, Request, UploadFile
from fastapi.concurrency import run_in_threadpool

from cosyserve.api.deps import CurrentPrincipal, get_service, upload_limit
from cosyserve.api.inputs import read_limited
from cosyserve.api.schemas import ERRORS
from cosyserve.service.access.principals import Forbidden, Principal
from cosyserve.service.labels.labeller import OPT_OUT
from cosyserve.service.labels.verify import verify

router = APIRouter(prefix="/v1", tags=["labels"])


@router.post(
    "/verify",
    responses=ERRORS,
    summary="Check a file's AI labels",
    description=(
        "Reads the file's implicit label (the GB 45438 `AIGC` metadata field) and its C2PA manifest, checks "
        "the label's audio hash and this server's signature, and answers `status`: intact, altered, "
        "unlabelled, or unbound (a streamed file, whose label was written before its audio)."
    ),
)
async def verify_file(
    request: Request,
    principal: CurrentPrincipal,
    file: Annotated[UploadFile, File(description="the audio file")],
) -> dict[str, Any]:
    service = get_service(request)
    data = await read_limited(
        file, upload_limit(request), "the file", ": check a longer file with `cosyserve verify` on the server"
    )
    report = await run_in_threadpool(verify, data, service.labels.secret)
    return report.to_dict()


def explicit_label_opt_out(principal: Principal) -> dict[str, Any]:
    """The output-spec extra that skips the audible cue; 403 for anyone but an admin."""
    if not principal.is_admin:
        raise Forbidden(
            "only an admin may turn off the audible AI label (explicit_label=false); leave it on, or ask "
            "an admin to produce this output"
        )
    return {OPT_OUT: False}
