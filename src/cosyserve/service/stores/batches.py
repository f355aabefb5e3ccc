"""The items of batch and dubbing jobs: one row per line of a script or cue of a subtitle file.

A batch is a job (`jobs` table, kind "batch" or "dub") whose items live here, each with its own state,
error and stored output. Items run in order; an attempt of the batch job (`JobStore.claim`) writes an item
only while it is still the job's current attempt and the job is running (a conditional UPDATE that checks
the job row in the same statement), so after a takeover or a restart no item is recorded twice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    DateTime,
    Engine,
    Float,
    Index,
    Integer,
    String,
    Table,
    Text,
    exists,
    func,
    insert,
    select,
    update,
)

from cosyserve.service.stores.db import create_tables, metadata
from cosyserve.service.stores.job_table import (
    aware,
    clean_text,
    fit_to_column,
    is_job_id,
    jobs_table,
    sanitize_params,
    utc_now,
)

ITEM_STATES = ("queued", "running", "done", "failed", "cancelled")
UNFINISHED = ("queued", "running")

batch_items_table = Table(
    "batch_items",
    metadata,
    Column("batch_id", String(32), primary_key=True),
    Column("position", Integer, primary_key=True),  # 1, 2, ... in the order given
    Column("name", String(128), nullable=False),
    Column("params", JSON, nullable=False),  # text, voice, instruct, seed, speed, format, cue times
    Column("state", String(16), nullable=False),
    Column("error_code", String(64), nullable=True),
    Column("error_message", Text, nullable=True),
    Column("output_id", String(64), nullable=True),
    Column("duration_s", Float, nullable=True),
    Column("seed", BigInteger, nullable=True),
    Column("attempt", Integer, nullable=True),  # the batch job's attempt that last ran it
    Column("run_s", Float, nullable=True),  # how long its synthesis took (estimates the time left)
    Column("result", JSON, nullable=True),  # what else its run found (a cue's speed, overflow, ...)
    Column("finished_at", DateTime(timezone=True), nullable=True),
    Index("ix_batch_items_output", "output_id"),  # a deleted output's items are found by it (output_refs)
)


@dataclass(frozen=True)
class BatchItem:
    """One row of `batch_items`."""

    batch_id: str
    position: int
    name: str
    params: dict[str, Any]
    state: str
    error_code: str | None
    error_message: str | None
    output_id: str | None
    duration_s: float | None
    seed: int | None
    attempt: int | None
    run_s: float | None
    result: dict[str, Any] | None
    finished_at: datetime | None

    @property
    def file_stem(self) -> str:
        """`0001_<name>`: how its files are named in archives and folders."""
        return f"{self.position:04d}_{self.name}"


@dataclass(frozen=True)
class BatchCounts:
    total: int
    done: int
    failed: int
    cancelled: int
    running: int
    queued: int
    mean_run_s: float | None  # over the items done so far

    @property
    def finished(self) -> int:
        return self.done + self.failed + self.cancelled


class BatchStore:
    """Create a batch's items, read them, and move each through queued → running → done | failed."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        create_tables(engine, batch_items_table)

    def add(self, batch_id: str, items: Sequence[Mapping[str, Any]]) -> None:
        """Items in order: each a mapping with name and params, and for an item refused up front (bad
        text, bad number) its error_code and error_message (it is stored failed)."""
        rows = []
        for position, item in enumerate(items, start=1):
            failed = item.get("error_code") is not None
            rows.append(
                {
                    "batch_id": batch_id,
                    "position": position,
                    "name": fit_to_column(str(item["name"]), batch_items_table.c.name),
                    "params": sanitize_params(dict(item["params"])),
                    "state": "failed" if failed else "queued",
                    "error_code": item.get("error_code"),
                    "error_message": clean_text(item.get("error_message")),
                    "finished_at": utc_now() if failed else None,
                }
            )
        if rows:
            with self.engine.begin() as conn:
                conn.execute(insert(batch_items_table), rows)

    def items(self, batch_id: str, *, offset: int = 0, limit: int | None = None) -> list[BatchItem]:
        if not is_job_id(batch_id):
            return []
        query = (
            select(batch_items_table)
            .where(batch_items_table.c.batch_id == batch_id)
            .order_by(batch_items_table.c.position)
            .offset(offset)
        )
        if limit is not None:
            query = query.limit(limit)
        with self.engine.connect() as conn:
            return [_item(row) for row in conn.execute(query).mappings()]

    def item(self, batch_id: str, position: int) -> BatchItem | None:
        found = self.items(batch_id, offset=max(0, position - 1), limit=1)
        return found[0] if found and found[0].position == position else None

    def next_unfinished(self, batch_id: str) -> BatchItem | None:
        """The first item not yet done, failed or cancelled (where a resumed batch goes on)."""
        query = (
            select(batch_items_table)
            .where(batch_items_table.c.batch_id == batch_id, batch_items_table.c.state.in_(UNFINISHED))
            .order_by(batch_items_table.c.position)
            .limit(1)
        )
        with self.engine.connect() as conn:
            row = conn.execute(query).mappings().first()
        return _item(row) if row is not None else None

    def counts(self, batch_id: str) -> BatchCounts:
        table = batch_items_table
        query = (
            select(table.c.state, func.count(), func.avg(table.c.run_s))
            .where(table.c.batch_id == batch_id)
            .group_by(table.c.state)
        )
        with self.engine.connect() as conn:
            rows = {state: (int(n), avg) for state, n, avg in conn.execute(query)}
        n = {state: rows.get(state, (0, None))[0] for state in ITEM_STATES}
        mean = rows.get("done", (0, None))[1]
        return BatchCounts(
            total=sum(n.values()),
            done=n["done"],
            failed=n["failed"],
            cancelled=n["cancelled"],
            running=n["running"],
            queued=n["queued"],
            mean_run_s=float(mean) if mean is not None else None,
        )

    def kept(self, batch_id: str) -> dict[str, Any]:
        """What a batch that stopped early kept, as its job's result reports it: item counts, the audio
        seconds of its finished items, and `partial` (the positions not made)."""
        items = self.items(batch_id)
        done = [item for item in items if item.state == "done" and item.output_id]
        audio_s = round(sum(item.duration_s or 0.0 for item in done), 3)
        finished = {item.position for item in done}
        return {
            "items": len(items),
            "done": len(done),
            "failed": sum(item.state == "failed" for item in items),
            "audio_s": audio_s,
            "partial": {
                "segments_done": len(done),
                "segments_total": len(items),
                "missing": [item.position for item in items if item.position not in finished],
                "audio_s": audio_s,
            },
        }

    # -- transitions, each only for the batch job's current running attempt -------------------------------

    def start(self, batch_id: str, position: int, attempt: int) -> bool:
        """Mark an unfinished item running for `attempt`; False when that attempt lost the batch."""
        return self._move(batch_id, position, attempt, UNFINISHED, state="running", attempt=attempt)

    def finish(
        self,
        batch_id: str,
        position: int,
        attempt: int,
        *,
        error: tuple[str, str] | None = None,
        **values: Any,
    ) -> bool:
        """A running item ends done (with output_id, duration_s, seed, run_s, result) or failed with
        `error` = (code, message); False when `attempt` lost the batch."""
        if "result" in values and values["result"] is not None:
            values["result"] = sanitize_params(dict(values["result"]))
        if error is not None:
            code, message = error
            values.update(
                state="failed",
                error_code=fit_to_column(code, batch_items_table.c.error_code),
                error_message=clean_text(message),
            )
        else:
            values["state"] = "done"
        return self._move(batch_id, position, attempt, ("running",), finished_at=utc_now(), **values)

    def cancel_rest(self, batch_id: str, code: str, message: str, *, of_attempt: int | None = None) -> int:
        """Every item not yet finished ends cancelled with this reason (the batch was cancelled or
        stopped); returns how many. of_attempt: only while that attempt still holds the batch (not
        after another worker took it over)."""
        owner = (
            []
            if of_attempt is None
            else [exists().where(jobs_table.c.id == batch_id, jobs_table.c.attempt == of_attempt)]
        )
        with self.engine.begin() as conn:
            result = conn.execute(
                update(batch_items_table)
                .where(
                    batch_items_table.c.batch_id == batch_id,
                    batch_items_table.c.state.in_(UNFINISHED),
                    *owner,
                )
                .values(
                    state="cancelled",
                    error_code=fit_to_column(code, batch_items_table.c.error_code),
                    error_message=clean_text(message),
                    finished_at=utc_now(),
                )
            )
        return int(result.rowcount)

    def _move(
        self, batch_id: str, position: int, of_attempt: int, allowed: tuple[str, ...], **values: Any
    ) -> bool:
        current_attempt = exists().where(
            jobs_table.c.id == batch_id, jobs_table.c.attempt == of_attempt, jobs_table.c.state == "running"
        )
        with self.engine.begin() as conn:
            result = conn.execute(
                update(batch_items_table)
                .where(
                    batch_items_table.c.batch_id == batch_id,
                    batch_items_table.c.position == position,
                    batch_items_table.c.state.in_(allowed),
                    current_attempt,
                )
                .values(**values)
            )
        return result.rowcount == 1


def _item(row: Mapping[str, Any]) -> BatchItem:
    data = dict(row)
    data["finished_at"] = aware(data.get("finished_at"))
    return BatchItem(**data)
