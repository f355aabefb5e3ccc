"""The `[queue]` settings group: how many syntheses run at once, how many wait, how background work (jobs,
batches, dubs) shares the engine with interactive requests, and the cluster's timeouts."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator


class QueueSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)

    concurrency: int | None = Field(
        None, ge=1, description="syntheses run at once (default: 1 on CPU, 2 on GPU)"
    )
    queue_size: int = Field(16, ge=0, description="requests that may wait for a free slot before 429s")
    background_share: float = Field(
        0.1,
        ge=0.0,
        le=1.0,
        description="least share of the engine's time background work (jobs, batches, dubs) gets while "
        "interactive requests wait; interactive requests go first otherwise",
    )
    background_slots: int | None = Field(
        None,
        ge=1,
        description="of the concurrency slots, the most background work holds at once (default: all); "
        "fewer keeps slots free for interactive requests",
    )
    background_running: int = Field(
        4,
        ge=1,
        description="background jobs started at once; they take turns on the engine sentence by sentence "
        "(item by item), fairly between keys",
    )
    request_timeout_s: float = Field(300.0, gt=0, description="a synthesis running longer than this fails")
    queue_url: str | None = Field(
        None,
        description="redis://… broker shared by API nodes and workers (default: in-process queue)",
    )
    visibility_timeout_s: float = Field(
        600.0,
        ge=5,
        description="distributed: a job taken by a worker that vanished is handed to another after this",
    )
    job_lease_s: float = Field(
        30.0, ge=1, description="distributed: a worker silent this long loses its running job to another"
    )
    job_segment_timeout_s: float = Field(
        300.0,
        gt=0,
        description="a job's segment (a sentence of a long text, an item of a batch) running longer than "
        "this fails; a job's own limit grows with its length, apart from request_timeout_s",
    )
    job_max_attempts: int = Field(
        3, ge=1, description="a job interrupted by a restart this many times fails instead of running again"
    )

    @field_validator("queue_url")
    @classmethod
    def _check_queue_url(cls, value: str | None) -> str | None:
        if value and not value.startswith(("redis://", "rediss://")):
            raise ValueError("must start with redis:// or rediss:// (or be unset for the in-process queue)")
        return value or None
