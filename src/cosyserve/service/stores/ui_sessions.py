"""Web UI sign-ins, kept server-side in the `ui_sessions` table.

A login (API key or UI password) gets an opaque random token (32 bytes, urlsafe base64) that the browser
keeps in an http-only cookie; the table holds only its SHA-256, with who signed in (`key` + key id, or
`user` + UI user name), a `binding` the gate checks (see `access.gate`), and the times that end it: an
absolute expiry and the last request (idle timeout). The cookie carries no credential: a stolen cookie is
worth only its session, which logout, a new login in the same browser, or revoking the key ends.
SHA-256 rather than a slow hash because the token has 256 random bits, as API keys do (`stores.keys`).
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

import sqlalchemy as sa

from cosyserve.service.stores.db import create_tables, table

SUBJECT_KINDS = ("key", "user")
TOKEN_PATTERN = re.compile(r"[A-Za-z0-9_-]{43}")  # secrets.token_urlsafe(32)
SUBJECT_MAX_CHARS = 128
TOUCH_INTERVAL_S = 60.0  # last_seen_at is written at most this often per session
MAX_SESSIONS_PER_SUBJECT = 100  # browsers signed in as one key or user; a new login ends the least used


@dataclass(frozen=True)
class UiSession:
    kind: str  # "key" (subject: the key id) or "user" (subject: the UI user name)
    subject: str
    binding: str  # what the credential looked like at login; the gate refuses the session when it changed
    created_at: float
    expires_at: float
    last_seen_at: float


def ui_sessions_table(metadata: sa.MetaData) -> sa.Table:
    return table(
        metadata,
        "ui_sessions",
        sa.Column("token_hash", sa.String(64), primary_key=True),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("subject", sa.String(SUBJECT_MAX_CHARS), nullable=False),
        sa.Column("binding", sa.String(64), nullable=False, default=""),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
        sa.Column("last_seen_at", sa.Float, nullable=False),
        sa.Index("ix_ui_sessions_subject", "kind", "subject"),
    )


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class UiSessionStore:
    """Sessions in the `ui_sessions` table of `engine` (created if missing). A session ends `max_age_s`
    after the login, or `idle_s` after its last request, whichever comes first."""

    def __init__(
        self,
        engine: sa.Engine,
        metadata: sa.MetaData,
        *,
        idle_s: float,
        max_age_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not (idle_s > 0 and max_age_s > 0):
            raise ValueError(f"session lifetimes must be positive, got idle {idle_s} s, max {max_age_s} s")
        self.engine = engine
        self.table = ui_sessions_table(metadata)
        create_tables(engine, self.table)
        self.idle_s = idle_s
        self.max_age_s = max_age_s
        self._clock = clock

    def create(self, kind: str, subject: str, binding: str = "") -> str:
        """A new session for `subject`: its token, which only the browser keeps. Ended sessions of anyone
        are deleted on the way, so the table holds live sessions only, and at most
        `MAX_SESSIONS_PER_SUBJECT` per subject (the least recently used go first)."""
        if kind not in SUBJECT_KINDS:
            raise ValueError(f"session kind {kind!r} is unknown; use one of {', '.join(SUBJECT_KINDS)}")
        if not 1 <= len(subject) <= SUBJECT_MAX_CHARS:
            raise ValueError(f"a session subject must be 1 to {SUBJECT_MAX_CHARS} characters")
        token = secrets.token_urlsafe(32)
        now = self._clock()
        row = {
            "token_hash": hash_token(token),
            "kind": kind,
            "subject": subject,
            "binding": binding,
            "created_at": now,
            "expires_at": now + self.max_age_s,
            "last_seen_at": now,
        }
        same = sa.and_(self.table.c.kind == kind, self.table.c.subject == subject)
        surplus = (
            sa.select(self.table.c.token_hash)
            .where(same)
            .order_by(self.table.c.last_seen_at.desc(), self.table.c.created_at.desc())
            .offset(MAX_SESSIONS_PER_SUBJECT - 1)
        )
        with self.engine.begin() as conn:
            conn.execute(self.table.delete().where(self._ended(now)))
            old = [row.token_hash for row in conn.execute(surplus)]
            if old:
                conn.execute(self.table.delete().where(self.table.c.token_hash.in_(old)))
            conn.execute(self.table.insert().values(**row))
        return token

    def resolve(self, token: str | None, *, touch: bool = True) -> UiSession | None:
        """The live session of `token`, or None (unknown, malformed, expired or idle too long); a use
        moves its idle deadline (written at most once a minute) unless `touch` is false: what the page
        asks by itself (its status timer, its session check) is no sign of someone at the keyboard."""
        if not token or TOKEN_PATTERN.fullmatch(token) is None:
            return None
        token_hash = hash_token(token)
        now = self._clock()
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(self.table).where(self.table.c.token_hash == token_hash)).first()
        if row is None:
            return None
        if now >= row.expires_at or now - row.last_seen_at >= self.idle_s:
            self.delete(token)
            return None
        session = UiSession(
            row.kind, row.subject, row.binding, row.created_at, row.expires_at, row.last_seen_at
        )
        if touch and now - row.last_seen_at >= min(TOUCH_INTERVAL_S, self.idle_s / 10):
            with self.engine.begin() as conn:
                conn.execute(
                    self.table.update().where(self.table.c.token_hash == token_hash).values(last_seen_at=now)
                )
        return session

    def delete(self, token: str | None) -> bool:
        """End the session of `token` (logout, or a new login in the same browser); False if none."""
        if not token or TOKEN_PATTERN.fullmatch(token) is None:
            return False
        with self.engine.begin() as conn:
            result = conn.execute(self.table.delete().where(self.table.c.token_hash == hash_token(token)))
        return bool(result.rowcount)

    def delete_subject(self, kind: str, subject: str) -> int:
        """End every session of one key or UI user; how many there were."""
        condition = sa.and_(self.table.c.kind == kind, self.table.c.subject == subject)
        with self.engine.begin() as conn:
            return int(conn.execute(self.table.delete().where(condition)).rowcount or 0)

    def count(self) -> int:
        """Live sessions (ended ones not yet deleted are not counted)."""
        query = sa.select(sa.func.count()).select_from(self.table).where(sa.not_(self._ended(self._clock())))
        with self.engine.connect() as conn:
            return int(conn.execute(query).scalar_one())

    def _ended(self, now: float) -> sa.ColumnElement[bool]:
        return sa.or_(self.table.c.expires_at <= now, self.table.c.last_seen_at <= now - self.idle_s)
