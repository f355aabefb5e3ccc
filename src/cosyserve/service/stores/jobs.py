"""Persistent job records: what was asked, where it stands, and how it ended.

Every accepted job ends in exactly one of done, failed (with a reason) or cancelled. State changes are
single conditional UPDATEs (`… WHERE state IN (allowed)`), so two threads or processes racing to finish
the same job cannot both succeed: the loser gets `JobStateError` and no second result is recorded.

Workers take jobs with `claim`: it moves a queued job, or a running one whose lease ran out (its worker
died), to running under a new `attempt` number with a lease the worker renews while it works. Progress and
results written with that attempt number only land while the attempt is still the current one, so a worker
that lost its job (cancelled, or taken over after a stall) cannot record a second result. A single server
claims its own jobs the same way; when it starts, the jobs an earlier process left running go back to the
queue (`requeue_interrupted`) and are claimed again as their next attempt, up to a retry limit.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    Engine,
    delete,
    func,
    insert,
    select,
    update,
)

from cosyserve.errors import Cancelled, InputError, JobStateError, error_code
from cosyserve.errors import JobNotFound as JobNotFound  # defined there, with the error table
from cosyserve.service.requests import TERMINAL_STATES
from cosyserve.service.stores.batches import batch_items_table
from cosyserve.service.stores.db import create_tables
from cosyserve.service.stores.job_charges import ACTIVE_STATES, JobCharges
from cosyserve.service.stores.job_recovery import INTERRUPTED_CODE as INTERRUPTED_CODE
from cosyserve.service.stores.job_recovery import INTERRUPTED_MESSAGE as INTERRUPTED_MESSAGE
from cosyserve.service.stores.job_recovery import JobRecovery
from cosyserve.service.stores.job_table import (
    JobRecord,
    add_missing_columns,
    clean_text,
    fit_to_column,
    is_job_id,
    job_inputs_table,
    jobs_table,
    record_from_row,
    sanitize_params,
    utc_now,
)

MAX_PAGE = 500


class JobStore(JobRecovery, JobCharges):
    """Create, read and move jobs through queued → running → done | failed | cancelled (and count what
    each is charged: `JobCharges`; what a restart finds: `JobRecovery`)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        create_tables(engine, jobs_table, job_inputs_table, batch_items_table)  # (recovery reads its items)
        add_missing_columns(engine)

    def create(
        self,
        params: Mapping[str, Any],
        *,
        kind: str = "tts",
        owner: str | None = None,
        job_id: str | None = None,
        spec: Mapping[str, Any] | None = None,
        reserved_s: float | None = None,
        prompt_wav: bytes | None = None,
    ) -> JobRecord:
        """A new queued job; `params` are stored sanitized (no raw audio), `owner` cut to fit (`_fit`).
        `spec`: how its result is delivered (to run it again); `reserved_s`: audio seconds its key's quota
        sets aside; `prompt_wav`: an uploaded recording, kept until the job ends."""
        if job_id is not None and not is_job_id(job_id):
            raise InputError(f"job id {job_id!r} is not usable: use 1-32 letters, digits, '-' or '_'")
        row = {
            "id": job_id or uuid.uuid4().hex,
            "kind": kind,
            "state": "queued",
            "progress": 0.0,
            "owner": fit_to_column(owner, jobs_table.c.owner),
            "created_at": utc_now(),
            "params": sanitize_params(dict(params)),
            "spec": sanitize_params(dict(spec)) if spec is not None else None,
            "reserved_s": reserved_s,
        }
        with self.engine.begin() as conn:
            conn.execute(insert(jobs_table).values(**row))
            if prompt_wav is not None:
                conn.execute(insert(job_inputs_table).values(job_id=row["id"], prompt_wav=bytes(prompt_wav)))
        return self._require(row["id"])

    def prompt_wav(self, job_id: str) -> bytes | None:
        """The recording uploaded with a job that has not ended yet (None: none, or it ended)."""
        if not is_job_id(job_id):
            return None
        query = select(job_inputs_table.c.prompt_wav).where(job_inputs_table.c.job_id == job_id)
        with self.engine.connect() as conn:
            value = conn.execute(query).scalar()
        return bytes(value) if value is not None else None

    def get(self, job_id: str) -> JobRecord | None:
        """The job, or None when there is none with that id (or `job_id` is not a job id at all)."""
        if not is_job_id(job_id):
            return None
        with self.engine.connect() as conn:
            row = conn.execute(select(jobs_table).where(jobs_table.c.id == job_id)).mappings().first()
        return record_from_row(row) if row is not None else None

    def list(
        self,
        *,
        owner: str | None = None,
        state: str | None = None,
        limit: int = 50,
        offset: int = 0,
        kinds: tuple[str, ...] | None = None,
    ) -> list[JobRecord]:
        """Newest first; `owner=None` lists every owner's jobs (admin view); `kinds`: only these kinds."""
        if not 1 <= limit <= MAX_PAGE + 1:  # (+1: a page reads one more to say whether more follow)
            raise InputError(f"limit must be between 1 and {MAX_PAGE}, got {limit}")
        if offset < 0:
            raise InputError(f"offset must be 0 or more, got {offset}")
        query = select(jobs_table).order_by(jobs_table.c.created_at.desc(), jobs_table.c.id.desc())
        if owner is not None:  # stored cleaned and cut (`create`): compare with the same
            query = query.where(jobs_table.c.owner == fit_to_column(owner, jobs_table.c.owner))
        if state is not None:
            query = query.where(jobs_table.c.state == clean_text(state))
        if kinds is not None:
            query = query.where(jobs_table.c.kind.in_(kinds))
        with self.engine.connect() as conn:
            rows = conn.execute(query.limit(limit).offset(offset)).mappings().all()
        return [record_from_row(row) for row in rows]

    def count(self, *, owner: str | None = None, state: str | None = None) -> int:
        query = select(func.count()).select_from(jobs_table)
        if owner is not None:  # stored cleaned and cut (`create`): compare with the same
            query = query.where(jobs_table.c.owner == fit_to_column(owner, jobs_table.c.owner))
        if state is not None:
            query = query.where(jobs_table.c.state == clean_text(state))
        with self.engine.connect() as conn:
            return int(conn.execute(query).scalar_one())

    # -- transitions -------------------------------------------------------------------------------------

    def mark_running(self, job_id: str) -> JobRecord:
        return self._transition(job_id, ("queued",), state="running", started_at=utc_now())

    def set_progress(self, job_id: str, fraction: float, *, attempt: int | None = None) -> bool:
        """Record progress of a running job; False (and no change) when it is no longer running (or no
        longer this `attempt`'s)."""
        if not is_job_id(job_id):
            return False
        fraction = min(1.0, max(0.0, float(fraction)))
        with self.engine.begin() as conn:
            result = conn.execute(
                update(jobs_table)
                .where(jobs_table.c.id == job_id, jobs_table.c.state == "running", *_of_attempt(attempt))
                .values(progress=fraction)
            )
        return result.rowcount == 1

    # -- claims (workers, and a single server's own jobs) -------------------------------------------------

    def claim(self, job_id: str, worker: str, lease_s: float) -> JobRecord | None:
        """Take a queued job, or a running one whose lease expired, for `worker`; None when it is not
        claimable (finished, or held by a live worker). The returned record's `attempt` is the caller's."""
        current = self.get(job_id)
        if current is None or current.is_terminal:
            return None
        now = utc_now()
        claimable = jobs_table.c.state == "queued"
        if current.state == "running":
            if current.lease_until is not None and current.lease_until > now:
                return None
            claimable = (jobs_table.c.state == "running") & (
                jobs_table.c.lease_until.is_(None) | (jobs_table.c.lease_until <= now)
            )
        with self.engine.begin() as conn:
            # The attempt number is the optimistic lock: of two racing claimers only one matches it.
            result = conn.execute(
                update(jobs_table)
                .where(jobs_table.c.id == job_id, jobs_table.c.attempt == current.attempt, claimable)
                .values(
                    state="running",
                    attempt=current.attempt + 1,
                    worker=fit_to_column(worker, jobs_table.c.worker),
                    lease_until=now + timedelta(seconds=lease_s),
                    started_at=current.started_at or now,
                )
            )
        return self.get(job_id) if result.rowcount == 1 else None

    def lease_expired(self, before: datetime, limit: int = 100) -> list[JobRecord]:
        """Running jobs whose lease ran out before `before` (their worker stopped renewing it)."""
        expired = (jobs_table.c.state == "running") & (jobs_table.c.lease_until < before)
        query = select(jobs_table).where(expired).order_by(jobs_table.c.lease_until).limit(limit)
        with self.engine.connect() as conn:
            return [record_from_row(row) for row in conn.execute(query).mappings()]

    def renew(self, job_id: str, attempt: int, lease_s: float) -> bool:
        """Extend a running job's lease; False when this attempt lost it (cancelled, finished, taken)."""
        if not is_job_id(job_id):
            return False
        with self.engine.begin() as conn:
            result = conn.execute(
                update(jobs_table)
                .where(jobs_table.c.id == job_id, jobs_table.c.state == "running", *_of_attempt(attempt))
                .values(lease_until=utc_now() + timedelta(seconds=lease_s))
            )
        return result.rowcount == 1

    def release(self, job_id: str, attempt: int) -> JobRecord:
        """A running attempt gives its job back to the queue (a shutdown stopped it): the next start runs
        it again as a new attempt."""
        return self._transition(
            job_id, ("running",), attempt=attempt, state="queued", lease_until=None, worker=None
        )

    def finish_done(
        self,
        job_id: str,
        *,
        output_id: str | None = None,
        output_path: str | None = None,
        duration_s: float | None = None,
        seed: int | None = None,
        extra: Mapping[str, Any] | None = None,
        attempt: int | None = None,
        stopped: BaseException | None = None,
    ) -> JobRecord:
        """Done with its result; with `stopped`, failed (cancelled, for `Cancelled`) for that reason but
        with the part it finished (a quota that ran out, a revoked key, a client's cancel) kept as its
        result."""
        ending: dict[str, Any] = {"state": "done", "progress": 1.0}
        if stopped is not None:
            ending = {
                "state": "cancelled" if isinstance(stopped, Cancelled) else "failed",
                "error_code": fit_to_column(error_code(stopped), jobs_table.c.error_code),
                "error_message": clean_text(str(stopped)),
            }
            partial = (extra or {}).get("partial") or {}
            made, total = partial.get("segments_done"), partial.get("segments_total")
            if isinstance(made, int) and isinstance(total, int) and total > 0:
                # how far it got (the last progress written, at most one a second, was older: a stopped
                # job's progress went back from 0.14 to 0.11)
                ending["progress"] = min(1.0, made / total)
        return self._transition(
            job_id,
            ("running",),
            attempt=attempt,
            **ending,
            finished_at=utc_now(),
            output_id=output_id,
            output_path=output_path,
            duration_s=duration_s,
            seed=seed,
            result_extra=sanitize_params(dict(extra)) if extra is not None else None,
        )

    def finish_failed(self, job_id: str, code: str, message: str, *, attempt: int | None = None) -> JobRecord:
        return self._transition(
            job_id,
            ACTIVE_STATES,
            attempt=attempt,
            state="failed",
            finished_at=utc_now(),
            error_code=fit_to_column(code, jobs_table.c.error_code),
            error_message=clean_text(message),
        )

    def finish_cancelled(
        self, job_id: str, message: str = "cancelled", *, attempt: int | None = None
    ) -> JobRecord:
        return self._transition(
            job_id,
            ACTIVE_STATES,
            attempt=attempt,
            state="cancelled",
            finished_at=utc_now(),
            error_code="cancelled",
            error_message=clean_text(message),
        )

    def finish_with_exception(
        self, job_id: str, exc: BaseException, *, attempt: int | None = None
    ) -> JobRecord:
        """Failed (or cancelled, for `Cancelled`) with the exception's code and message."""
        if isinstance(exc, Cancelled):
            return self.finish_cancelled(job_id, str(exc) or "cancelled", attempt=attempt)
        return self.finish_failed(job_id, error_code(exc), str(exc) or type(exc).__name__, attempt=attempt)

    def add_result_extra(self, job_id: str, extra: Mapping[str, Any]) -> None:
        """Merge `extra` into a finished job's `result_extra` (what an ended batch kept, found after it)."""
        record = self.get(job_id)
        if record is None:
            return
        merged = {**(record.result_extra or {}), **extra}
        with self.engine.begin() as conn:
            conn.execute(
                update(jobs_table)
                .where(jobs_table.c.id == job_id)
                .values(result_extra=sanitize_params(merged))
            )

    def purge_finished_before(self, cutoff: datetime, chunk: int = 500) -> int:
        """Delete the records of jobs that ended before `cutoff`, with their batch items (retention), a
        chunk per transaction; returns how many jobs went."""
        ended = select(jobs_table.c.id).where(
            jobs_table.c.state.in_(TERMINAL_STATES), jobs_table.c.finished_at < cutoff
        )
        purged = 0
        while True:
            with self.engine.begin() as conn:
                ids = list(conn.execute(ended.limit(chunk)).scalars())
                if not ids:
                    return purged
                conn.execute(delete(batch_items_table).where(batch_items_table.c.batch_id.in_(ids)))
                conn.execute(delete(jobs_table).where(jobs_table.c.id.in_(ids)))
            purged += len(ids)

    def _transition(
        self, job_id: str, allowed: tuple[str, ...], *, attempt: int | None = None, **values: Any
    ) -> JobRecord:
        if not is_job_id(job_id):
            raise JobStateError(f"no job {job_id!r}: it never existed or was purged")
        terminal = values["state"] in TERMINAL_STATES
        if terminal:
            values["lease_until"] = None
        with self.engine.begin() as conn:
            result = conn.execute(
                update(jobs_table)
                .where(jobs_table.c.id == job_id, jobs_table.c.state.in_(allowed), *_of_attempt(attempt))
                .values(**values)
            )
            if terminal and result.rowcount == 1:  # its recording is no longer needed
                conn.execute(delete(job_inputs_table).where(job_inputs_table.c.job_id == job_id))
        if result.rowcount != 1:
            current = self.get(job_id)
            if current is None:
                raise JobStateError(f"no job {job_id!r}: it never existed or was purged")
            if attempt is not None and current.attempt != attempt and current.state in allowed:
                raise JobStateError(
                    f"job {job_id} was taken over (attempt {current.attempt}, this was {attempt}): "
                    "a job produces one result"
                )
            raise JobStateError(
                f"job {job_id} is {current.state}; it cannot become {values['state']} "
                f"(only from {' or '.join(allowed)}): a job produces one result"
            )
        return self._require(job_id)

    def _require(self, job_id: str) -> JobRecord:
        record = self.get(job_id)
        if record is None:  # pragma: no cover - only if deleted concurrently
            raise JobStateError(f"job {job_id} vanished while being updated")
        return record


def _active_ids() -> Any:
    return select(jobs_table.c.id).where(jobs_table.c.state.in_(ACTIVE_STATES))


def _of_attempt(attempt: int | None) -> tuple[Any, ...]:
    return () if attempt is None else (jobs_table.c.attempt == attempt,)
