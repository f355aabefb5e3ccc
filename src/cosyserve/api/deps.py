"""Request dependencies: the service object and who is calling (API key, UI session or nobody).

Credentials: `Authorization: Bearer <key>` or `X-API-Key: <key>` for the API, the session cookie for the
web UI. With auth off (no key exists, none required, no UI login), callers are anonymous with full
rights, whatever key they send (OpenAI SDKs always send one): that is only allowed on a loopback address
or with --insecure (see `Settings.check_startup_safety`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Annotated, Any

from fastapi import Depends, Request
from starlette.concurrency import run_in_threadpool
from starlette.requests import cookie_parser

from cosyserve.limits import upload_bytes
from cosyserve.service.access import voice_rules
from cosyserve.service.access.principals import AuthRequired, Forbidden, Principal
from cosyserve.service.access.sessions import SESSION_COOKIE, header_key
from cosyserve.service.assembly import Service
from cosyserve.service.requests import OutputSpec
from cosyserve.service.stores.voices import Voice


def get_service(request: Request) -> Service:
    return request.app.state.service


def upload_limit(request: Request) -> int:
    """The largest upload this server takes, in bytes (`max_upload_mb`)."""
    return upload_bytes(get_service(request).settings.limits.max_upload_mb)


def request_id(request: Request) -> str | None:
    return request.scope.get("state", {}).get("request_id")


def presented_key(request: Request) -> str | None:
    return header_key(request.headers)


def admitted(service: Service) -> Callable[[Mapping[str, str]], bool]:
    """For the middleware (`ApiMiddleware.admit`): whether a request's headers carry credentials that let
    it in (a valid key or a live session; anyone while the server has no authentication)."""

    def admit(headers: Mapping[str, str]) -> bool:
        if not service.access.auth_enabled():
            return True
        session = cookie_parser(headers.get("cookie", "")).get(SESSION_COOKIE)
        return service.access.identify(header_key(headers), session, touch=False) is not None

    return admit


# sent by requests a page makes by itself (`ui/assets.SESSION_WATCH`): they keep no session from idling out
PASSIVE_HEADER = "x-cosyserve-passive"


def is_read(request: Request) -> bool:
    """Whether a request only reads (its own rate allowance): a GET or HEAD, but not a voice preview of a
    text, which synthesises as a POST to /v1/tts does."""
    if request.method not in ("GET", "HEAD"):
        return False
    return not (request.url.path.rstrip("/").endswith("/preview") and "text" in request.query_params)


async def current_principal(request: Request) -> Principal:
    """Authenticate the request (once) and apply the key's rate limit."""
    cached = getattr(request.state, "principal", None)
    if cached is not None:
        return cached
    access = get_service(request).access
    key_text = presented_key(request)
    session = request.cookies.get(SESSION_COOKIE)
    touch = request.headers.get(PASSIVE_HEADER) is None  # the page's own session check: not activity
    principal = await run_in_threadpool(functools.partial(access.identify, touch=touch), key_text, session)
    if principal is None and key_text is not None:
        raise AuthRequired("the API key is not valid (unknown, malformed or revoked)")
    if principal is None and session:  # (it was told to send an API key)
        raise AuthRequired(
            "your sign-in has ended (it expired, or its key was revoked, rotated or given another role): "
            "sign in again on the web page, or send an API key"
        )
    if principal is None:
        raise AuthRequired(
            "this server requires an API key: send `Authorization: Bearer <key>` or `X-API-Key: <key>` "
            "(create keys with `cosyserve keys create`)"
        )
    access.check_rate(principal, read=is_read(request))
    request.state.principal = principal
    return principal


CurrentPrincipal = Annotated[Principal, Depends(current_principal)]


async def require_admin(principal: CurrentPrincipal) -> Principal:
    if not principal.is_admin:
        raise Forbidden("this needs an admin API key (`cosyserve keys create NAME --role admin`)")
    return principal


AdminPrincipal = Annotated[Principal, Depends(require_admin)]


def usable_voice(request: Request, principal: Principal, id_or_name: str) -> Voice:
    """The saved voice `principal` may use: their own or a shared one (404 `voice_not_found` for any
    other, the same as for a missing one)."""
    return get_service(request).voices.get(id_or_name, principal.voices)


def output_spec(request: Request, principal: Principal, endpoint: str, **fields: Any) -> OutputSpec:
    """How and for whom a result is stored: the caller, the request id, the endpoint, plus `fields`."""
    return OutputSpec(
        owner=principal.owner, key=principal.key, request_id=request_id(request), endpoint=endpoint, **fields
    )


def record_recording_consent(
    request: Request, principal: Principal, spec: OutputSpec, *, recording: bool, consent: bool
) -> None:
    """For a request that clones a recording (`recording`): ConsentRequired where a user key did not
    confirm the consent statement; a confirmed consent is kept in the output's manifest."""
    if not recording:
        return
    auth = get_service(request).settings.auth
    record = voice_rules.recording_consent(principal, auth, consent=consent)
    if record is not None:
        spec.extra["consent"] = record
