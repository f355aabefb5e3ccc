"""HMAC-SHA256 signatures with an expiry: download links for results and login session tokens.

A signature covers a purpose, the signed value (a URL path or a session subject) and the expiry time, so a
link can't be moved to another path, extended, or replayed as a session token. Signatures are urlsafe
base64 without padding; comparisons are constant-time (`hmac.compare_digest`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from urllib.parse import urlencode

from cosyserve.errors import SettingsError

URL_PURPOSE = "url"
SESSION_PURPOSE = "session"
MIN_SECRET_BYTES = 16


def signature(purpose: str, value: str, expires_at: int, secret: str | bytes) -> str:
    """The urlsafe-base64 HMAC-SHA256 of (purpose, value, expires_at) under `secret`."""
    key = _secret_bytes(secret)
    # NUL never occurs in a URL path or a purpose name, so the fields can't be shifted into each other.
    message = f"{purpose}\0{int(expires_at)}\0{value}".encode()
    digest = hmac.new(key, message, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def sign(path: str, expires_at: int, secret: str | bytes) -> str:
    """The query string `exp=<unix seconds>&sig=<signature>` that makes `path` downloadable until then."""
    expires_at = int(expires_at)
    return urlencode({"exp": expires_at, "sig": signature(URL_PURPOSE, path, expires_at, secret)})


def signed_url(path: str, ttl_s: float, secret: str | bytes, now: float | None = None) -> str:
    """`path?exp=...&sig=...`, valid for `ttl_s` seconds from `now` (default: the current time)."""
    now = time.time() if now is None else now
    return f"{path}?{sign(path, int(now + ttl_s), secret)}"


def verify(
    path: str, exp: str | int | None, sig: str | None, secret: str | bytes, now: float | None = None
) -> bool:
    """True if `sig` signs `path` until `exp` and `exp` has not passed. Malformed input is just False."""
    expires_at = _parse_expiry(exp)
    if expires_at is None or not isinstance(sig, str):
        return False
    expected = signature(URL_PURPOSE, path, expires_at, secret)
    valid = hmac.compare_digest(expected.encode(), sig.encode("utf-8", "replace"))
    now = time.time() if now is None else now
    return valid and now < expires_at


def sign_token(value: str, expires_at: int, secret: str | bytes, purpose: str = SESSION_PURPOSE) -> str:
    """A self-contained token `<base64 value>.<exp>.<signature>` (for cookies; value may be any text)."""
    encoded = base64.urlsafe_b64encode(value.encode()).rstrip(b"=").decode("ascii")
    expires_at = int(expires_at)
    return f"{encoded}.{expires_at}.{signature(purpose, value, expires_at, secret)}"


def verify_token(
    token: str | None, secret: str | bytes, now: float | None = None, purpose: str = SESSION_PURPOSE
) -> str | None:
    """The value inside a token from `sign_token`, or None if it is malformed, tampered with or expired."""
    if not isinstance(token, str) or token.count(".") != 2:
        return None
    encoded, exp, sig = token.split(".")
    expires_at = _parse_expiry(exp)
    try:
        value = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
    except (ValueError, UnicodeDecodeError):
        return None
    if expires_at is None:
        return None
    expected = signature(purpose, value, expires_at, secret)
    valid = hmac.compare_digest(expected.encode(), sig.encode("utf-8", "replace"))
    now = time.time() if now is None else now
    return value if valid and now < expires_at else None


def _parse_expiry(exp: str | int | None) -> int | None:
    if isinstance(exp, bool):
        return None
    if isinstance(exp, int):
        return exp
    if isinstance(exp, str) and exp.isascii() and exp.isdigit() and len(exp) <= 12:
        return int(exp)
    return None


def _secret_bytes(secret: str | bytes) -> bytes:
    key = secret.encode() if isinstance(secret, str) else bytes(secret)
    if len(key) < MIN_SECRET_BYTES:
        raise SettingsError(
            f"the signing secret is {len(key)} bytes; use at least {MIN_SECRET_BYTES} random bytes "
            "(e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`)"
        )
    return key
