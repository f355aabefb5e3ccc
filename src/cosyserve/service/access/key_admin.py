"""API key administration that the admin REST routes (`api/admin.py`) and the web UI's admin tab
(`ui/bridge.py`) share: how an admin sees a key (settings and today's usage, never its hash), and the
changes (create, revoke, quota/role/rate limit), each written to the activity log with who made it."""

from __future__ import annotations

from typing import Any

from cosyserve.errors import InputError
from cosyserve.service.access.quota import QuotaTracker
from cosyserve.service.activity import log_activity
from cosyserve.service.stores.keys import KEEP, ApiKey, KeyStore


def key_view(quota: QuotaTracker, key: ApiKey) -> dict[str, Any]:
    """A key as admins see it: its settings, and today's usage against its quota (seconds produced, seconds
    reserved by work still running, the limit in force and when the day resets)."""
    status = quota.check(key)
    usage = {
        "used_s": round(status.used_s, 3),
        "reserved_s": round(status.reserved_s, 3),
        "limit_s": status.limit_s,
        "resets_at": status.resets_at,
    }
    return {**key.public(), "active": key.active, "usage_today": usage}


def create_key(
    keys: KeyStore,
    *,
    who: str | None,
    endpoint: str,
    name: str,
    role: str = "user",
    quota: float | None = None,
    rate_limit: int | None = None,
) -> tuple[ApiKey, str]:
    """A new key and its plaintext (shown once: only its hash is stored); InputError for a bad name,
    role, quota or rate limit."""
    key, plaintext = keys.create(name, role=role, rate_limit=rate_limit, quota=quota)
    log_activity("key_create", "ok", who=who, endpoint=endpoint, key_id=key.id, role=key.role)
    return key, plaintext


def revoke_key(keys: KeyStore, key_id: int | str, *, who: str | None, endpoint: str) -> ApiKey:
    """Revoke the key with this numeric id (KeyNotFound otherwise); its running work stops too."""
    target = keys.get(key_id)  # type: ignore[arg-type]  # get: KeyNotFound for a prefix
    _keep_an_admin(keys, target, "revoke")
    key = keys.revoke(target.id)
    log_activity("key_revoke", "ok", who=who, endpoint=endpoint, key_id=key.id)
    return key


def update_key(
    keys: KeyStore,
    key_id: int | str,
    *,
    who: str | None,
    endpoint: str,
    role: str | None = None,
    quota: float | object | None = KEEP,
    rate_limit: int | object | None = KEEP,
) -> ApiKey:
    """Change a key's role, daily quota (None: the server default) or rate limit; KEEP leaves one as it is."""
    if role is not None and role != "admin":
        _keep_an_admin(keys, keys.get(key_id), "make a user key of")  # type: ignore[arg-type]
    key = keys.update(key_id, role=role, quota=quota, rate_limit=rate_limit)
    changes = {"role": KEEP if role is None else role, "daily_audio_seconds_quota": quota}
    changes["rate_limit_per_minute"] = rate_limit
    changed = sorted(name for name, value in changes.items() if value is not KEEP)
    log_activity("key_update", "ok", who=who, endpoint=endpoint, key_id=key.id, changed=changed)
    return key


def _keep_an_admin(keys: KeyStore, target: ApiKey, change: str) -> None:
    """InputError when `target` is the last admin key in use: the admin routes and the Admin tab would
    answer nobody (only a shell on the server could make a new admin key)."""
    if target.role != "admin" or target.revoked_at is not None:
        return
    admins = [key for key in keys.list(include_revoked=False) if key.role == "admin"]
    if [key.id for key in admins] == [target.id]:
        raise InputError(
            f"key {target.id} is the last admin key: create another admin key first, then {change} this one"
        )
