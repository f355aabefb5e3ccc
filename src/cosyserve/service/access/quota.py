"""Daily audio quotas with reservations: admission holds a request's estimated seconds, the real length
replaces the hold when it is known.

Two tables, shared by every node through the database:

- `audio_usage` (key, UTC day, seconds): the audio each key produced per day;
- `quota_reservations` (id, key, day, seconds, holder, created, expires): seconds set aside by work that
  was admitted but has not finished (a request in the queue or running, an unfinished job).

`reserve` is atomic on SQLite and PostgreSQL: it first writes the key's usage row for the day (a no-op
update that takes the row's write lock: concurrent admissions of one key wait for each other, on every
node), then sums usage and live reservations and inserts its own only if everything fits under the limit.
`settle` deletes the reservation and adds the real seconds in one transaction; `release` deletes it
(failure, cancel); both are no-ops for a reservation already gone, so they may both run. A request's
reservation whose holder died is released on start-up of a process on the same host (`release_dead`) or,
anywhere, once it expires (`expires_at`): expired ones are not counted. A job's lives as long as its
record (however long it waits in the queue): it is released when the job ends, or at a start after a
crash came between the two (`reservations.QuotaReservations.release_dead`).

Work is charged to the UTC day that admitted it: a request admitted at 23:59:50 and finished after
midnight, or a batch that runs on into the next day, spends the seconds its day set aside for it, and the
new day starts with nothing of it used or held (it never saw that reservation).

The bound: the admitted estimates never exceed the limit, so a key's usage exceeds its quota only by
how much admitted requests outran their estimates (for one request at a time: its own estimate error).
"""

from __future__ import annotations

import math
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError, OperationalError

from cosyserve.errors import InputError, StorageError, is_resource_exhausted
from cosyserve.service.access.holders import holder_alive, this_process
from cosyserve.service.access.quota_days import exceeded, resets_at, utc_day
from cosyserve.service.stores.db import create_tables, table
from cosyserve.service.stores.keys import ApiKey

WRITE_TRIES = 3  # a first insert can race another node's; a busy SQLite can time out
DEFAULT_TTL_S = 3600.0
LIVES_WITH_HOLDER = 253402300799.0  # expires_at of a reservation that ends with its job (9999-12-31)


def audio_usage_table(metadata: sa.MetaData) -> sa.Table:
    return table(
        metadata,
        "audio_usage",
        sa.Column("key_id", sa.Integer, primary_key=True),
        sa.Column("day", sa.String(10), primary_key=True),  # UTC date, YYYY-MM-DD
        sa.Column("seconds", sa.Float, nullable=False),
    )


def reservations_table(metadata: sa.MetaData) -> sa.Table:
    return table(
        metadata,
        "quota_reservations",
        sa.Column("id", sa.String(64), primary_key=True),  # a request's uuid, or a job's id
        sa.Column("key_id", sa.Integer, nullable=False),
        sa.Column("day", sa.String(10), nullable=False),  # the UTC day it counts against
        sa.Column("seconds", sa.Float, nullable=False),  # still held (a job's shrinks as it is charged)
        sa.Column("holder", sa.String(200), nullable=False),  # "host-pid" of a request, "job" for jobs
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
        sa.Index("ix_quota_reservations_key_day", "key_id", "day"),
    )


@dataclass(frozen=True)
class QuotaStatus:
    allowed: bool
    used_s: float  # audio seconds already produced today (UTC)
    limit_s: float | None  # None: unlimited
    remaining_s: float | None  # the limit less what is used and what is reserved
    resets_at: float  # unix time of the next UTC midnight
    reserved_s: float = 0.0  # held by admitted work that has not finished


class QuotaTracker:
    """Seconds of audio produced per key per UTC day, and the seconds reserved by work in flight."""

    def __init__(
        self,
        engine: sa.Engine,
        metadata: sa.MetaData,
        *,
        default_daily_seconds: float | None = None,
        reservation_ttl_s: float = DEFAULT_TTL_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.engine = engine
        self.table = audio_usage_table(metadata)
        self.reservations = reservations_table(metadata)
        create_tables(engine, self.table, self.reservations)
        self.default_daily_seconds = default_daily_seconds
        self.reservation_ttl_s = reservation_ttl_s
        self._clock = clock

    # -- reading -----------------------------------------------------------------------------------------

    def limit_for(self, key: ApiKey) -> float | None:
        own = key.daily_audio_seconds_quota
        return (own if own is not None else self.default_daily_seconds) or None

    def check(self, key: ApiKey, needed_s: float = 0.0) -> QuotaStatus:
        """Whether `needed_s` more seconds fit today beside what is used and reserved (not atomic: an
        early refusal; `reserve` is the admission)."""
        now = self._clock()
        limit = self.limit_for(key)
        with self.engine.connect() as conn:
            used, held = self._totals(conn, _key_id(key), utc_day(now), now)
        if not limit:
            return QuotaStatus(True, used, None, None, resets_at(now), held)
        remaining = max(0.0, limit - used - held)
        return QuotaStatus(used + held + needed_s <= limit, used, limit, remaining, resets_at(now), held)

    def used(self, key: ApiKey | int, *, now: float | None = None) -> float:
        """Seconds used today (UTC) by `key`."""
        now = self._clock() if now is None else now
        with self.engine.connect() as conn:
            return self._used(conn, _key_id(key), utc_day(now))

    def reserved(self, key: ApiKey | int) -> float:
        """Seconds held today by `key`'s unfinished work."""
        now = self._clock()
        with self.engine.connect() as conn:
            return self._held(conn, _key_id(key), utc_day(now), now)

    def used_up(self, key: ApiKey, reservation_id: str | None = None) -> bool:
        """Whether `key` used its whole quota on the day `reservation_id` counts against (a job admitted
        yesterday goes on spending yesterday's), or today without one."""
        limit = self.limit_for(key)
        if not limit:
            return False
        with self.engine.connect() as conn:
            day = self._admitted_on(conn, reservation_id) or utc_day(self._clock())
            return self._used(conn, _key_id(key), day) >= limit

    def held_by(self, holder: str, *, older_than_s: float = 0.0) -> list[str]:
        """The ids of the reservations `holder` holds (jobs': each a job's id), made at least
        `older_than_s` ago."""
        r = self.reservations.c
        made_before = self._clock() - older_than_s
        query = sa.select(r.id).where(r.holder == holder, r.created_at <= made_before)
        with self.engine.connect() as conn:
            return list(conn.execute(query).scalars())

    # -- reserving and settling --------------------------------------------------------------------------

    def reserve(
        self,
        key: ApiKey,
        seconds: float,
        *,
        holder: str | None = None,
        reservation_id: str | None = None,
        ttl_s: float | None = None,
    ) -> str | None:
        """Hold `seconds` of today's quota for `key`, atomically against usage and other reservations;
        returns the reservation's id (None: the key is unlimited, nothing is held). QuotaExceeded when
        they do not fit: nothing is held then. `ttl_s=math.inf`: it never expires (a job's: it is
        released when its record ends)."""
        if seconds < 0:
            raise InputError(f"audio seconds to reserve must be >= 0, got {seconds}")
        limit = self.limit_for(key)
        if not limit:
            return None
        key_id, now = _key_id(key), self._clock()
        day = utc_day(now)
        reservation_id = reservation_id or uuid.uuid4().hex
        ttl = self.reservation_ttl_s if ttl_s is None else ttl_s
        row = {
            "id": reservation_id,
            "key_id": key_id,
            "day": day,
            "seconds": float(seconds),
            "holder": holder or this_process(),
            "created_at": now,
            "expires_at": now + ttl if math.isfinite(ttl) else LIVES_WITH_HOLDER,
        }
        self._ensure_usage_row(key_id, day)

        def admit(conn: sa.Connection) -> tuple[float, float] | None:
            # The no-op write locks the key's row for the day: admissions of one key take turns.
            usage = self.table.update().where(*self._where(key_id, day))
            conn.execute(usage.values(seconds=self.table.c.seconds))
            used, held = self._totals(conn, key_id, day, now)
            if used + held + seconds > limit:
                return used, held
            conn.execute(self.reservations.insert().values(**row))
            return None

        refused = self._write(admit)
        if refused is not None:
            used, held = refused
            raise exceeded(limit, used, held, seconds, now)
        return reservation_id

    def settle(self, reservation_id: str | None, key: ApiKey | int, seconds: float) -> None:
        """The real length is known: release the reservation and count `seconds` of audio for the day that
        admitted it, in one transaction (without a reservation, or one already released, the seconds are
        counted alone, for today)."""
        _check_seconds(seconds)
        key_id, now = _key_id(key), self._clock()

        def write(conn: sa.Connection) -> None:
            day = self._admitted_on(conn, reservation_id) or utc_day(now)
            if reservation_id is not None:
                conn.execute(self.reservations.delete().where(self.reservations.c.id == reservation_id))
            self._count(conn, key_id, day, seconds)

        self._write(write)

    def settle_part(self, reservation_id: str, key: ApiKey | int, seconds: float) -> None:
        """Part of a job's audio is made: count it for the day that admitted the job and shrink the job's
        reservation by as much (never below zero), in one transaction. A reservation that expires (one
        written before jobs' reservations lived with their record) is renewed."""
        _check_seconds(seconds)
        key_id, now = _key_id(key), self._clock()
        r = self.reservations.c
        renewed = now + self.reservation_ttl_s

        def write(conn: sa.Connection) -> None:
            day = self._admitted_on(conn, reservation_id) or utc_day(now)
            shrink = self.reservations.update().where(r.id == reservation_id)
            left = sa.case((r.seconds > seconds, r.seconds - seconds), else_=0.0)
            expires = sa.case((r.expires_at < renewed, renewed), else_=r.expires_at)
            conn.execute(shrink.values(seconds=left, expires_at=expires))
            self._count(conn, key_id, day, seconds)

        self._write(write)

    def refund_part(self, reservation_id: str, key: ApiKey | int, seconds: float) -> None:
        """`settle_part` undone: audio counted for a job was discarded (an interrupted attempt that its
        rerun makes again). The count of the day that admitted the job (today once its reservation is
        gone) shrinks by `seconds`, never below zero, and the job's reservation, if it still holds one,
        grows by as much, in one transaction."""
        _check_seconds(seconds)
        key_id, now = _key_id(key), self._clock()
        used = self.table.c.seconds

        def write(conn: sa.Connection) -> None:
            day = self._admitted_on(conn, reservation_id) or utc_day(now)
            grow = self.reservations.update().where(self.reservations.c.id == reservation_id)
            conn.execute(grow.values(seconds=self.reservations.c.seconds + seconds))
            shrink = self.table.update().where(*self._where(key_id, day))
            conn.execute(shrink.values(seconds=sa.case((used > seconds, used - seconds), else_=0.0)))

        self._write(write)

    def release(self, reservation_id: str | None) -> None:
        """Give the reservation's seconds back (failed, cancelled); a no-op when it is already gone."""
        if reservation_id is None:
            return
        self._write(
            lambda conn: conn.execute(
                self.reservations.delete().where(self.reservations.c.id == reservation_id)
            )
        )

    def release_dead(self, host: str | None = None) -> int:
        """Delete expired reservations, and those of processes on this host that no longer run (a crash
        left them behind); returns how many. Called when a process starts."""
        host = host or socket.gethostname()
        now = self._clock()
        with self.engine.begin() as conn:
            gone = conn.execute(
                self.reservations.delete().where(self.reservations.c.expires_at <= now)
            ).rowcount
            holders = conn.execute(
                sa.select(self.reservations.c.holder)
                .where(self.reservations.c.holder.like(f"{host}-%"))
                .distinct()
            ).scalars()
            dead = [h for h in holders if not holder_alive(h[len(host) + 1 :])]
            if dead:
                gone += conn.execute(
                    self.reservations.delete().where(self.reservations.c.holder.in_(dead))
                ).rowcount
        return gone

    def add(self, key: ApiKey | int, seconds: float) -> float:
        """Count `seconds` of produced audio for today (no reservation); returns today's new total."""
        _check_seconds(seconds)
        key_id, now = _key_id(key), self._clock()
        self._write(lambda conn: self._count(conn, key_id, utc_day(now), seconds))
        return self.used(key, now=now)

    # -- internals ---------------------------------------------------------------------------------------

    def _write(self, body: Callable[[sa.Connection], object]) -> object:
        """Run `body` in a transaction, again when a first insert raced another's or SQLite stayed busy."""
        for attempt in range(WRITE_TRIES):
            try:
                with self.engine.begin() as conn:
                    return body(conn)
            except (IntegrityError, OperationalError) as exc:
                if is_resource_exhausted(exc):
                    raise StorageError(
                        "could not record audio usage: the database's disk is full (or the server is out "
                        "of open files); an admin has to free space in the data directory"
                    ) from exc
                if attempt == WRITE_TRIES - 1:
                    break
        raise StorageError("could not record audio usage (the database is busy): try again in a few seconds")

    def _admitted_on(self, conn: sa.Connection, reservation_id: str | None) -> str | None:
        """The UTC day whose quota admitted `reservation_id` (None: there is no such reservation)."""
        if reservation_id is None:
            return None
        query = sa.select(self.reservations.c.day).where(self.reservations.c.id == reservation_id)
        return conn.execute(query).scalar()

    def _ensure_usage_row(self, key_id: int, day: str) -> None:
        """The key's usage row for `day` exists (reservations lock it)."""

        def write(conn: sa.Connection) -> None:
            if conn.execute(sa.select(self.table.c.seconds).where(*self._where(key_id, day))).first() is None:
                conn.execute(self.table.insert().values(key_id=key_id, day=day, seconds=0.0))

        self._write(write)

    def _count(self, conn: sa.Connection, key_id: int, day: str, seconds: float) -> None:
        update = self.table.update().where(*self._where(key_id, day))
        if not conn.execute(update.values(seconds=self.table.c.seconds + seconds)).rowcount:
            conn.execute(self.table.insert().values(key_id=key_id, day=day, seconds=seconds))

    def _totals(self, conn: sa.Connection, key_id: int, day: str, now: float) -> tuple[float, float]:
        return self._used(conn, key_id, day), self._held(conn, key_id, day, now)

    def _used(self, conn: sa.Connection, key_id: int, day: str) -> float:
        value = conn.execute(sa.select(self.table.c.seconds).where(*self._where(key_id, day))).scalar()
        return float(value or 0.0)

    def _held(self, conn: sa.Connection, key_id: int, day: str, now: float) -> float:
        r = self.reservations.c
        query = sa.select(sa.func.sum(r.seconds)).where(r.key_id == key_id, r.day == day, r.expires_at > now)
        return float(conn.execute(query).scalar() or 0.0)

    def _where(self, key_id: int, day: str) -> tuple[sa.ColumnElement[bool], ...]:
        return (self.table.c.key_id == key_id, self.table.c.day == day)


def _check_seconds(seconds: float) -> None:
    if seconds < 0:
        raise InputError(f"audio seconds to add must be >= 0, got {seconds}")


def _key_id(key: ApiKey | int) -> int:
    return key.id if isinstance(key, ApiKey) else int(key)
