"""One JSON error envelope for every 4xx/5xx: `{"error": {"code", "message", "request_id"}}`.

Exceptions get their status and code from the one error table (`cosyserve.errors.ERROR_TABLE`). Failures
of scheduled work were already logged and counted by the scheduler (`mark_counted`); everything else is
logged with its reason and counted once here. A 500 never carries a stack trace: its message names the
request id to look up in the log.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from cosyserve.errors import OUT_OF_MEMORY_RETRY_AFTER_S, CosyServeError, error_kind, is_database_damaged
from cosyserve.errors import PayloadTooLarge as PayloadTooLarge  # defined there, with the error table
from cosyserve.errors import UnsupportedMediaType as UnsupportedMediaType
from cosyserve.service.logs import get_request_id, log_failure

log = logging.getLogger(__name__)
_COUNTED = "_cosyserve_counted"
E = TypeVar("E", bound=BaseException)


class BodyTooLarge(StarletteHTTPException):
    """Raised while a body is being read; an HTTPException so body parsers pass it through unchanged."""

    def __init__(self, upload_limit_bytes: int, path: str = "") -> None:
        super().__init__(413, body_too_large_message(upload_limit_bytes, path))


def body_too_large_message(upload_limit_bytes: int, path: str = "") -> str:
    """Names the limit as configured (`max_upload_mb`), not the body cap derived from it, and what the
    request at `path` sends (a file to verify, else a recording)."""
    limit = f"{upload_limit_bytes / 1e6:g} MB (max_upload_mb)"
    if path.rstrip("/") == "/v1/verify":
        return (
            f"the file is too large to verify here: uploads are limited to {limit}; check a longer file "
            "with `cosyserve verify` on the server"
        )
    route = path.rstrip("/")
    if route in ("/v1/batches", "/v1/dub"):
        return (
            f"the request body is too large: a script or subtitle file (and any recording with it) is "
            f"limited to {limit}; split it into several batches"
        )
    if route in ("/v1/tts", "/v1/jobs", "/v1/audio/speech"):
        return (
            f"the request body is too large: a text with its recording is limited to {limit}, the "
            "recording as a file upload or as base64 in JSON"
        )
    return (
        f"the request body is too large: recordings are limited to {limit}, as a file upload or as base64 "
        "in JSON"
    )


def body_cap_bytes(upload_limit_bytes: int) -> int:
    """The largest body a request may have: the upload as base64 (4/3 of its bytes) plus 1 MB of fields."""
    return upload_limit_bytes * 4 // 3 + (1 << 20)


_HTTP_CODES = {
    400: "bad_request",
    401: "auth_required",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
    429: "rate_limited",
    503: "unavailable",
}


def mark_counted(exc: BaseException, job_id: str | None = None) -> BaseException:
    """Flag a failure of job `job_id` that the scheduler already logged and counted."""
    with contextlib.suppress(AttributeError):  # exceptions with __slots__ stay unmarked
        setattr(exc, _COUNTED, job_id or True)
    return exc


def reworded(exc: E, message: str) -> E:
    """`exc` again with another message, still flagged as counted if it was (a new one lost the flag, and
    the failure was counted and logged twice)."""
    again = type(exc)(message)
    counted = getattr(exc, _COUNTED, None)
    if counted:
        mark_counted(again, counted if isinstance(counted, str) else None)
    return again


CLIENT_CLOSED = 499  # as nginx logs a request its client closed before the answer

# OpenAI's error `type` by status: its SDKs and code written for it read `type` (and `param`) beside
# `message` and `code`, which every envelope also carries.
_OPENAI_TYPES = {401: "authentication_error", 403: "permission_error", 429: "rate_limit_error"}
# Worth no retry by an SDK that retries 408, 409, 429 and 5xx on its own: the same request fails again
# (a timeout ran a whole attempt, a conflict or a cancel stands); the header is what OpenAI's SDKs obey.
NOT_RETRIED = {"timeout", "cancelled", "conflict", "quota_exceeded", "voice_in_use", "voice_unavailable"}


def error_body(
    status: int, code: str, message: str, request_id: str | None, param: str | None = None
) -> dict[str, Any]:
    """The envelope's body: `{"error": {"code", "message", "request_id", "type", "param"}}`."""
    kind = "insufficient_quota" if code == "quota_exceeded" else _OPENAI_TYPES.get(status)
    if kind is None:
        kind = "server_error" if status >= 500 else "invalid_request_error"
    return {
        "error": {"code": code, "message": message, "request_id": request_id, "type": kind, "param": param}
    }


def envelope(
    status: int,
    code: str,
    message: str,
    headers: dict[str, str] | None = None,
    param: str | None = None,
) -> JSONResponse:
    headers = dict(headers or {})
    if code in NOT_RETRIED:
        headers.setdefault("x-should-retry", "false")
    return JSONResponse(error_body(status, code, message, get_request_id(), param), status, headers)


def classify(exc: BaseException) -> tuple[int, str]:
    """The HTTP status and code of `exc`, from the error table (`errors.ERROR_TABLE`)."""
    kind = error_kind(exc)
    return kind.status, kind.code


def storage_message(exc: BaseException) -> str:
    """What a caller is told of a full or failing disk or database, without the driver's text."""
    where = f"the server log has the details under request id {get_request_id()}"
    if is_database_damaged(exc):
        return f"the server's database is damaged: an administrator must restore it from a backup ({where})"
    return f"the server's storage is full or out of file handles: retry later ({where})"


def error_response(exc: BaseException, metrics: Any = None) -> JSONResponse:
    """The envelope for any exception, logged and counted unless the scheduler already did."""
    status, code = classify(exc)
    headers: dict[str, str] = {}
    retry = getattr(exc, "retry_after_s", None)
    if code == "out_of_memory" and retry is None:
        retry = OUT_OF_MEMORY_RETRY_AFTER_S
    if status in (429, 503) and retry is not None:
        headers["Retry-After"] = str(max(1, int(retry)))
    if getattr(exc, "held_only", False):  # the key's own running work holds the rest: soon retried
        headers["x-should-retry"] = "true"
    if status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="cosyserve"'
    if status == 500:
        message = f"internal error: the server log has the details under request id {get_request_id()}"
    elif code == "storage_error" and not isinstance(exc, CosyServeError):  # a driver's text names its SQL
        message = storage_message(exc)
    else:
        message = str(exc) or code.replace("_", " ")
    reason = str(exc) or type(exc).__name__
    job_id = getattr(exc, _COUNTED, None)
    if job_id:
        # The scheduler logged it (with any traceback) under its job id; this line ties it to the request.
        extra = {"job_id": job_id} if isinstance(job_id, str) else {}
        log_failure(code, reason, level=logging.INFO, status=status, **extra)
    else:
        level = logging.INFO if status < 500 else None
        log_failure(code, reason, exc=exc, level=level, status=status)
        if metrics is not None:
            metrics.count_error(code)
    return envelope(status, code, message, headers, param=getattr(exc, "param", None))


def naming(exc: Exception, param: str) -> Exception:
    """`exc` marked as about the request field `param` (OpenAI's `param` in the envelope)."""
    exc.param = param  # type: ignore[attr-defined]
    return exc


def install_error_handlers(app: FastAPI) -> None:
    def metrics(request: Request) -> Any:
        service = getattr(request.app.state, "service", None)
        return service.metrics if service is not None else None

    async def on_cosyserve_error(request: Request, exc: Exception) -> JSONResponse:
        return error_response(exc, metrics(request))

    async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        code = _HTTP_CODES.get(exc.status_code, f"http_{exc.status_code}")
        message = exc.detail if isinstance(exc.detail, str) else code.replace("_", " ")
        if exc.status_code == 400 and message == "There was an error parsing the body":  # FastAPI's own
            code, message = (
                "invalid_input",
                (
                    "the body could not be read (not valid JSON, or nested too deeply): send a JSON object "
                    "with Content-Type: application/json"
                ),
            )
        if exc.status_code == 404 and message == "Not Found":
            message = f"no such endpoint: {request.method} {request.url.path} (see /docs)"
        elif exc.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path} (see /docs)"
        log_failure(code, message, level=logging.INFO, status=exc.status_code)
        m = metrics(request)
        if m is not None:
            m.count_error(code)
        return envelope(exc.status_code, code, message, dict(exc.headers or {}))

    async def on_validation_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        message = describe_validation_errors(exc.errors())
        # OpenAI answers a bad parameter with 400 (its SDKs raise BadRequestError; a 422 is another class)
        status = 400 if request.url.path in OPENAI_ROUTES else 422
        code = "invalid_request"
        if any(error.get("type") == "json_invalid" for error in exc.errors()):
            status, code = 400, "invalid_input"  # as every route that reads its JSON itself answers
        log_failure(code, message, level=logging.INFO, status=status)
        m = metrics(request)
        if m is not None:
            m.count_error(code)
        return envelope(status, code, message, param=first_field(exc.errors()))

    async def on_disconnect(request: Request, exc: Exception) -> Response:
        # the client hung up mid-body: nobody reads the answer; not a server error (it was a 500 with a
        # 56-line traceback each, which paged on error rates and flooded the admin's log view)
        log_failure("client_disconnected", f"{request.method} {request.url.path}", level=logging.INFO)
        return Response(status_code=CLIENT_CLOSED)

    app.add_exception_handler(ClientDisconnect, on_disconnect)
    app.add_exception_handler(CosyServeError, on_cosyserve_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)


OPENAI_ROUTES = frozenset({"/v1/audio/speech"})


def _where(error: Any) -> str:
    loc = [str(p) for p in error.get("loc", ()) if p not in ("body", "query", "path", "header")]
    return ".".join(loc)


def first_field(errors: Any) -> str | None:
    """The first field a validation error names (OpenAI's `param`), or None for the body as a whole."""
    for error in list(errors)[:1]:
        if error.get("type") != "json_invalid":
            return _where(error) or None
    return None


def describe_validation_errors(errors: Any) -> str:
    """`field: what is wrong; …` without echoing the submitted values (they may be large or secret)."""
    parts = []
    for error in list(errors)[:10]:
        if error.get("type") == "json_invalid":  # it read "0: JSON decode error"
            why = (error.get("ctx") or {}).get("error") or "not JSON"
            parts.append(
                f"the body is not valid JSON ({why}): send a JSON object with Content-Type: application/json"
            )
            continue
        parts.append(f"{_where(error) or 'body'}: {error.get('msg', 'invalid')}")
    return "invalid request: " + "; ".join(parts) if parts else "invalid request"
