"""One single server per data directory and per database.

A single server owns its jobs: at start it puts back in the queue whatever its database says was running
(an earlier process of it died). A second server started on the same data directory, or on another one
with the same database (`--database-url`), read the first one's running job as left behind, ran it a
second time and charged its key twice. `hold_single_server` takes, for the server's lifetime, an exclusive
lock on `<data dir>/server.lock`, on the same file beside a SQLite database kept elsewhere, and a
PostgreSQL advisory lock on a PostgreSQL database; the system (or the database) drops each when the
process ends, a crash included. A second server is refused. Servers of a cluster (`--queue`) share their
database on purpose and take none of these.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import IO, Any

from cosyserve.errors import InputError

LOCK_NAME = "server.lock"
PG_LOCK_KEY = 0x636F7365  # "cose": the advisory lock a single server holds on its PostgreSQL database
_ADVICE = "(servers that share one database run as a cluster: --queue, docs/deploy.md)"


class HeldServer:
    """The locks a single server holds; `close()` gives them back (the next server may start)."""

    def __init__(self) -> None:
        self._held: list[Any] = []

    def hold(self, lock: Any) -> None:
        self._held.append(lock)

    def close(self) -> None:
        for lock in reversed(self._held):
            with contextlib.suppress(Exception):
                lock.close()
        self._held.clear()


def hold_single_server(data_dir: Path, database_url: str, output_dir: Path | None = None) -> HeldServer:
    """Every lock a single server on `data_dir`, `database_url` and `output_dir` needs; InputError naming
    who holds one when another server does (the ones taken before are given back). Two servers on one
    output directory listed each other's users' outputs as their own keys' (both number keys from 1),
    applied their retention to the other's files and removed the other's running jobs' kept pieces."""
    from cosyserve.service.stores.db import sqlite_path

    held = HeldServer()
    try:
        held.hold(hold_data_dir(data_dir))
        if output_dir is not None and output_dir.resolve() != data_dir.resolve():
            held.hold(hold_data_dir(output_dir, what=f"the output directory {output_dir}"))
        database = sqlite_path(database_url)
        if database is not None and database.parent.resolve() != data_dir.resolve():
            held.hold(hold_data_dir(database.parent, what=f"the database {database}"))
        elif database is None and database_url.startswith("postgresql"):
            held.hold(_hold_postgresql(database_url))
    except BaseException:
        held.close()
        raise
    return held


def hold_data_dir(data_dir: Path, what: str | None = None) -> IO[str]:
    """The open lock file of `data_dir` (keep it while the server runs); InputError when another server
    holds it."""
    data_dir.mkdir(parents=True, exist_ok=True)
    handle = open(data_dir / LOCK_NAME, "a+", encoding="utf-8")  # noqa: SIM115 (held until exit)
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise InputError(
            f"another cosyserve server ({holder}) serves {what or data_dir}: stop it, or give this one its "
            f"own --data-dir {_ADVICE}"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()}\n")
    handle.flush()
    return handle


class _PostgresLock:
    def __init__(self, engine: Any, connection: Any) -> None:
        self.engine, self.connection = engine, connection

    def close(self) -> None:
        self.connection.close()  # the session ends, and its advisory lock with it
        self.engine.dispose()


def _hold_postgresql(database_url: str) -> _PostgresLock:
    import sqlalchemy as sa

    from cosyserve.service.stores.db import make_engine

    engine = make_engine(database_url)
    connection = engine.connect()
    query = sa.text("SELECT pg_try_advisory_lock(:key)")
    got = connection.execute(query, {"key": PG_LOCK_KEY}).scalar()
    connection.commit()  # (a session lock outlives the transaction)
    if not got:
        connection.close()
        engine.dispose()
        raise InputError(f"another cosyserve server serves this PostgreSQL database: stop it {_ADVICE}")
    return _PostgresLock(engine, connection)
