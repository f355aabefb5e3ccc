"""API key administration that the admin REST routes (`api/admin.py`) and the web UI's admin tab
(`ui/bridge.py`) share: how an admin sees a key (settings and today's usage, never its hash), and the
changes (create, revoke, quota/role/rate limit), each written to the activity log with who made it."""

from __future__ import annotations

from typing import Any

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
    key = keys.revoke(target.id, keep_an_admin=True)  # the last admin key in use stays (InputError)
    log_activity("key_revoke", "ok", who=who, endpoint=endpoint, key_id=key.id)
    return key


def rotate_key(keys: KeyStore, key_id: int | str, *, who: str | None, endpoint: str) -> tuple[ApiKey, str]:
    """A new secret for the active key with this numeric id, on the same id (`KeyStore.rotate`)."""
    target = keys.get(key_id)  # type: ignore[arg-type]  # get: KeyNotFound for a prefix
    key, plaintext = keys.rotate(target.id)
    log_activity("key_rotate", "ok", who=who, endpoint=endpoint, key_id=key.id)
    return key, plaintext


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
    key = keys.update(key_id, role=role, quota=quota, rate_limit=rate_limit, keep_an_admin=True)
    changes = {"role": KEEP if role is None else role, "daily_audio_seconds_quota": quota}
    changes["rate_limit_per_minute"] = rate_limit
    changed = sorted(name for name, value in changes.items() if value is not KEEP)
    log_activity("key_update", "ok", who=who, endpoint=endpoint, key_id=key.id, changed=changed)
    return key
