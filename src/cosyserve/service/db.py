"""The database: one SQLAlchemy engine per process and one MetaData every store defines its tables on.

SQLite (the default) is tuned for a threaded server: WAL journal so readers do not block the writer, a busy
timeout so concurrent writers wait instead of failing, and connections usable from any thread. PostgreSQL
(`postgresql+psycopg://…`) works unchanged for several nodes sharing one database.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, MetaData, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.pool import QueuePool

from cosyserve.errors import SettingsError

SQLITE_BUSY_TIMEOUT_S = 30.0

# Every store's tables live here, so `create_all` creates them all and tests can use one in-memory database.
metadata = MetaData()


def sqlite_path(database_url: str) -> Path | None:
    """The file behind a SQLite URL; None for in-memory SQLite and for other databases."""
    url = make_url(database_url)
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return None
    return Path(url.database)


def make_engine(database_url: str, *, echo: bool = False) -> Engine:
    """An engine for `database_url`; for SQLite files the parent directory is created."""
    try:
        url = make_url(database_url)
    except ArgumentError as exc:
        raise SettingsError(
            f"database_url {database_url!r} is not a database URL: use e.g. sqlite:///path/cosyserve.db"
        ) from exc
    if url.get_backend_name() != "sqlite":
        return create_engine(url, echo=echo, pool_pre_ping=True)

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
    engine = create_engine(url, **kwargs)

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


def create_all(engine: Engine) -> None:
    """Create every table defined on `metadata` that does not exist yet (import the stores first)."""
    metadata.create_all(engine)
