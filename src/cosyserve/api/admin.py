"""Admin (admin role): engine restart, recent logs, status, API keys (list with today's usage, revoke, change
role, quota and rate limit); and the web UI's login session."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Depends, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from cosyserve.api.admin_schemas import KeyCreate, KeyUpdate, LoginBody
from cosyserve.api.deps import CurrentPrincipal, get_service, require_admin
from cosyserve.api.schemas import ERRORS
from cosyserve.errors import Forbidden, InputError, error_code
from cosyserve.service.access import key_admin
from cosyserve.service.access.sessions import AUTH_COOKIES, LEGACY_KEY_COOKIE, SESSION_COOKIE
from cosyserve.service.activity import log_activity
from cosyserve.service.assembly import Service
from cosyserve.service.logs import recent_logs
from cosyserve.service.stores.keys import KEEP, ApiKey

router = APIRouter(prefix="/admin", tags=["admin"], dependencies=[Depends(require_admin)])
session_router = APIRouter(tags=["auth"])


@router.post(
    "/engine/restart", status_code=202, responses=ERRORS, summary="Free the model's memory and reload"
)
def restart_engine(request: Request, principal: CurrentPrincipal) -> dict[str, Any]:
    name = principal.name or principal.owner
    try:
        state = get_service(request).backend.restart_engine()
    except Exception as exc:
        log_activity("restart", error_code(exc), who=name, endpoint="api")
        raise
    log_activity("restart", "ok", who=name, endpoint="api", state=state)
    return {"state": state, "message": "reloading the model; GET /ready turns true when it is back"}


@router.get("/logs", responses=ERRORS, summary="Recent log lines (newest last)")
def logs(
    limit: int = Query(100, ge=1, le=1000),
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] | None = None,
) -> dict[str, Any]:
    return {"object": "list", "data": recent_logs(limit, level)}


@router.get("/status", responses=ERRORS, summary="Scheduler, model, storage and sync state")
def status(request: Request) -> dict[str, Any]:
    service = get_service(request)
    s3 = service.s3
    return {
        "readiness": service.readiness(detailed=True),
        "scheduler": service.scheduler.stats(),
        "outputs": {"root": str(service.outputs.root), "total_bytes": service.outputs.total_bytes()},
        "s3": None
        if s3 is None
        else {"bucket": s3.bucket, "uploaded": s3.uploaded, "failed": s3.failed_count, "retries": s3.retries},
        "settings": service.settings.public_dict(),
    }


@router.get("/keys", responses=ERRORS, summary="API keys with today's audio usage")
def list_keys(request: Request, include_revoked: bool = True) -> dict[str, Any]:
    service = get_service(request)
    keys = service.keys.list(include_revoked=include_revoked)
    return {"object": "list", "data": [_key_view(service, key) for key in keys]}


@router.post(
    "/keys",
    status_code=201,
    responses=ERRORS,
    summary="Create a key (returned once, as `key`; only its hash is stored)",
)
def create_key(body: KeyCreate, request: Request, principal: CurrentPrincipal) -> dict[str, Any]:
    if principal.kind == "anonymous":  # auth is off: any local program would switch it on for everyone
        raise Forbidden(
            "authentication is off on this server: create the first key on the server itself, "
            "`cosyserve keys create NAME --role admin` (it turns authentication on)"
        )
    service = get_service(request)
    key, plaintext = key_admin.create_key(
        service.keys,
        who=principal.name or principal.owner,
        endpoint="api",
        name=body.name,
        role=body.role,
        quota=body.daily_audio_seconds_quota,
        rate_limit=body.rate_limit_per_minute,
    )
    return {**_key_view(service, key), "key": plaintext}


@router.post("/keys/{key_id}/revoke", responses=ERRORS, summary="Revoke a key (its running work stops too)")
def revoke_key(key_id: str, request: Request, principal: CurrentPrincipal) -> dict[str, Any]:
    service = get_service(request)
    who = principal.name or principal.owner
    key = key_admin.revoke_key(service.keys, key_id, who=who, endpoint="api")  # 404: no such key
    return _key_view(service, key)


@router.post(
    "/keys/{key_id}/rotate",
    responses=ERRORS,
    summary="Give a key a new secret on the same id (returned once, as `key`); the old one stops working",
)
def rotate_key(key_id: str, request: Request, principal: CurrentPrincipal) -> dict[str, Any]:
    service = get_service(request)
    who = principal.name or principal.owner
    key, plaintext = key_admin.rotate_key(service.keys, key_id, who=who, endpoint="api")
    return {**_key_view(service, key), "key": plaintext}


@router.patch("/keys/{key_id}", responses=ERRORS, summary="Change a key's role, daily quota or rate limit")
def update_key(key_id: str, body: KeyUpdate, request: Request, principal: CurrentPrincipal) -> dict[str, Any]:
    service = get_service(request)
    given = body.model_fields_set
    if not given:
        raise InputError("nothing to change: give role, daily_audio_seconds_quota or rate_limit_per_minute")
    if "role" in given and body.role is None:  # (null is "the server default" only for the numbers)
        raise InputError("role cannot be null: give admin or user")
    key = key_admin.update_key(
        service.keys,
        key_id,
        who=principal.name or principal.owner,
        endpoint="api",
        role=body.role,
        quota=body.daily_audio_seconds_quota if "daily_audio_seconds_quota" in given else KEEP,
        rate_limit=body.rate_limit_per_minute if "rate_limit_per_minute" in given else KEEP,
    )
    return _key_view(service, key)


def _key_view(service: Service, key: ApiKey) -> dict[str, Any]:
    """A key as admins see it (never its hash): its settings, and today's usage against its quota."""
    return key_admin.key_view(service.access.quota, key)


@session_router.post("/auth/login", responses=ERRORS, summary="Web UI login: sets the session cookie")
async def login(body: LoginBody, request: Request, response: Response) -> dict[str, Any]:
    service = get_service(request)
    # One login at a time: the browser's current session ends whatever the outcome.
    await run_in_threadpool(service.access.logout, request.cookies.get(SESSION_COOKIE))
    response.delete_cookie(LEGACY_KEY_COOKIE, path="/", httponly=True, samesite="lax")
    try:
        token = await run_in_threadpool(service.access.login, body.username, body.password)
    except Exception as exc:
        log_activity("login", error_code(exc), who=service.access.logged_name(body.username), endpoint="api")
        raise
    log_activity("login", "ok", who=service.access.logged_name(body.username), endpoint="api")
    response.set_cookie(**service.access.session_cookie(token, secure=request.url.scheme == "https"))
    return {"user": body.username}


@session_router.post("/auth/logout", summary="End the web UI session")
async def logout(request: Request, response: Response) -> dict[str, Any]:
    await run_in_threadpool(get_service(request).access.logout, request.cookies.get(SESSION_COOKIE))
    for name in AUTH_COOKIES:
        response.delete_cookie(name, path="/", httponly=True, samesite="lax")
    return {"user": None}


@session_router.get("/v1/me", responses=ERRORS, summary="Who the server thinks you are")
def whoami(request: Request, principal: CurrentPrincipal) -> dict[str, Any]:
    service = get_service(request)
    quota = None
    if principal.key is not None:
        status = service.access.quota.check(principal.key)
        quota = {
            "used_s": status.used_s,
            "limit_s": status.limit_s,
            "resets_at": status.resets_at,
            "reserved_s": status.reserved_s,  # held by requests and jobs still running
        }
    return {
        "kind": principal.kind,
        "role": principal.role,
        "name": principal.name,
        "key_prefix": principal.key.prefix if principal.key else None,
        "owner": principal.owner,  # what your jobs and outputs record as theirs (the web UI's session watch)
        "quota": quota,
        "auth_enabled": service.access.auth_enabled(),
    }
