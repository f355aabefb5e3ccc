"""UI logins: checking the configured password (scrypt hashes, or plain text), and the name of the cookie
that holds a login's session token (the sessions themselves are kept in `stores.ui_sessions`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Mapping

SESSION_COOKIE = "cosyserve_session"  # an opaque session token (`stores.ui_sessions`), never a key
LEGACY_KEY_COOKIE = "cosyserve_ui_key"  # held a raw API key in old versions: never read, only cleared
AUTH_COOKIES = (SESSION_COOKIE, LEGACY_KEY_COOKIE)  # what a login or logout resets
MIN_HASH_BYTES = 16  # shortest stored password hash accepted


class PasswordHasher:
    """scrypt password hashes as `scrypt$n$r$p$<salt>$<hash>` (urlsafe base64); verify is constant-time.

    `verify` also accepts Django-style `pbkdf2_sha256$<iterations>$<salt>$<base64 hash>` strings, so
    hashes made by other tools can be pasted into the config.
    """

    def __init__(self, n: int = 2**14, r: int = 8, p: int = 1, salt_bytes: int = 16, key_bytes: int = 32):
        self.n, self.r, self.p, self.salt_bytes, self.key_bytes = n, r, p, salt_bytes, key_bytes

    def hash(self, password: str) -> str:
        salt = secrets.token_bytes(self.salt_bytes)
        derived = self._scrypt(password, salt, self.n, self.r, self.p, self.key_bytes)
        return f"scrypt${self.n}${self.r}${self.p}${_b64(salt)}${_b64(derived)}"

    def verify(self, password: str, encoded: str) -> bool:
        """True if `password` matches `encoded`; False for a wrong password or an unreadable hash."""
        try:
            scheme, *fields = encoded.split("$")
            if scheme == "scrypt" and len(fields) == 5:
                n, r, p = (int(v) for v in fields[:3])
                salt, expected = _unb64(fields[3]), _unb64(fields[4])
                derived = self._scrypt(password, salt, n, r, p, len(expected))
            elif scheme == "pbkdf2_sha256" and len(fields) == 3:
                salt, expected = fields[1].encode(), base64.b64decode(fields[2])
                derived = hashlib.pbkdf2_hmac(
                    "sha256", password.encode(), salt, int(fields[0]), len(expected)
                )
            else:
                return False
        except (ValueError, TypeError):
            return False
        # A truncated stored hash would compare only a few bytes: that is a broken config, not a match.
        return len(expected) >= MIN_HASH_BYTES and hmac.compare_digest(derived, expected)

    @staticmethod
    def is_hash(value: str) -> bool:
        return value.startswith(("scrypt$", "pbkdf2_sha256$"))

    @staticmethod
    def _scrypt(password: str, salt: bytes, n: int, r: int, p: int, length: int) -> bytes:
        # maxmem: scrypt needs 128 * r * n bytes; allow twice that (OpenSSL's default cap is 32 MiB).
        return hashlib.scrypt(
            password.encode(), salt=salt, n=n, r=r, p=p, dklen=length, maxmem=256 * r * n + 2**20
        )


def check_password(configured: str, supplied: str, hasher: PasswordHasher | None = None) -> bool:
    """Does `supplied` match the configured password, which is either a hash or (discouraged) plain text?"""
    hasher = hasher or PasswordHasher()
    if hasher.is_hash(configured):
        return hasher.verify(supplied, configured)
    # Hash both sides so the comparison takes the same time whatever the lengths.
    return hmac.compare_digest(
        hashlib.sha256(configured.encode()).digest(), hashlib.sha256(supplied.encode()).digest()
    )


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def header_key(headers: Mapping[str, str]) -> str | None:
    """The API key in `Authorization: Bearer …`, else in `X-API-Key` (header names in any case)."""
    lowered = {name.lower(): value for name, value in headers.items()}
    scheme, _, value = lowered.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return lowered.get("x-api-key", "").strip() or None
