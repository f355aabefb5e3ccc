"""Jobs and batch items whose result was deleted stop pointing at it.

A job's record and a batch's items keep their output's id, from which their views sign download links.
When that output is deleted (`DELETE /v1/outputs/{id}`, the web UI's history), a job still read `done`
with a `result_url` that answered 404, and a batch item the same. So the deletion also clears the id
from the rows that name it: a job then reads `done` without a result and says `result_deleted`, a batch
item `done` without a file (its ZIP's manifest says `missing`). Outputs removed by retention (age, the
size cap) are followed the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from sqlalchemy import Engine, select, update

from cosyserve.service.stores.batches import batch_items_table
from cosyserve.service.stores.job_table import jobs_table

log = logging.getLogger(__name__)

DELETED = "result_deleted"  # the flag a job's `result_extra` gets


FORGET_CHUNK = 500  # output ids cleared per transaction (one each made a pass of 36,000 take 55 s)


def forget_output(engine: Engine, output_id: str) -> int:
    """Clear `output_id` from the jobs and batch items that name it; returns how many rows changed."""
    return forget_outputs(engine, [output_id])


def forget_outputs(engine: Engine, output_ids: Sequence[str]) -> int:
    """Clear `output_ids` from the jobs and batch items that name them, a chunk per transaction; returns
    how many rows changed."""
    changed = 0
    for start in range(0, len(output_ids), FORGET_CHUNK):
        chunk = list(output_ids[start : start + FORGET_CHUNK])
        with engine.begin() as conn:
            jobs = conn.execute(
                select(jobs_table.c.id, jobs_table.c.result_extra).where(jobs_table.c.output_id.in_(chunk))
            ).all()
            for job_id, extra in jobs:
                conn.execute(
                    update(jobs_table)
                    .where(jobs_table.c.id == job_id)
                    .values(output_id=None, result_extra={**(extra or {}), DELETED: True})
                )
            named = batch_items_table.c.output_id.in_(chunk)
            items = conn.execute(update(batch_items_table).where(named).values(output_id=None))
        changed += len(jobs) + int(items.rowcount)
    return changed


def forget_missing(engine: Engine, removed: Callable[[str], bool], exists: Callable[[str], bool]) -> int:
    """Clear every job's and batch item's output id whose output is gone (deleted by a version before
    these links were cleared, or by hand); returns how many rows changed. For a node whose outputs are
    all local. Where the output directory holds fewer than half the outputs jobs name, it is not taken for
    the one they were saved in (one start on an empty or unmounted folder cut every job from its result
    for good): only outputs `removed` says are gone (deleted there, or past retention's age) are cleared,
    the others stay linked, with a warning."""
    with engine.connect() as conn:
        named: set[str] = set()
        for column in (jobs_table.c.output_id, batch_items_table.c.output_id):
            named |= set(conn.execute(select(column).where(column.is_not(None))).scalars())
    missing = [output_id for output_id in sorted(named) if not exists(output_id)]
    if 2 * len(missing) <= len(named):  # the folder they were saved in: what it lacks was deleted
        return forget_outputs(engine, missing)
    gone = [output_id for output_id in missing if removed(output_id)]
    if len(missing) > len(gone):
        log.warning(
            "%d of the %d results that jobs and batch items name are not in the output directory and were "
            "not deleted there: left linked (is --output-dir the folder they were saved in, and mounted?)",
            len(missing) - len(gone),
            len(named),
        )
    return forget_outputs(engine, gone)
