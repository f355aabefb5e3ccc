"""Request dependencies: the service object and who is calling (API key, UI session or nobody).

Credentials: `Authorization: Bearer <key>` or `X-API-Key: <key>` for the API, the session cookie for the
web UI. With auth off (no key exists, none required, no UI login), callers are anonymous with full
rights, whatever key they send (OpenAI SDKs always send one): that is only allowed on a loopback address
or with --insecure (see `Settings.check_startup_safety`).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request
from starlette.concurrency import run_in_threadpool

from cosyserve.service.access.sessions import SESSION_COOKIE
from cosyserve.service.app_state import AuthRequired, Forbidden, Principal, Service
from cosyserve.service.requests import OutputSpec


def get_service(request: Request) -> Service:
    return request.app.state.service


def request_id(request: Request) -> str | None:
    return request.scope.get("state", {}).get("request_id")


def presented_key(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    key = request.headers.get("x-api-key", "").strip()
    return key or None


async def current_principal(request: Request) -> Principal:
    """Authenticate the request (once) and apply the key's rate limit."""
    cached = getattr(request.state, "principal", None)
    if cached is not None:
        return cached
    service = get_service(request)
    key_text = presented_key(request)
    key = await run_in_threadpool(service.keys.authenticate, key_text) if key_text is not None else None
    if key is not None:
        principal = Principal("key", key.role, key=key, name=key.name)
    elif (user := service.sessions.verify(request.cookies.get(SESSION_COOKIE))) is not None:
        principal = Principal("session", "admin", name=user)
    elif not await run_in_threadpool(service.auth_enabled):
        principal = Principal("anonymous", "admin")  # e.g. an OpenAI SDK's placeholder key, auth off
    elif key_text is not None:
        raise AuthRequired("the API key is not valid (unknown, malformed or revoked)")
    else:
        raise AuthRequired(
            "this server requires an API key: send `Authorization: Bearer <key>` or `X-API-Key: <key>` "
            "(create keys with `cosyserve keys create`)"
        )
    service.check_rate(principal)
    request.state.principal = principal
    return principal


CurrentPrincipal = Annotated[Principal, Depends(current_principal)]


async def require_admin(principal: CurrentPrincipal) -> Principal:
    if not principal.is_admin:
        raise Forbidden("this needs an admin API key (`cosyserve keys create NAME --role admin`)")
    return principal


def can_see(principal: Principal, owner: str | None) -> bool:
    """Admins see everything; other callers only what they own."""
    return principal.is_admin or (owner is not None and owner == principal.owner)


AdminPrincipal = Annotated[Principal, Depends(require_admin)]


def output_spec(request: Request, principal: Principal, endpoint: str, **fields: Any) -> OutputSpec:
    """How and for whom a result is stored: the caller, the request id, the endpoint, plus `fields`."""
    return OutputSpec(
        owner=principal.owner, key=principal.key, request_id=request_id(request), endpoint=endpoint, **fields
    )
