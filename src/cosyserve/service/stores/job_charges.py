"""A job's share of its key's quota, kept on its row: what it set aside at submit (`reserved_s`) and what
it has been charged so far (`charged_s`), which the quota tracker and the job runner read and move
(`JobStore` has these methods)."""

from __future__ import annotations

from sqlalchemy import Engine, func, select, update

from cosyserve.service.stores.job_table import fit_to_column, is_job_id, jobs_table

ACTIVE_STATES: tuple[str, ...] = ("queued", "running")


class JobCharges:
    """The quota part of `JobStore`."""

    engine: Engine

    def charge(self, job_id: str, seconds: float) -> bool:
        """Count `seconds` of audio charged to the job's key (what it still holds of its reservation), while
        the job runs; False once it ended (a segment that outlived its job's timeout or cancel finished
        after the job gave its charges back: it is not charged)."""
        if not is_job_id(job_id):
            return False
        with self.engine.begin() as conn:
            counted = conn.execute(
                update(jobs_table)
                .where(jobs_table.c.id == job_id, jobs_table.c.state == "running")
                .values(charged_s=func.coalesce(jobs_table.c.charged_s, 0.0) + float(seconds))
            ).rowcount
        return counted == 1

    def take_charged(self, job_id: str, keep_s: float = 0.0) -> float:
        """The audio seconds charged to the job so far beyond `keep_s` (audio kept), taken off its count
        (that audio was discarded)."""
        if not is_job_id(job_id):
            return 0.0
        with self.engine.begin() as conn:
            where = jobs_table.c.id == job_id
            charged = float(conn.execute(select(jobs_table.c.charged_s).where(where)).scalar() or 0.0)
            discarded = max(0.0, charged - max(0.0, keep_s))
            conn.execute(update(jobs_table).where(where).values(charged_s=charged - discarded))
        return discarded

    def reserved_s(self, owner: str, *, excluding: str | None = None) -> float:
        """Audio seconds `owner`'s queued and running jobs set aside and have not been charged yet."""
        query = select(jobs_table.c.reserved_s, jobs_table.c.charged_s).where(
            jobs_table.c.owner == fit_to_column(owner, jobs_table.c.owner),
            jobs_table.c.state.in_(ACTIVE_STATES),
            jobs_table.c.reserved_s.is_not(None),
        )
        if excluding is not None:
            query = query.where(jobs_table.c.id != excluding)
        with self.engine.connect() as conn:
            rows = conn.execute(query).all()
        return sum(max(0.0, float(reserved) - float(charged or 0.0)) for reserved, charged in rows)
