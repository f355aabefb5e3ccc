"""A throwaway PostgreSQL cluster for the test session (the `postgres_url` fixture).

`initdb` + `pg_ctl` from PATH or /usr/lib/postgresql/*/bin, a data directory in a fresh temp dir, trust
authentication, listening on 127.0.0.1 at a free port with its socket in the same temp dir; database
`cosyserve_test`. Running as root, the server runs as the `postgres` OS user (PostgreSQL refuses root).
Without PostgreSQL or psycopg the tests that use it are skipped, except in CI (CI=true), where they fail.
About a second to start; stopped and deleted at the end of the session.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

DATABASE = "cosyserve_test"
START_TIMEOUT_S = 30


def find_pg_bin() -> Path | None:
    """The directory holding `initdb` and `pg_ctl` (newest installed version when several are)."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).resolve().parent
    versions = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name.split(".")[0] or 0)
    )
    for candidate in reversed(versions):
        if (Path(candidate) / "initdb").is_file() and (Path(candidate) / "pg_ctl").is_file():
            return Path(candidate)
    return None


def _missing(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}: install postgresql (initdb, pg_ctl) and psycopg for the PostgreSQL tests")
    pytest.skip(reason)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PostgresCluster:
    """One `initdb`-made cluster under `base`, started and stopped with `pg_ctl`."""

    def __init__(self, bin_dir: Path, base: Path) -> None:
        self.bin_dir, self.base = bin_dir, base
        self.data = base / "data"
        self.port = _free_port()
        self.as_postgres = os.geteuid() == 0  # the server refuses to run as root

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        command = [str(self.bin_dir / args[0]), *args[1:]]
        if self.as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        return subprocess.run(command, capture_output=True, text=True, timeout=START_TIMEOUT_S, check=False)

    def start(self) -> str:
        if self.as_postgres:
            shutil.chown(self.base, "postgres")
        made = self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8",
                         "--locale=C", "--no-sync")  # fmt: skip
        if made.returncode != 0:
            raise RuntimeError(f"initdb failed: {made.stderr or made.stdout}")
        options = (
            f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.base} "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"  # speed over safety
        )
        started = self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.base / "log"),
                            "-w", "-t", str(START_TIMEOUT_S), "start")  # fmt: skip
        if started.returncode != 0:
            log = (self.base / "log").read_text(errors="replace") if (self.base / "log").exists() else ""
            raise RuntimeError(f"pg_ctl start failed: {started.stderr or started.stdout}\n{log[-2000:]}")
        import psycopg

        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres",
                             autocommit=True) as conn:  # fmt: skip
            conn.execute(f"CREATE DATABASE {DATABASE}")
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{DATABASE}"

    def stop(self) -> None:
        if self.data.exists():
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.base, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A SQLAlchemy URL of an empty database on a throwaway PostgreSQL server (shared by the session)."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        _missing("psycopg is not installed")
    bin_dir = find_pg_bin()
    if bin_dir is None:
        _missing("PostgreSQL binaries (initdb, pg_ctl) not found")
    assert bin_dir is not None
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            _missing("running as root needs a `postgres` OS user to run PostgreSQL as")
        if shutil.which("runuser") is None:
            _missing("running as root needs `runuser` to start PostgreSQL as the postgres user")
    with _lock:
        if _shared.users == 0:
            # Not pytest's tmp_path: its directories are private to root, and the server runs as `postgres`.
            cluster = PostgresCluster(bin_dir, Path(tempfile.mkdtemp(prefix="cosyserve-pg-")))
            try:
                _shared.url = cluster.start()
            except BaseException:
                cluster.stop()
                raise
            _shared.cluster = cluster
        _shared.users += 1
    try:
        yield _shared.url
    finally:
        with _lock:
            _shared.users -= 1
            if _shared.users == 0 and _shared.cluster is not None:
                _shared.cluster.stop()
                _shared.cluster = None


class _Shared:
    """One cluster per session even when the fixture is imported into several modules (each import
    is a fixture of its own to pytest)."""

    cluster: PostgresCluster | None = None
    url = ""
    users = 0


_shared = _Shared()
_lock = threading.Lock()


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database, once per kind: a SQLite file, or the session's PostgreSQL (emptied after)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'test.db'}"
        return
    url = request.getfixturevalue("postgres_url")
    yield url
    import sqlalchemy as sa

    from cosyserve.service.stores.db import make_engine

    engine = make_engine(url)
    tables = sa.MetaData()
    tables.reflect(engine)
    tables.drop_all(engine)
    engine.dispose()
