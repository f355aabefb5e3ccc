"""The `jobs` table: its columns, one row as a `JobRecord`, and how values are made storable.

Every database keeps what a job was asked and where it stands; values that a database would refuse (NUL
characters, lone surrogates, NaN, raw bytes) are cleaned before they are written, and text too long for
its column is cut with a hash of the whole, so different values stay different.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
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
    LargeBinary,
    String,
    Table,
    Text,
)

from cosyserve.service.requests import TERMINAL_STATES
from cosyserve.service.stores.db import add_missing_columns as add_table_columns
from cosyserve.service.stores.db import metadata

# Ids are uuid4().hex; anything that isn't a short ASCII token can't be in the id column: not looked up.
JOB_ID = re.compile(r"[A-Za-z0-9_-]{1,32}")
UNSTORABLE = re.compile("[\x00\ud800-\udfff]")  # NUL (PostgreSQL refuses it), lone surrogates (not UTF-8)

jobs_table = Table(
    "jobs",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("kind", String(16), nullable=False),
    Column("state", String(16), nullable=False),
    Column("progress", Float, nullable=False, default=0.0),
    Column("owner", String(128), nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=True),
    Column("finished_at", DateTime(timezone=True), nullable=True),
    Column("params", JSON, nullable=False),
    Column("error_code", String(64), nullable=True),
    Column("error_message", Text, nullable=True),
    Column("output_id", String(64), nullable=True),
    Column("output_path", Text, nullable=True),
    Column("duration_s", Float, nullable=True),
    Column("seed", BigInteger, nullable=True),
    Column("result_extra", JSON, nullable=True),  # timings, warnings, stage seconds, …
    Column("attempt", Integer, nullable=False, default=0),  # how many times a worker claimed it
    Column("worker", String(128), nullable=True),  # who holds (or last held) it
    Column("lease_until", DateTime(timezone=True), nullable=True),  # a running job's holder renews this
    Column("spec", JSON, nullable=True),  # how its result is delivered and charged (to run it again)
    Column("reserved_s", Float, nullable=True),  # audio seconds its key's quota set aside at submit
    Column("charged_s", Float, nullable=True),  # audio seconds charged so far (segment by segment)
    Index("ix_jobs_owner_created", "owner", "created_at"),
    Index("ix_jobs_state", "state"),
    Index("ix_jobs_created", "created_at", "id"),  # the admin's list of everyone's jobs, newest first
    Index("ix_jobs_output", "output_id"),  # a deleted output's jobs are found by it (output_refs)
)

# A job's uploaded prompt recording, kept apart from `jobs` (listing jobs never reads it) until it ends, so
# a job that a restart interrupts can run again.
job_inputs_table = Table(
    "job_inputs",
    metadata,
    Column("job_id", String(32), primary_key=True),
    Column("prompt_wav", LargeBinary, nullable=False),
)


@dataclass(frozen=True)
class JobRecord:
    """One row of `jobs`. Timestamps are timezone-aware UTC."""

    id: str
    kind: str
    state: str
    progress: float
    owner: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    params: dict[str, Any]
    error_code: str | None
    error_message: str | None
    output_id: str | None
    output_path: str | None
    duration_s: float | None
    seed: int | None
    result_extra: dict[str, Any] | None
    attempt: int = 0
    worker: str | None = None
    lease_until: datetime | None = None
    spec: dict[str, Any] | None = None
    reserved_s: float | None = None
    charged_s: float = 0.0

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    def to_dict(self) -> dict[str, Any]:
        """JSON-able, timestamps as ISO 8601."""
        out = asdict(self)
        for key in ("created_at", "started_at", "finished_at", "lease_until"):
            out[key] = out[key].isoformat() if out[key] is not None else None
        return out


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def aware(value: datetime | None) -> datetime | None:
    # SQLite hands back naive datetimes; they were stored as UTC.
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return value


def record_from_row(row: Mapping[str, Any]) -> JobRecord:
    data = dict(row)
    for key in ("created_at", "started_at", "finished_at", "lease_until"):
        data[key] = aware(data.get(key))
    data["attempt"] = data.get("attempt") or 0
    data["charged_s"] = data.get("charged_s") or 0.0
    return JobRecord(**data)


def sanitize_params(value: Any) -> Any:
    """Request parameters as JSON-able data every database stores: raw bytes (uploaded audio) become a size
    note, never content; NUL characters and lone surrogates become U+FFFD, NaN and infinity None (the
    databases refuse them)."""
    if isinstance(value, bytes | bytearray | memoryview):
        return f"<{len(value)} bytes>"
    if isinstance(value, Mapping):
        return {clean_text(str(key)): sanitize_params(item) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [sanitize_params(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, bool | int | float):
        return value
    return clean_text(str(value))


def is_job_id(value: object) -> bool:
    """Could `value` be a job's id? Lookups of anything else find nothing without asking the database."""
    return isinstance(value, str) and JOB_ID.fullmatch(value) is not None


def clean_text(text: str | None) -> str | None:
    return UNSTORABLE.sub("\ufffd", text) if text is not None else None


def fit_to_column(text: str | None, column: Column) -> str | None:
    """`text` cleaned (`clean_text`) and cut to the column's length; a cut value ends in a hash of the
    whole, so different long values (owners) stay different and the same one always becomes the same."""
    text = clean_text(text)
    size = column.type.length  # type: ignore[attr-defined]
    if text is None or len(text) <= size:
        return text
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
    return f"{text[: size - 17]}~{digest}"


def add_missing_columns(engine: Engine) -> None:
    """Databases made before the claim (and spec, quota) columns existed get them (nullable or with a
    default)."""
    add_table_columns(engine, jobs_table, {"attempt": "NOT NULL DEFAULT 0"})
