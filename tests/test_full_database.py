"""A database whose disk is full (or a process out of open files) is a 503 `storage_error` a client may
retry, never a 500 or a 400 that blames its input; reads keep working; work that made its audio keeps it;
a job's end is recorded once the database can be written again, not left "running" until a restart."""

from __future__ import annotations

import errno
import sqlite3
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import sqlalchemy as sa

from cosyserve.errors import Cancelled, InputError, StorageError, error_kind, is_resource_exhausted
from cosyserve.service.access.quota import QuotaTracker
from cosyserve.service.local import job_state
from cosyserve.service.local.job_state import JobStateRecorder
from cosyserve.service.requests import OutputSpec
from cosyserve.service.reservations import QuotaReservations
from cosyserve.service.stores.batches import BatchStore
from cosyserve.service.stores.db import make_engine
from cosyserve.service.stores.jobs import JobStore
from cosyserve.service.stores.keys import ApiKey, KeyStore


def disk_full() -> sa.exc.OperationalError:
    """What SQLAlchemy raises when SQLite's disk is full."""
    driver = sqlite3.OperationalError("database or disk is full")
    driver.sqlite_errorname = "SQLITE_FULL"  # type: ignore[attr-defined]
    return sa.exc.OperationalError("UPDATE …", {}, driver)


def test_exhausted_resources_are_503_storage_errors() -> None:
    for exc in (disk_full(), OSError(errno.ENOSPC, "No space left"), OSError(errno.EMFILE, "Too many")):
        assert is_resource_exhausted(exc) and (error_kind(exc).code, error_kind(exc).status) == (
            "storage_error",
            503,
        )
    busy = sqlite3.OperationalError("database is locked")
    assert not is_resource_exhausted(sa.exc.OperationalError("x", {}, busy))
    assert error_kind(ValueError("x")).code == "internal"


def test_a_key_is_let_in_when_its_last_use_cannot_be_written(tmp_path: Path, monkeypatch) -> None:
    store = KeyStore(make_engine(f"sqlite:///{tmp_path / 'keys.db'}"), sa.MetaData())
    record, plaintext = store.create("alice")
    monkeypatch.setattr(store.engine, "begin", lambda: (_ for _ in ()).throw(disk_full()))
    assert store.authenticate(plaintext).id == record.id  # bookkeeping, not a lock-out of every key


def test_usage_that_cannot_be_written_is_a_storage_error_and_the_audio_is_kept(tmp_path, monkeypatch) -> None:
    tracker = QuotaTracker(make_engine(f"sqlite:///{tmp_path / 'q.db'}"), sa.MetaData())
    key = ApiKey(1, "k", "cs_abcdefgh", "user", 0.0, None, None, 100.0, None)
    monkeypatch.setattr(tracker.engine, "begin", lambda: (_ for _ in ()).throw(disk_full()))
    with pytest.raises(StorageError, match="disk is full") as raised:
        tracker.add(key, 1.0)
    assert not isinstance(raised.value, InputError)  # it was a 400 that blamed the request
    spec = OutputSpec(key=key)
    QuotaReservations(tracker).settle(spec, 2.5)  # logged: the request still gets its audio


def test_a_jobs_end_is_recorded_once_the_database_takes_it(tmp_path: Path, monkeypatch) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'jobs.db'}")
    jobs, batches = JobStore(engine), BatchStore(engine)
    job = jobs.create({"text": "x"})
    claimed = jobs.claim(job.id, "here", lease_s=30)
    recorded = threading.Event()
    recorded.set()
    recorder = JobStateRecorder(jobs, batches, None, job.id, "tts", recorded, attempt=claimed.attempt)  # type: ignore[arg-type]
    monkeypatch.setattr(job_state, "RECORD_RETRY_S", 0.01)
    finish, refusals = jobs.finish_with_exception, [3]

    def full_for_a_while(*args, **kwargs):
        if refusals[0] > 0:
            refusals[0] -= 1
            raise disk_full()
        return finish(*args, **kwargs)

    monkeypatch.setattr(jobs, "finish_with_exception", full_for_a_while)
    recorder(SimpleNamespace(error=Cancelled("cancelled by the client"), value=None), "cancelled")
    deadline = threading.Event()
    for _ in range(500):
        if jobs.get(job.id).state == "cancelled":
            break
        deadline.wait(0.01)
    assert jobs.get(job.id).state == "cancelled" and refusals == [0]


def test_a_damaged_database_is_a_503_saying_so_without_the_drivers_text() -> None:
    """A malformed database answered a bare 500 `internal` (and a full one's 503 quoted the driver's
    text, its SQL included)."""
    import json

    from cosyserve.api.errors import error_response

    malformed = sqlite3.DatabaseError("database disk image is malformed")
    malformed.sqlite_errorname = "SQLITE_CORRUPT"  # type: ignore[attr-defined]
    damaged = sa.exc.DatabaseError("SELECT secret FROM jobs", {}, malformed)
    for exc, says in ((damaged, "database is damaged"), (disk_full(), "storage is full")):
        response = error_response(exc)
        error = json.loads(response.body)["error"]
        assert response.status_code == 503 and error["code"] == "storage_error", error
        assert (
            says in error["message"] and "SELECT" not in error["message"] and "UPDATE" not in error["message"]
        )
