"""Bodies that come as JSON (audio as base64) or as multipart forms (audio as an upload).

Uploads are read in pieces and refused (413) as soon as they pass `max_upload_mb`; python-multipart
spools files over 1 MB to disk while parsing, and the middleware caps the whole body, so no request
holds more than the limit in memory. Empty form fields count as absent (HTML forms send them).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
from collections.abc import Collection
from pathlib import PurePath
from typing import Any, TypeVar

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import AliasChoices, BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData, UploadFile

from cosyserve.api.errors import PayloadTooLarge, UnsupportedMediaType
from cosyserve.errors import InputError, LexiconError
from cosyserve.frontend.text.lexicon import check_lexicon_size
from cosyserve.limits import AUDIO_SUFFIX_LIST, AUDIO_SUFFIXES
from cosyserve.service.transcription import transcribe

Params = TypeVar("Params", bound=BaseModel)
READ_PIECE = 64 * 1024
MAX_FORM_FIELDS = 64
MAX_JSON_DEPTH = 16  # the deepest request body is 3 levels; refuse what only an attack would send
AUDIO_TYPES = ("audio/", "application/octet-stream", "video/ogg", "application/ogg")


def media_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


async def read_params(
    request: Request, model: type[Params], upload_field: str, max_bytes: int
) -> tuple[Params, bytes | None, str]:
    """The validated parameters, the audio (bytes or None) and its file suffix (".wav" when unknown).

    The recording may come under any of `upload_field`'s names (its validation aliases), once."""
    kind = media_type(request)
    upload_names = field_names(model, upload_field)
    if kind == "application/json" or kind.endswith("+json"):
        data = await _json_object(request)
        _at_most_one(upload_names, [name for name in upload_names if data.get(name)])
        params = validate(model, data)
        encoded = getattr(params, upload_field, None)
        audio = decode_base64(encoded, upload_field, max_bytes) if encoded else None
        return params, audio, ".wav"
    if kind in ("multipart/form-data", "application/x-www-form-urlencoded"):
        form = await request.form(max_files=2, max_fields=MAX_FORM_FIELDS)
        try:
            fields, uploads = split_form(form, upload_names, f"upload the recording as {upload_field!r}")
            _at_most_one(upload_names, [name for name in upload_names if name in fields or name in uploads])
            params = validate(model, fields)
            if uploads:
                return params, *await read_upload(next(iter(uploads.values())), max_bytes)
            encoded = getattr(params, upload_field, None)
            audio = decode_base64(encoded, upload_field, max_bytes) if encoded else None
            return params, audio, ".wav"
        finally:
            await form.close()
    raise UnsupportedMediaType(
        f"content type {kind or '(none)'!r} is not accepted here: "
        "send application/json or multipart/form-data"
    )


def split_form(
    form: FormData, file_fields: Collection[str], file_hint: str
) -> tuple[dict[str, Any], dict[str, UploadFile]]:
    """A form's text fields (each at most once; empty ones left out) and its files (each at most once,
    only under `file_fields`); InputError otherwise, ending in `file_hint` for a file elsewhere."""
    fields: dict[str, Any] = {}
    files: dict[str, UploadFile] = {}
    for name, value in form.multi_items():
        if isinstance(value, str):
            if name in fields:
                raise InputError(f"form field {name!r} was given more than once")
            if value != "":
                fields[name] = value
        elif name in file_fields and name not in files:
            files[name] = value
        else:
            raise InputError(f"unexpected file in form field {name!r}: {file_hint}")
    return fields, files


def field_names(model: type[BaseModel], field: str) -> tuple[str, ...]:
    """Every name a body may use for `field`: its validation aliases, or the field's own name."""
    alias = model.model_fields[field].validation_alias
    if isinstance(alias, AliasChoices):
        return tuple(choice for choice in alias.choices if isinstance(choice, str))
    return (alias,) if isinstance(alias, str) else (field,)


def _at_most_one(names: tuple[str, ...], given: list[str]) -> None:
    if len(given) > 1:
        raise InputError(f"give the recording once, as one of {', '.join(names)}: got {', '.join(given)}")


async def _json_object(request: Request) -> dict[str, Any]:
    data = parse_json(await request.body(), "the body")
    if not isinstance(data, dict):
        raise InputError(f"the body must be a JSON object, got {type(data).__name__}")
    return data


def parse_json(raw: bytes | str, what: str) -> Any:
    """`json.loads` that refuses nesting deeper than MAX_JSON_DEPTH with an InputError (no request needs
    it, and deep nesting would exhaust the recursion limit of the parser or of the validation after it)."""
    try:
        data = json.loads(raw)
    except RecursionError:
        raise InputError(f"{what} is nested too deeply: at most {MAX_JSON_DEPTH} levels") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"{what} is not valid JSON: {exc}") from None
    if json_depth(data) > MAX_JSON_DEPTH:
        raise InputError(f"{what} is nested too deeply: at most {MAX_JSON_DEPTH} levels")
    return data


def json_depth(value: Any) -> int:
    """Nesting depth of parsed JSON (a scalar is 0, `[]` is 1), without recursion."""
    depth, level = 0, [(value, 0)]
    while level:
        item, at = level.pop()
        if isinstance(item, (dict, list)):
            depth = max(depth, at + 1)
            if depth > MAX_JSON_DEPTH:
                return depth
            children = item.values() if isinstance(item, dict) else item
            level.extend((child, at + 1) for child in children)
    return depth


def validate(model: type[Params], data: dict[str, Any]) -> Params:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = [
            {**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False, include_input=False)
        ]
        raise RequestValidationError(errors) from None


def decode_base64(text: str, field: str, max_bytes: int) -> bytes:
    """Base64 (or a `data:…;base64,` URL) to bytes; 413 past `max_bytes`, 400 when it is not base64."""
    if text.startswith("data:"):
        _, sep, text = text.partition(",")
        if not sep:
            raise InputError(f"{field}: a data: URL needs a comma before the base64 data")
    text = "".join(text.split())
    if len(text) * 3 // 4 > max_bytes:
        raise PayloadTooLarge(f"{field} is larger than the upload limit of {max_bytes / 1e6:.1f} MB")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InputError(f"{field} is not valid base64: send the recording's bytes base64-encoded") from None


async def read_upload(upload: UploadFile, max_bytes: int) -> tuple[bytes, str]:
    """The uploaded file's bytes and suffix; 415 for a non-audio name or type, 413 past `max_bytes`."""
    suffix = PurePath(upload.filename or "").suffix.lower()
    if suffix and suffix not in AUDIO_SUFFIXES:
        raise UnsupportedMediaType(
            f"{upload.filename!r} is not an audio file this server reads: use {AUDIO_SUFFIX_LIST}"
        )
    content_type = (upload.content_type or "").split(";")[0].strip().lower()
    if content_type and not content_type.startswith(AUDIO_TYPES):
        raise UnsupportedMediaType(f"the upload's content type {content_type!r} is not audio")
    advice = ": send a shorter recording (cloning uses 3-30 s) or a compressed one (mp3, flac)"
    return await read_limited(upload, max_bytes, "the upload", advice), suffix or ".wav"


async def read_limited(upload: UploadFile, max_bytes: int, what: str, advice: str = "") -> bytes:
    """An uploaded file's bytes, read in pieces and refused (413) as soon as they pass `max_bytes`, or
    (400) when there are none; `what` names it in the message ("the upload", "the file"), `advice` (": …")
    says what to send instead."""
    pieces: list[bytes] = []
    size = 0
    while piece := await upload.read(READ_PIECE):
        size += len(piece)
        if size > max_bytes:
            raise PayloadTooLarge(f"{what} is larger than the limit of {max_bytes / 1e6:.1f} MB{advice}")
        pieces.append(piece)
    if not size:
        raise InputError("the uploaded file is empty")
    return b"".join(pieces)


def parse_lexicon(value: Any) -> dict[str, str] | None:
    """A lexicon from JSON (object) or form text (JSON object as a string)."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            value = parse_json(value, "lexicon")
        except InputError as exc:
            raise LexiconError(f'{exc}; give a JSON object such as {{"重庆": "[chóng qìng]"}}') from None
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise LexiconError("lexicon must map words (strings) to pronunciations (strings)")
    check_lexicon_size(value)
    return value


async def with_transcript(service: Any, params: Any, audio: bytes | None) -> Any:
    """`params.to_request(audio)`, with `prompt_text` transcribed from the recording when the caller
    asked for it (`transcribe=true`) and gave none."""
    request = params.to_request(audio)
    if not getattr(params, "transcribe", False) or params.prompt_text or params.voice:
        return request
    if audio is None:
        raise InputError("transcribe=true needs prompt_wav: there is nothing to transcribe")
    words = await run_in_threadpool(transcribe, service.settings.engine.asr_model, audio)
    return dataclasses.replace(request, prompt_text=words)
