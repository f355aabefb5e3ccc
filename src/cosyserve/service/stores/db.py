"""The database: one SQLAlchemy engine per process and one MetaData every store defines its tables on.

SQLite (the default) is tuned for a threaded server: WAL journal so readers do not block the writer, a busy
timeout so concurrent writers wait instead of failing, and connections usable from any thread. PostgreSQL
(`postgresql+psycopg://…`) works unchanged for several nodes sharing one database.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, MetaData, Table, create_engine, event, inspect, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError
from sqlalchemy.pool import QueuePool
from sqlalchemy.schema import CreateIndex

from cosyserve.errors import SettingsError
from cosyserve.service.redact import masked_url

SQLITE_BUSY_TIMEOUT_S = 30.0
PG_POOL_SIZE = 10  # per process; threads beyond it wait up to 30 s, or use the overflow
PG_MAX_OVERFLOW = 10
SCHEMA_LOCK_KEY = 0x636F7379  # "cosy": the advisory lock table creation takes on PostgreSQL

# Every store's tables live here, so `create_all` creates them all and tests can use one in-memory database.
metadata = MetaData()


def sqlite_path(database_url: str) -> Path | None:
    """The file behind a SQLite URL; None for in-memory SQLite and for other databases."""
    url = _parse(database_url)
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return None
    return Path(url.database)


def make_engine(database_url: str, *, echo: bool = False) -> Engine:
    """An engine for `database_url`; for SQLite files the parent directory is created."""
    url = _parse(database_url)
    if url.get_backend_name() == "postgresql":
        return _postgresql_engine(url, echo=echo)
    if url.get_backend_name() != "sqlite":  # the schema and its locks are written for these two
        raise SettingsError(
            f"database_url {url.render_as_string(hide_password=True)!r} is a {url.get_backend_name()} "
            "database: cosyserve runs on SQLite (sqlite:///PATH, the default) or PostgreSQL "
            "(postgresql+psycopg://USER:PASSWORD@HOST/DB)"
        )

    kwargs: dict[str, Any] = {
        "connect_args": {"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_S},
        "echo": echo,
    }
    path = sqlite_path(database_url)
    if path is None:
        # In-memory: each connection would open its own empty database, so every thread gets the same one,
        # one thread at a time (a pool of exactly one connection).
        shared = sqlite3.connect(":memory:", check_same_thread=False, timeout=SQLITE_BUSY_TIMEOUT_S)
        kwargs.update(
            creator=lambda: shared,
            poolclass=QueuePool,
            pool_size=1,
            max_overflow=0,
            pool_timeout=SQLITE_BUSY_TIMEOUT_S,
        )
        del kwargs["connect_args"]
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        _private(path)
    try:
        engine = create_engine(url, **kwargs)
    except ArgumentError as exc:  # SQLite's own rules (no user, password or host)
        why = " (a SQLite URL has no user, password or host: sqlite:////absolute/path.db)"
        raise _not_a_database_url(database_url, why) from exc

    @event.listens_for(engine, "connect")
    def _tune_sqlite(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            if path is not None:
                cursor.execute("PRAGMA journal_mode=WAL")
                cursor.execute("PRAGMA synchronous=NORMAL")  # safe with WAL; fsync at checkpoints only
            cursor.execute(f"PRAGMA busy_timeout={int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
            cursor.execute("PRAGMA foreign_keys=ON")
        finally:
            cursor.close()

    return engine


def sqlite_damage(engine: Engine) -> str | None:
    """What SQLite's `quick_check` finds wrong with the database of `engine` (None: nothing, or not a
    SQLite database). A copy of a running server's files (its WAL and database copied moments apart) or a
    failing disk gives a malformed database, which served every request touching it a 500 while /ready said
    ready."""
    if engine.dialect.name != "sqlite":
        return None
    try:
        with engine.connect() as conn:
            found = [row[0] for row in conn.execute(text("PRAGMA quick_check"))]
    except DBAPIError as exc:  # "database disk image is malformed" may come as an error
        found = [str(exc.orig)]
    if found == ["ok"]:
        return None
    lines = [line for row in found for line in str(row).splitlines() if line and not line.startswith("***")]
    return (
        f"the database is damaged ({'; '.join(lines[:2])[:200]}): stop the server and restore the last "
        "backup (docs/deploy.md, Backups)"
    )


def _private(path: Path) -> None:
    """The database holds key hashes, voices and job texts: readable by its owner only (0600). SQLite
    gives its -wal and -shm files the database's permissions."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
        if path.stat().st_mode & 0o077 and path.stat().st_uid == os.geteuid():
            os.chmod(path, 0o600)
    except OSError:  # a read-only mount, someone else's file: SQLite says what is wrong when it opens it
        pass


def add_missing_columns(engine: Engine, table: Table, sql_defaults: dict[str, str] | None = None) -> None:
    """Give a table made by an earlier version the columns added since (nullable, or with the SQL
    default in `sql_defaults`, e.g. {"attempt": "NOT NULL DEFAULT 0"}). Safe with several processes."""
    present = {column["name"] for column in inspect(engine).get_columns(table.name)}
    for column in table.columns:
        if column.name in present:
            continue
        kind = column.type.compile(dialect=engine.dialect)
        extra = (sql_defaults or {}).get(column.name, "")
        try:
            with engine.begin() as conn:
                conn.execute(
                    text(f"ALTER TABLE {table.name} ADD COLUMN {column.name} {kind} {extra}".strip())
                )
        except DBAPIError:  # another process added it first
            if column.name not in {c["name"] for c in inspect(engine).get_columns(table.name)}:
                raise


def _not_a_database_url(database_url: str, why: str = "") -> SettingsError:
    return SettingsError(
        f"database_url {masked_url(database_url)!r} is not a database URL{why}: use e.g. "
        "sqlite:///path/cosyserve.db or postgresql+psycopg://user:password@host/cosyserve"
    )


def _parse(database_url: str) -> URL:
    try:
        url = make_url(database_url)
    except ArgumentError as exc:
        raise _not_a_database_url(database_url) from exc
    # psycopg 3 is the driver cosyserve installs; plain `postgresql://` would mean psycopg2 on SQLAlchemy 2.0,
    # and `postgres://` (as many hosting services write it) is not a dialect name at all.
    if url.drivername in ("postgres", "postgresql"):
        url = url.set(drivername="postgresql+psycopg")
    return url


def _postgresql_engine(url: URL, *, echo: bool) -> Engine:
    """PostgreSQL with psycopg 3: a small pool per process, connections checked before use (a database
    restart or a proxy timing out idle connections must not fail the next request) and recycled hourly."""
    try:
        return create_engine(
            url,
            echo=echo,
            pool_pre_ping=True,
            pool_size=PG_POOL_SIZE,
            max_overflow=PG_MAX_OVERFLOW,
            pool_recycle=3600,
            pool_timeout=30,
        )
    except ModuleNotFoundError as exc:
        raise SettingsError(
            f"database_url uses PostgreSQL but its driver is missing ({exc.name}): "
            "install psycopg with `pip install 'psycopg[binary]'` (or cosyserve[distributed])"
        ) from exc


def table(metadata: MetaData, name: str, *columns: Any) -> Table:
    """The table `name` of `metadata`, defined with `columns` the first time it is asked for: every store
    of one kind shares the definition."""
    if name in metadata.tables:
        return metadata.tables[name]
    return Table(name, metadata, *columns)


def create_tables(engine: Engine, *tables: Table) -> None:
    """Create those of `tables` that don't exist yet. Safe when several processes start at once: on
    PostgreSQL they take turns under an advisory lock (DDL is transactional there); elsewhere a creation
    that lost the race to another process is ignored once the table is seen to exist. A table made by an
    earlier version gets the indexes added to its definition since."""
    for table in tables:
        try:
            with engine.begin() as conn:
                if conn.dialect.name == "postgresql":
                    conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": SCHEMA_LOCK_KEY})
                table.create(conn, checkfirst=True)
                for index in table.indexes:  # (expression indexes are not reflected: IF NOT EXISTS)
                    conn.execute(CreateIndex(index, if_not_exists=True))
        except DBAPIError:
            if not inspect(engine).has_table(table.name):
                raise


def create_all(engine: Engine) -> None:
    """Create every table defined on `metadata` that does not exist yet (import the stores first)."""
    create_tables(engine, *metadata.sorted_tables)
