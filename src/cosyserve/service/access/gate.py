"""The gate every request passes: is authentication on, who is calling, may they go ahead (rate limit,
daily quota), and signed links that stand in for credentials.

The API and the web UI both resolve callers here, from the same credentials: an API key (a header), the
session cookie a login hands out (`stores.ui_sessions`: an opaque token, never the key itself), or nobody
when the server has no authentication at all. A session is checked against its credential at every
request: a key session ends when the key is revoked, deleted or given another role; a password session
ends when the UI user name or password is changed.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from typing import Any

import sqlalchemy as sa

from cosyserve.service.access import signing
from cosyserve.service.access.limits import QuotaTracker, RateLimiter
from cosyserve.service.access.principals import AuthRequired, Principal, QuotaExceeded, RateLimited
from cosyserve.service.access.quota_days import HELD_RETRY_AFTER_S, seconds_until_reset
from cosyserve.service.access.sessions import SESSION_COOKIE, check_password
from cosyserve.service.settings import Settings
from cosyserve.service.stores.db import metadata
from cosyserve.service.stores.keys import ApiKey, KeyNotFound, KeyStore
from cosyserve.service.stores.ui_sessions import UiSession, UiSessionStore

AUTH_CACHE_S = 2.0  # how long "does any API key exist?" is cached (keys are made by another process)


class Access:
    """Authentication, authorisation and per-key limits for one service."""

    def __init__(
        self, settings: Settings, keys: KeyStore, engine: sa.Engine, sessions: UiSessionStore | None = None
    ) -> None:
        self.auth = settings.auth
        self.keys = keys
        self.quota = QuotaTracker(
            engine,
            metadata,
            default_daily_seconds=settings.limits.daily_audio_seconds_quota,
            reservation_ttl_s=settings.limits.quota_reservation_ttl_s,
        )
        self.rate_limiter = RateLimiter(settings.limits.rate_limit_per_minute)
        self._secret = settings.resolve_signing_secret().get_secret_value()
        signing.signature(signing.URL_PURPOSE, "", 0, self._secret)  # refuse a weak secret now, not at use
        self.sessions = sessions or UiSessionStore(
            engine, metadata, idle_s=self.auth.ui_session_idle_s, max_age_s=self.auth.ui_session_max_s
        )
        self._auth_cache: tuple[float, bool] = (0.0, False)

    def any_key(self) -> bool:
        """Whether any API key is active (the database is asked every time)."""
        return bool(self.keys.list(include_revoked=False))

    def auth_enabled(self) -> bool:
        """Whether requests must authenticate: keys required, any key exists, or a UI login is set."""
        if self.auth.api_keys_required or self.auth.ui_login_configured:
            return True
        checked_at, exists = self._auth_cache
        if time.monotonic() - checked_at > AUTH_CACHE_S:
            exists = self.any_key()
            self._auth_cache = (time.monotonic(), exists)
        return exists

    def identify(
        self, key_text: str | None, session_token: str | None, *, touch: bool = True
    ) -> Principal | None:
        """The caller for these credentials: a valid API key, else a live session, else anonymous with
        full rights when the server has no authentication; None when they do not let anyone in.
        `touch`: the request counts as activity of a session (its idle deadline moves)."""
        key = self.keys.authenticate(key_text) if key_text else None
        if key is not None:
            return Principal("key", key.role, key=key, name=key.name)
        if key_text and self.auth_enabled():
            return None  # a key that lets no one in: the browser's session cookie does not stand in for it
        session = self.sessions.resolve(session_token, touch=touch) if session_token else None
        if session is not None:
            principal = self._session_principal(session)
            if principal is not None:
                return principal
            self.sessions.delete(session_token)  # its key was revoked, or the UI login was changed
        if not self.auth_enabled():
            return Principal("anonymous", "admin")  # e.g. an OpenAI SDK's placeholder key, auth off
        return None

    def _session_principal(self, session: UiSession) -> Principal | None:
        """Who a session stands for now, or None when its credential no longer lets anyone in."""
        if session.kind == "key":
            try:
                key = self.keys.get(session.subject)
            except KeyNotFound:
                return None
            if not key.active or not hmac.compare_digest(
                _key_binding(key).encode(), session.binding.encode()
            ):
                return None
            return Principal("key", key.role, key=key, name=key.name)
        if session.kind == "user" and self.auth.ui_login_configured:
            # (bytes: compare_digest refuses str that is not ASCII, and user names need not be)
            same_user = hmac.compare_digest(session.subject.encode(), (self.auth.ui_username or "").encode())
            if same_user and hmac.compare_digest(session.binding.encode(), self._login_binding().encode()):
                return Principal("session", "admin", name=session.subject)
        return None

    def _login_binding(self) -> str:
        """A fingerprint of the configured UI login: sessions made before it changed no longer match."""
        password = self.auth.ui_password.get_secret_value() if self.auth.ui_password else ""
        message = f"ui-login\0{self.auth.ui_username}\0{password}".encode()
        return hmac.new(self._secret.encode(), message, hashlib.sha256).hexdigest()[:32]

    def login(self, username: str, password: str) -> str:
        """A new session token for the UI user, or AuthRequired."""
        auth = self.auth
        if not auth.ui_login_configured or auth.ui_password is None:
            raise AuthRequired("no UI login is configured on this server (set ui_username and ui_password)")
        name_ok = check_password(auth.ui_username or "", username or "")
        password_ok = check_password(auth.ui_password.get_secret_value(), password or "")
        if not (name_ok and password_ok):
            raise AuthRequired("wrong user name or password")
        return self.sessions.create("user", auth.ui_username or "", self._login_binding())

    def logged_name(self, username: str) -> str:
        """How a sign-in's user name is logged: the UI's user name when it was typed, else "(another
        name)": a password typed into the name field landed in the log (and a line break with it)."""
        name = self.auth.ui_username or ""
        return (
            name
            if name and hmac.compare_digest(name.encode(), (username or "").encode())
            else "(another name)"
        )

    def key_login(self, key_text: str) -> tuple[ApiKey, str]:
        """The key and a new session token for it (the browser keeps the token, never the key), or
        AuthRequired."""
        key = self.keys.authenticate(key_text)
        if key is None:
            raise AuthRequired("the API key is not valid (unknown, malformed or revoked)")
        return key, self.sessions.create("key", str(key.id), _key_binding(key))

    def logout(self, session_token: str | None) -> None:
        """End the session of this token (nothing when there is none)."""
        self.sessions.delete(session_token)

    def session_cookie(self, token: str, *, secure: bool) -> dict[str, Any]:
        """How a UI session cookie is set: the keyword arguments of `Response.set_cookie`."""
        return {
            "key": SESSION_COOKIE,
            "value": token,
            "max_age": int(self.auth.ui_session_max_s),
            "path": "/",
            "httponly": True,  # never readable by the page's scripts
            "samesite": "lax",  # not sent with other sites' requests, but with links to the UI
            "secure": secure,  # https only when the login came over https (or a trusted proxy's https)
        }

    def check_rate(self, principal: Principal, *, read: bool = False) -> None:
        """RateLimited when the caller's key used up its requests per minute (`read`: its reads, which
        have an allowance of their own)."""
        if principal.key is None:
            return  # anonymous (auth off) and UI sessions are not rate limited
        wait = self.rate_limiter.acquire(principal.key, read=read)
        if wait > 0:
            limit = self.rate_limiter.limit_for(principal.key, read=read)
            seconds = max(1, round(wait + 0.5))  # the message says what Retry-After says
            what = "reads (GET requests)" if read else "requests"
            raise RateLimited(
                f"rate limit of {limit:g} {what} per minute reached for this key: retry in {seconds} s",
                seconds,
            )

    def check_quota(self, principal: Principal) -> None:
        """QuotaExceeded when the caller's key has nothing left today (used, or reserved by its work in
        flight): an early refusal before a request is read; the backend's reservation is the admission."""
        if principal.key is None:
            return
        status = self.quota.check(principal.key)
        if status.limit_s is not None and status.used_s + status.reserved_s >= status.limit_s:
            if status.used_s < status.limit_s:  # the key's own work in flight holds the rest
                raise QuotaExceeded(
                    f"the daily audio quota of {status.limit_s:g} s is held by this key's work in flight "
                    f"({status.used_s:.1f} s used today, {status.reserved_s:.1f} s reserved): retry once it "
                    "has finished",
                    HELD_RETRY_AFTER_S,
                    held_only=True,
                )
            held = (
                f", {status.reserved_s:.1f} s reserved by work in flight" if status.reserved_s > 0.05 else ""
            )
            raise QuotaExceeded(
                f"the daily audio quota of {status.limit_s:g} s is used up ({status.used_s:.1f} s today"
                f"{held}): it resets at 00:00 UTC",
                seconds_until_reset(),
            )

    def signed_url(self, path: str, query: dict[str, Any] | None = None) -> str:
        """`path?exp=&sig=` (plus `query`), valid for `signed_url_ttl_s` seconds."""
        url = signing.signed_url(path, self.auth.signed_url_ttl_s, self._secret)
        extra = "".join(f"&{k}={v}" for k, v in (query or {}).items() if v is not None)
        return url + extra

    def verify_signed(self, path: str, exp: str | None, sig: str | None) -> bool:
        return signing.verify(path, exp, sig, self._secret)


def _key_binding(key: ApiKey) -> str:
    """What a key session is bound to: the key's prefix (which tells it from a later key that got a deleted
    key's id) and its role (a role change ends the sessions made under the old one)."""
    return f"{key.prefix}:{key.role}"
