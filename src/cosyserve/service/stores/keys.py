"""API keys: who may call the API and in which role, stored in the `api_keys` table.

API keys look like `cs_<43 urlsafe chars>` (32 random bytes). Only their SHA-256 is stored, with the
first 8 random characters (`prefix`, shown in listings) to find the row. SHA-256 rather than a slow
password hash because the key carries 256 bits of entropy: brute force is hopeless either way, and a
slow hash would cost every API request tens of milliseconds. Passwords (human-chosen, low entropy) get
scrypt instead (`access.sessions.PasswordHasher`).

Checking a key looks the row up by prefix, then compares the full hash with `hmac.compare_digest`; an
unknown prefix is compared against a dummy hash, so the response time does not tell which prefixes exist.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import logging
import operator
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from cosyserve.errors import InputError
from cosyserve.errors import KeyNotFound as KeyNotFound  # defined there, with the error table
from cosyserve.service.stores.db import create_tables, table

log = logging.getLogger(__name__)

KEY_SCHEME = "cs_"
PREFIX_CHARS = 8  # random characters kept in clear as the lookup prefix
KEY_PATTERN = re.compile(r"cs_[A-Za-z0-9_-]{43}")
PREFIX_PATTERN = re.compile(r"cs_[A-Za-z0-9_-]{8}")
ROLES = ("admin", "user")
NAME_MAX_CHARS = 64
MAX_KEY_ID = 2**31 - 1  # the id column is a 32-bit integer; larger ids can't exist (PostgreSQL refuses them)
_DUMMY_HASH = hashlib.sha256(b"no such key").hexdigest()
KEEP = object()  # `KeyStore.update`: leave this value as it is


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
    return table(
        metadata,
        "api_keys",
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


def hash_key(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode()).hexdigest()


MAX_QUOTA_S = 10_000_000.0  # audio seconds a day: far above what any server makes, and a finite number
MAX_RATE_PER_MINUTE = 1_000_000  # requests a minute (0 is the way to say unlimited)


def checked_quota(quota: object) -> float | None:
    """A daily quota as stored: None (the server default) or audio seconds in (0, MAX_QUOTA_S]."""
    if quota is None:
        return None
    if isinstance(quota, bool) or not isinstance(quota, int | float) or not 0 < quota <= MAX_QUOTA_S:
        raise InputError(
            f"quota must be a number of audio seconds per day above 0 and at most {MAX_QUOTA_S:.0f} "
            f"(or null: the server default), got {quota!r}"
        )
    return float(quota)


def checked_rate_limit(rate_limit: object) -> int | None:
    """A rate limit as stored: None (the server default), 0 (unlimited) or requests per minute."""
    if rate_limit is None:
        return None
    valid = isinstance(rate_limit, int) and not isinstance(rate_limit, bool)
    if not valid or not 0 <= rate_limit <= MAX_RATE_PER_MINUTE:  # type: ignore[operator]
        raise InputError(
            f"rate limit must be 0 (unlimited) to {MAX_RATE_PER_MINUTE} requests per minute (or null: the "
            f"server default), got {rate_limit!r}"
        )
    return int(rate_limit)  # type: ignore[arg-type]


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
        if re.search("[\x00-\x1f\x7f\ud800-\udfff]", name):  # PostgreSQL refuses NUL; surrogates aren't UTF-8
            raise InputError(
                "a key name must not contain control characters (line breaks, tabs, NUL) or lone "
                "surrogates; remove them"
            )
        if role not in ROLES:
            raise InputError(f"role {role!r} is unknown; use one of {', '.join(ROLES)}")
        rate_limit, quota = checked_rate_limit(rate_limit), checked_quota(quota)
        for _ in range(5):  # a prefix (48 random bits) or id collision is astronomically rare; retry anyway
            plaintext, secret = _new_secret()
            values = {
                # Never an earlier key's id: outputs (files, a bucket) and jobs name their owner `key:<id>`,
                # and a database restored from an older backup (or a deleted row) gave the next key the id,
                # and so the outputs, of a key made after the backup. Random ids are not counted back.
                "id": secrets.randbelow(MAX_KEY_ID) + 1,
                "name": name,
                **secret,
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

    def rotate(self, id_or_prefix: int | str) -> tuple[ApiKey, str]:
        """A new secret (and prefix) for an active key, on the same id: its voices, outputs, jobs, usage
        and limits stay its own (a leaked key replaced by a new one lost them all), the old secret stops
        working at once and the UI sessions signed in with it end (they are bound to the prefix).
        Returns the record and the new plaintext, which is not stored."""
        key = self.find(id_or_prefix)
        if not key.active:
            raise InputError(f"API key {key.id} ({key.name}) is revoked: create a new key instead")
        for _ in range(5):
            plaintext, secret = _new_secret()
            active = (self.table.c.id == key.id) & self.table.c.revoked_at.is_(None)
            try:
                with self.engine.begin() as conn:
                    changed = conn.execute(self.table.update().where(active).values(**secret)).rowcount
            except IntegrityError:  # the new prefix is another key's
                continue
            if not changed:
                raise InputError(f"API key {key.id} ({key.name}) was revoked meanwhile: create a new key")
            return self.get(key.id), plaintext
        raise InputError("could not make a unique API key; try again")

    def find(self, id_or_prefix: int | str) -> ApiKey:
        """The key with this numeric id or prefix (`cs_Ab3dEf9h`; a whole key works too); KeyNotFound
        if none."""
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(self.table).where(self._named(str(id_or_prefix).strip()))).first()
        if row is None:
            raise KeyNotFound(f"no API key {id_or_prefix!r}; `cosyserve keys list` shows them")
        return _record(row)

    def _named(self, text: str) -> sa.ColumnElement[bool]:
        prefix = text[: len(KEY_SCHEME) + PREFIX_CHARS]  # a whole key works too
        if text.isdigit():
            number = _key_number(text)
            if number is None:
                raise KeyNotFound(f"no API key {text!r}; `cosyserve keys list` shows them")
            return self.table.c.id == number
        if PREFIX_PATTERN.fullmatch(prefix):
            return self.table.c.prefix == prefix
        raise KeyNotFound(f"{text!r} is neither a key id nor a key prefix like cs_Ab3dEf9h")

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
        query = sa.select(self.table).order_by(self.table.c.created_at, self.table.c.id)
        if not include_revoked:
            query = query.where(self.table.c.revoked_at.is_(None))
        with self.engine.connect() as conn:
            return [_record(row) for row in conn.execute(query)]

    @staticmethod
    def is_id_or_prefix(text: str) -> bool:
        """Whether `text` is written like a key id or a key prefix (or a whole key), as `revoke` takes."""
        text = text.strip()
        return text.isdigit() or bool(PREFIX_PATTERN.fullmatch(text[: len(KEY_SCHEME) + PREFIX_CHARS]))

    def revoke(self, id_or_prefix: int | str, *, keep_an_admin: bool = False) -> ApiKey:
        """Revoke by numeric id or by prefix (`cs_Ab3dEf9h`); revoking twice keeps the first time.
        `keep_an_admin`: InputError rather than revoke the last admin key in use."""
        text = str(id_or_prefix).strip()
        condition = self._named(text)
        with self.engine.begin() as conn:
            row = conn.execute(sa.select(self.table).where(condition)).first()
            if row is None:
                raise KeyNotFound(f"no API key {text!r}; `cosyserve keys list` shows them")
            if row.revoked_at is None:
                revoke = self.table.update().where(self.table.c.id == row.id).values(revoked_at=self._clock())
                if keep_an_admin and row.role == "admin":
                    self._unless_last_admin(conn, revoke, row.id, "revoke")
                else:
                    conn.execute(revoke)
        return self.get(row.id)

    def update(
        self,
        key_id: int | str,
        *,
        role: str | None = None,
        quota: float | object | None = KEEP,
        rate_limit: int | object | None = KEEP,
        keep_an_admin: bool = False,
    ) -> ApiKey:
        """Change a key's role, daily quota (None: the server default) or rate limit (None: the server
        default, 0: unlimited); what is not given (KEEP) stays. Running work of the key sees the change
        at its next segment (`access.key_watch`). `keep_an_admin`: InputError rather than make the last
        admin key in use a user key."""
        key = self.get(key_id)  # type: ignore[arg-type]
        if not key.active:  # (it answered 200 and logged a change that could never apply)
            raise InputError(f"API key {key.id} ({key.name}) is revoked: nothing of it can change")
        values: dict[str, object] = {}
        if role is not None:
            if role not in ROLES:
                raise InputError(f"role {role!r} is unknown; use one of {', '.join(ROLES)}")
            values["role"] = role
        if quota is not KEEP:
            values["daily_audio_seconds_quota"] = checked_quota(quota)
        if rate_limit is not KEEP:
            values["rate_limit_per_minute"] = checked_rate_limit(rate_limit)
        if values:
            with self.engine.begin() as conn:
                change = self.table.update().where(self.table.c.id == key.id).values(**values)
                demoted = key.role == "admin" and key.active and values.get("role", "admin") != "admin"
                if keep_an_admin and demoted:
                    self._unless_last_admin(conn, change, key.id, "make a user key of")
                else:
                    conn.execute(change)
        return self.get(key.id)

    def _unless_last_admin(self, conn: sa.Connection, change: sa.Update, key_id: int, what: str) -> None:
        """Run `change` (an UPDATE that takes key `key_id`, an admin in use, out of the admins) only while
        another admin key is in use, checked in the same statement: two admins revoking each other at once
        both succeeded when it was checked apart. InputError when no other one is."""
        table = self.table
        in_use = (table.c.role == "admin") & table.c.revoked_at.is_(None)
        # PostgreSQL: lock the admin rows first, so that a concurrent change waits, then sees this one
        conn.execute(sa.select(table.c.id).where(in_use).with_for_update())
        another = sa.exists().where(in_use, table.c.id != key_id)
        if not conn.execute(change.where(another)).rowcount:
            raise InputError(
                f"key {key_id} is the last admin key: create another admin key first, then {what} this one"
            )

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
            try:  # bookkeeping: a database that can't be written (disk full) must not lock every key out
                touch = self.table.update().where(self.table.c.id == key.id).values(last_used_at=now)
                with self.engine.begin() as conn:
                    conn.execute(touch)
            except sa.exc.OperationalError as exc:
                log.warning("key %s: its last use could not be recorded: %s", key.id, exc.orig)
            else:
                key = dataclasses.replace(key, last_used_at=now)
        return key


def _new_secret() -> tuple[str, dict[str, str]]:
    """A new plaintext key, and the prefix and hash a row stores of it."""
    plaintext = KEY_SCHEME + secrets.token_urlsafe(32)
    return plaintext, {"prefix": plaintext[: len(KEY_SCHEME) + PREFIX_CHARS], "hash": hash_key(plaintext)}


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


_NUMBERS = {"created_at": float, "revoked_at": float, "last_used_at": float,
            "rate_limit_per_minute": int, "daily_audio_seconds_quota": float}  # fmt: skip


def _record(row: sa.Row) -> ApiKey:
    mapping = dict(row._mapping)
    for name, kind in _NUMBERS.items():  # a damaged value made every listing of keys fail
        value = mapping.get(name)
        if value is not None and not isinstance(value, (int, float)):
            try:
                mapping[name] = kind(value)
            except (TypeError, ValueError):
                log.error("key %s: its %s (%r) cannot be read: taken as unset", mapping["id"], name, value)
                mapping[name] = 0.0 if name == "created_at" else None
    return ApiKey(**{field.name: mapping[field.name] for field in dataclasses.fields(ApiKey)})
