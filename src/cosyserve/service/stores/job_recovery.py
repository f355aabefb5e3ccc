"""What a single server's start finds of the jobs an earlier process left: running ones go back to the
queue as their next attempt, or fail past the retry limit (a batch that finished items in its last attempt
is making progress, not crashing the server: it goes on); a record that cannot be read fails on its own
(`JobStore` has these methods)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, delete, exists, select, update

from cosyserve.service.stores.batches import batch_items_table
from cosyserve.service.stores.job_charges import ACTIVE_STATES
from cosyserve.service.stores.job_table import JobRecord, job_inputs_table, jobs_table, utc_now

log = logging.getLogger(__name__)

INTERRUPTED_CODE = "interrupted"
INTERRUPTED_MESSAGE = "interrupted by a restart"


class JobRecovery:
    """The restart part of `JobStore`."""

    engine: Engine

    def get(self, job_id: str) -> JobRecord | None: ...  # `JobStore.get`

    def requeue_interrupted(
        self, max_attempts: int, progressed: Callable[[str, int], bool] = lambda job_id, attempt: False
    ) -> tuple[list[JobRecord], list[JobRecord]]:
        """At startup (single process): jobs an earlier process left running go back to the queue, to run
        again as their next attempt, unless they used up `max_attempts` (those fail) without progressing
        in their last attempt (a batch's items done then; a long text's pieces kept then: `progressed(job
        id, attempt)`). Returns the queued jobs, oldest first, and the failed ones; a record that cannot
        be read fails (logged), and the server starts anyway."""
        items = batch_items_table.c
        made_items = exists().where(  # a batch that finished items in its last attempt: no crash loop
            items.batch_id == jobs_table.c.id, items.state == "done", items.attempt == jobs_table.c.attempt
        )
        used_up = (jobs_table.c.state == "running") & (jobs_table.c.attempt >= max_attempts) & ~made_items
        with self.engine.begin() as conn:
            candidates = conn.execute(
                select(jobs_table.c.id, jobs_table.c.kind, jobs_table.c.attempt).where(used_up)
            ).all()
            failed_ids = [
                job_id
                for job_id, kind, attempt in candidates
                if kind != "tts" or not progressed(job_id, attempt)
            ]
            conn.execute(
                update(jobs_table)
                .where(jobs_table.c.id.in_(failed_ids), jobs_table.c.state == "running")
                .values(
                    state="failed",
                    finished_at=utc_now(),
                    lease_until=None,
                    error_code=INTERRUPTED_CODE,
                    error_message=f"{INTERRUPTED_MESSAGE} on every attempt it had (job_max_attempts = "
                    f"{max_attempts}): resubmit it, or look in the server log for what stops the server "
                    "while it runs",
                )
            )
            conn.execute(
                update(jobs_table)
                .where(jobs_table.c.state == "running")
                .values(state="queued", lease_until=None, worker=None)
            )
            conn.execute(delete(job_inputs_table).where(~job_inputs_table.c.job_id.in_(_active_ids())))
            queued_ids = list(
                conn.execute(
                    select(jobs_table.c.id)
                    .where(jobs_table.c.state == "queued")
                    .order_by(jobs_table.c.created_at, jobs_table.c.id)
                ).scalars()
            )
        return self._readable(queued_ids), self._readable(failed_ids)

    def _readable(self, job_ids: list[str]) -> list[JobRecord]:
        """The records of `job_ids`; one that cannot be read (its JSON damaged) is failed and left out."""
        records = []
        for job_id in job_ids:
            try:
                record = self.get(job_id)
            except Exception as exc:  # one bad row must not keep the server from starting
                log.error("job %s: its record cannot be read (%s); it is marked failed", job_id, exc)
                with self.engine.begin() as conn:
                    conn.execute(
                        update(jobs_table)
                        .where(jobs_table.c.id == job_id)
                        .values(
                            state="failed",
                            finished_at=utc_now(),
                            lease_until=None,
                            error_code="unreadable",
                            error_message="its record in the database is damaged: submit it again",
                        )
                    )
                continue
            if record is not None:
                records.append(record)
        return records


def _active_ids() -> Any:
    return select(jobs_table.c.id).where(jobs_table.c.state.in_(ACTIVE_STATES))
