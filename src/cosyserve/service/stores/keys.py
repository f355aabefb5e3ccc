"""Who may call the API and how much: API keys, roles, per-key rate limits and daily audio quotas; UI login.

API keys look like `cs_<43 urlsafe chars>` (32 random bytes). Only their SHA-256 is stored, with the
first 8 random characters (`prefix`, shown in listings) to find the row. SHA-256 rather than a slow
password hash because the key carries 256 bits of entropy: brute force is hopeless either way, and a
slow hash would cost every API request tens of milliseconds. Passwords (human-chosen, low entropy) get
scrypt instead (`PasswordHasher`).

Checking a key looks the row up by prefix, then compares the full hash with `hmac.compare_digest`; an
unknown prefix is compared against a dummy hash, so the response time does not tell which prefixes exist.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import operator
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from cosyserve.errors import InputError
from cosyserve.service.access import signing
from cosyserve.service.stores.db import create_tables

KEY_SCHEME = "cs_"
PREFIX_CHARS = 8  # random characters kept in clear as the lookup prefix
KEY_PATTERN = re.compile(r"cs_[A-Za-z0-9_-]{43}")
PREFIX_PATTERN = re.compile(r"cs_[A-Za-z0-9_-]{8}")
ROLES = ("admin", "user")
NAME_MAX_CHARS = 64
MAX_KEY_ID = 2**31 - 1  # the id column is a 32-bit integer; larger ids can't exist (PostgreSQL refuses them)
SESSION_COOKIE = "cosyserve_session"
MIN_HASH_BYTES = 16  # shortest stored password hash accepted
_DUMMY_HASH = hashlib.sha256(b"no such key").hexdigest()


class KeyNotFound(InputError):
    """No API key with that id or prefix."""


@dataclass(frozen=True)
class ApiKey:
    id: int
    name: str
    prefix: str  # e.g. cs_Ab3dEf9h: enough to recognise a key, useless to call with
    role: str  # "admin" or "user"
    created_at: float  # unix seconds
    revoked_at: float | None
    rate_limit_per_minute: int | None  # None: the server default; 0: unlimited
    daily_audio_seconds_quota: float | None  # None: the server default (maybe unlimited)
    last_used_at: float | None

    @property
    def active(self) -> bool:
        return self.revoked_at is None

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    def public(self) -> dict[str, object]:
        """What listings show (never the hash)."""
        return dict(self.__dict__)


def api_keys_table(metadata: sa.MetaData) -> sa.Table:
    if "api_keys" in metadata.tables:
        return metadata.tables["api_keys"]
    return sa.Table(
        "api_keys",
        metadata,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(NAME_MAX_CHARS), nullable=False),
        sa.Column("prefix", sa.String(16), nullable=False, unique=True),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("revoked_at", sa.Float, nullable=True),
        sa.Column("rate_limit_per_minute", sa.Integer, nullable=True),
        sa.Column("daily_audio_seconds_quota", sa.Float, nullable=True),
        sa.Column("last_used_at", sa.Float, nullable=True),
    )


def audio_usage_table(metadata: sa.MetaData) -> sa.Table:
    if "audio_usage" in metadata.tables:
        return metadata.tables["audio_usage"]
    return sa.Table(
        "audio_usage",
        metadata,
        sa.Column("key_id", sa.Integer, primary_key=True),
        sa.Column("day", sa.String(10), primary_key=True),  # UTC date, YYYY-MM-DD
        sa.Column("seconds", sa.Float, nullable=False),
    )


def hash_key(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode()).hexdigest()


class KeyStore:
    """API keys in the `api_keys` table of `engine` (created if missing)."""

    def __init__(
        self,
        engine: sa.Engine,
        metadata: sa.MetaData,
        *,
        clock: Callable[[], float] = time.time,
        touch_interval_s: float = 60.0,
    ) -> None:
        self.engine = engine
        self.table = api_keys_table(metadata)
        create_tables(engine, self.table)
        self._clock = clock
        self._touch_interval_s = touch_interval_s  # last_used_at is written at most this often per key

    def create(
        self, name: str, role: str = "user", rate_limit: int | None = None, quota: float | None = None
    ) -> tuple[ApiKey, str]:
        """A new key: its record and the plaintext key, which is not stored and can't be shown again."""
        name = (name or "").strip()
        if not 1 <= len(name) <= NAME_MAX_CHARS:
            raise InputError(f"a key name must be 1 to {NAME_MAX_CHARS} characters, got {len(name)}")
        if re.search("[\x00\ud800-\udfff]", name):  # PostgreSQL refuses NUL; surrogates aren't UTF-8
            raise InputError("a key name must not contain NUL characters or lone surrogates; remove them")
        if role not in ROLES:
            raise InputError(f"role {role!r} is unknown; use one of {', '.join(ROLES)}")
        if rate_limit is not None and (isinstance(rate_limit, bool) or int(rate_limit) < 0):
            raise InputError(f"rate limit must be >= 0 requests per minute (0: unlimited), got {rate_limit}")
        if quota is not None and not quota > 0:
            raise InputError(f"quota must be a positive number of audio seconds per day, got {quota}")
        for _ in range(5):  # a prefix collision (48 random bits) is astronomically rare; retry anyway
            plaintext = KEY_SCHEME + secrets.token_urlsafe(32)
            values = {
                "name": name,
                "prefix": plaintext[: len(KEY_SCHEME) + PREFIX_CHARS],
                "hash": hash_key(plaintext),
                "role": role,
                "created_at": self._clock(),
                "rate_limit_per_minute": None if rate_limit is None else int(rate_limit),
                "daily_audio_seconds_quota": None if quota is None else float(quota),
            }
            try:
                with self.engine.begin() as conn:
                    key_id = conn.execute(self.table.insert().values(**values)).inserted_primary_key[0]
            except IntegrityError:
                continue
            return self.get(key_id), plaintext
        raise InputError("could not create a unique API key; try again")

    def get(self, key_id: int) -> ApiKey:
        """The key with this id; KeyNotFound if none (also for anything that is not a possible id)."""
        number = _key_number(key_id)
        row = None
        if number is not None:
            with self.engine.connect() as conn:
                row = conn.execute(sa.select(self.table).where(self.table.c.id == number)).first()
        if row is None:
            raise KeyNotFound(f"no API key with id {key_id}; `cosyserve keys list` shows them")
        return _record(row)

    def list(self, include_revoked: bool = True) -> list[ApiKey]:
        query = sa.select(self.table).order_by(self.table.c.id)
        if not include_revoked:
            query = query.where(self.table.c.revoked_at.is_(None))
        with self.engine.connect() as conn:
            return [_record(row) for row in conn.execute(query)]

    def revoke(self, id_or_prefix: int | str) -> ApiKey:
        """Revoke by numeric id or by prefix (`cs_Ab3dEf9h`); revoking twice keeps the first time."""
        text = str(id_or_prefix).strip()
        prefix = text[: len(KEY_SCHEME) + PREFIX_CHARS]  # a whole key works too
        if text.isdigit():
            number = _key_number(text)
            if number is None:
                raise KeyNotFound(f"no API key {text!r}; `cosyserve keys list` shows them")
            condition = self.table.c.id == number
        elif PREFIX_PATTERN.fullmatch(prefix):
            condition = self.table.c.prefix == prefix
        else:
            raise KeyNotFound(f"{text!r} is neither a key id nor a key prefix like cs_Ab3dEf9h")
        with self.engine.begin() as conn:
            row = conn.execute(sa.select(self.table).where(condition)).first()
            if row is None:
                raise KeyNotFound(f"no API key {text!r}; `cosyserve keys list` shows them")
            if row.revoked_at is None:
                conn.execute(
                    self.table.update().where(self.table.c.id == row.id).values(revoked_at=self._clock())
                )
        return self.get(row.id)

    def authenticate(self, plaintext: str | None) -> ApiKey | None:
        """The active key `plaintext` is, or None (unknown, malformed or revoked)."""
        well_formed = isinstance(plaintext, str) and KEY_PATTERN.fullmatch(plaintext) is not None
        row = None
        if well_formed:
            prefix = plaintext[: len(KEY_SCHEME) + PREFIX_CHARS]
            with self.engine.connect() as conn:
                row = conn.execute(sa.select(self.table).where(self.table.c.prefix == prefix)).first()
        supplied = hash_key(plaintext) if well_formed else _DUMMY_HASH
        matches = hmac.compare_digest(supplied, row.hash if row is not None else _DUMMY_HASH)
        if row is None or not matches or row.revoked_at is not None:
            return None
        key = _record(row)
        now = self._clock()
        if key.last_used_at is None or now - key.last_used_at >= self._touch_interval_s:
            with self.engine.begin() as conn:
                conn.execute(self.table.update().where(self.table.c.id == key.id).values(last_used_at=now))
            key = dataclasses.replace(key, last_used_at=now)
        return key


def _key_number(key_id: object) -> int | None:
    """`key_id` as a key id (an integer, or a string of ASCII digits, in the id column's range), else None."""
    if isinstance(key_id, str):
        text = key_id.strip()
        key_id = int(text) if text.isascii() and text.isdigit() and len(text) <= 12 else None
    try:
        number = operator.index(key_id)  # type: ignore[arg-type]
    except TypeError:
        return None
    return number if 1 <= number <= MAX_KEY_ID else None


def _record(row: sa.Row) -> ApiKey:
    mapping = row._mapping
    return ApiKey(**{field.name: mapping[field.name] for field in dataclasses.fields(ApiKey)})


class RateLimiter:
    """Token buckets per key: up to a minute's allowance at once, refilled continuously. Thread-safe.

    A key's own `rate_limit_per_minute` wins over `default_per_minute`; None or 0 means unlimited.
    Strings (e.g. "ip:1.2.3.4" for anonymous callers) get the default.
    """

    MAX_BUCKETS = 10_000  # beyond this, full (idle) buckets are forgotten

    def __init__(self, default_per_minute: float | None = 60, *, clock: Callable[[], float] = time.monotonic):
        self.default_per_minute = default_per_minute
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float]] = {}  # id -> (tokens, updated at)

    def limit_for(self, key: ApiKey | str) -> float | None:
        own = key.rate_limit_per_minute if isinstance(key, ApiKey) else None
        limit = own if own is not None else self.default_per_minute
        return limit or None

    def acquire(self, key: ApiKey | str, cost: float = 1.0) -> float:
        """0.0 if the request may go ahead (its cost is taken); otherwise the seconds to wait before it
        would be allowed (nothing is taken)."""
        per_minute = self.limit_for(key)
        if per_minute is None:
            return 0.0
        bucket_id = f"key:{key.id}" if isinstance(key, ApiKey) else key
        capacity, per_second = float(per_minute), per_minute / 60.0
        cost = min(cost, capacity)
        with self._lock:
            now = self._clock()
            tokens, updated = self._buckets.get(bucket_id, (capacity, now))
            tokens = min(capacity, tokens + (now - updated) * per_second)
            if tokens >= cost:
                self._buckets[bucket_id] = (tokens - cost, now)
                retry_after = 0.0
            else:
                self._buckets[bucket_id] = (tokens, now)
                retry_after = (cost - tokens) / per_second
            if len(self._buckets) > self.MAX_BUCKETS:
                self._forget_idle(now)
        return retry_after

    def _forget_idle(self, now: float) -> None:
        # An idle bucket has refilled; dropping it changes nothing. 60 s refills any limit >= 1/min.
        for bucket_id in [b for b, (_, updated) in self._buckets.items() if now - updated > 60.0]:
            del self._buckets[bucket_id]


@dataclass(frozen=True)
class QuotaStatus:
    allowed: bool
    used_s: float  # audio seconds already produced today (UTC)
    limit_s: float | None  # None: unlimited
    remaining_s: float | None
    resets_at: float  # unix time of the next UTC midnight


class QuotaTracker:
    """Seconds of audio produced per key per UTC day, in the `audio_usage` table (survives restarts).

    `check` before synthesis with an estimate, `add` the real duration after. Two requests checked at
    the same moment can both pass; the overshoot is at most one request's audio.
    """

    def __init__(
        self,
        engine: sa.Engine,
        metadata: sa.MetaData,
        *,
        default_daily_seconds: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.engine = engine
        self.table = audio_usage_table(metadata)
        create_tables(engine, self.table)
        self.default_daily_seconds = default_daily_seconds
        self._clock = clock

    def check(self, key: ApiKey, needed_s: float = 0.0) -> QuotaStatus:
        own = key.daily_audio_seconds_quota
        limit = own if own is not None else self.default_daily_seconds
        now = self._clock()
        used = self.used(key, now=now)
        day_start = datetime.fromtimestamp(now, timezone.utc).replace(
            hour=0, minute=0, second=0, microsecond=0
        )
        resets_at = day_start.timestamp() + 86400.0
        if not limit:
            return QuotaStatus(True, used, None, None, resets_at)
        return QuotaStatus(used + needed_s <= limit, used, limit, max(0.0, limit - used), resets_at)

    def used(self, key: ApiKey | int, *, now: float | None = None) -> float:
        """Seconds used today (UTC) by `key`."""
        conditions = self._where(key, self._clock() if now is None else now)
        with self.engine.connect() as conn:
            value = conn.execute(sa.select(self.table.c.seconds).where(*conditions)).scalar()
        return float(value or 0.0)

    def add(self, key: ApiKey | int, seconds: float) -> float:
        """Count `seconds` of produced audio for today; returns today's new total."""
        if seconds < 0:
            raise InputError(f"audio seconds to add must be >= 0, got {seconds}")
        now = self._clock()
        conditions = self._where(key, now)
        for _ in range(3):  # the insert can race with another process's insert; then update its row
            try:
                with self.engine.begin() as conn:
                    update = self.table.update().where(*conditions)
                    if not conn.execute(update.values(seconds=self.table.c.seconds + seconds)).rowcount:
                        row = {"key_id": _key_id(key), "day": _day(now), "seconds": seconds}
                        conn.execute(self.table.insert().values(**row))
            except IntegrityError:
                continue
            return self.used(key, now=now)
        raise InputError("could not record audio usage (database busy); try again")

    def _where(self, key: ApiKey | int, now: float) -> tuple[sa.ColumnElement[bool], ...]:
        return (self.table.c.key_id == _key_id(key), self.table.c.day == _day(now))


def _key_id(key: ApiKey | int) -> int:
    return key.id if isinstance(key, ApiKey) else int(key)


def _day(now: float) -> str:
    return datetime.fromtimestamp(now, timezone.utc).strftime("%Y-%m-%d")


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


class SessionTokens:
    """Signed, expiring session cookie values for the web UI (see `signing.sign_token`)."""

    def __init__(
        self, secret: str | bytes, ttl_s: float = 7 * 86400, *, clock: Callable[[], float] = time.time
    ):
        signing.signature(signing.SESSION_PURPOSE, "", 0, secret)  # refuse a weak secret now, not at login
        self._secret = secret
        self.ttl_s = ttl_s
        self._clock = clock

    def issue(self, subject: str) -> str:
        return signing.sign_token(subject, int(self._clock() + self.ttl_s), self._secret)

    def verify(self, token: str | None) -> str | None:
        """The subject (user name) of a valid, unexpired token; None otherwise."""
        return signing.verify_token(token, self._secret, now=self._clock())


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
