"""How a batch or a dub arrives: a JSON body (items or subtitles inside), a multipart form (the file as
`file`, a recording as `prompt_wav`, settings as fields), or the file itself as the body (text/csv,
text/plain, application/x-ndjson, application/x-subrip, text/vtt) with settings as query parameters.

Files are read in pieces and refused (413) past `max_upload_mb`, as recordings are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel

from cosyserve.api.errors import PayloadTooLarge, UnsupportedMediaType
from cosyserve.api.inputs import (
    MAX_FORM_FIELDS,
    decode_base64,
    media_type,
    parse_json,
    read_limited,
    read_upload,
    split_form,
)
from cosyserve.api.inputs import validate as validate_model
from cosyserve.errors import InputError

Params = TypeVar("Params", bound=BaseModel)
RAW_TYPES = (
    "text/csv",
    "text/plain",
    "application/jsonl",
    "application/x-ndjson",
    "application/x-jsonlines",
    "application/x-subrip",
    "text/vtt",
    "text/srt",
)


@dataclass(frozen=True)
class Submission:
    """What came: the settings, the file (its name says its kind) or the items a JSON body carried, and
    the uploaded recording."""

    params: Any
    data: bytes | None = None
    filename: str | None = None
    content_type: str | None = None
    prompt_wav: bytes | None = None


async def read_submission(request: Request, model: type[Params], max_bytes: int) -> Submission:
    kind = media_type(request)
    if kind == "application/json" or kind.endswith("+json"):
        data = parse_json(await request.body(), "the body")
        if isinstance(data, list):  # a bare list of items
            data = {"items": data}
        if not isinstance(data, dict):
            raise InputError(f"the body must be a JSON object, got {type(data).__name__}")
        params = validate_model(model, data)
        return Submission(params, prompt_wav=_base64_prompt(params, max_bytes))
    if kind in ("multipart/form-data", "application/x-www-form-urlencoded"):
        return await _form(request, model, max_bytes)
    if kind in RAW_TYPES:
        params = validate_model(model, dict(request.query_params))
        body = await request.body()
        if len(body) > max_bytes:
            raise PayloadTooLarge(f"the file is larger than the limit of {max_bytes / 1e6:.1f} MB")
        return Submission(params, body, None, kind, _base64_prompt(params, max_bytes))
    raise UnsupportedMediaType(
        f"content type {kind or '(none)'!r} is not accepted here: send JSON, a multipart form with the file "
        f"as `file`, or the file itself as {', '.join(RAW_TYPES)}"
    )


async def _form(request: Request, model: type[Params], max_bytes: int) -> Submission:
    form = await request.form(max_files=2, max_fields=MAX_FORM_FIELDS)
    try:
        fields, files = split_form(form, ("file", "prompt_wav"), "send the file as `file`")
        if "file" in files and ("items" in fields or "subtitles" in fields):
            raise InputError("give the items once: as the uploaded `file` or in the form, not both")
        if "items" in fields:
            fields["items"] = _json_field(fields["items"])
        params = validate_model(model, fields)
        prompt = None
        if "prompt_wav" in files:
            prompt, _ = await read_upload(files["prompt_wav"], max_bytes)
        else:
            prompt = _base64_prompt(params, max_bytes)
        upload = files.get("file")
        if upload is None:
            return Submission(params, prompt_wav=prompt)
        return Submission(
            params,
            await read_limited(upload, max_bytes, "the file", ": split it into smaller batches"),
            upload.filename,
            upload.content_type,
            prompt,
        )
    finally:
        await form.close()


def _json_field(value: str) -> Any:
    try:
        return parse_json(value, "items")
    except InputError:
        raise InputError('the form field `items` must be a JSON list: [{"text": "..."}]') from None


def _base64_prompt(params: Any, max_bytes: int) -> bytes | None:
    encoded = getattr(params, "prompt_wav", None)
    return decode_base64(encoded, "prompt_wav", max_bytes) if encoded else None
