"""A batch's record and its items end together as a client sees them: the items first, so that whoever
reads the batch as ended never sees items still queued (found as a flaky cancel test: between the two
writes a poll saw `cancelled` with 2 done and 0 cancelled of 30). And an attempt that lost its batch to
another worker never ends the items the new attempt is running."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from cosyserve.errors import Cancelled
from cosyserve.service.access.principals import QuotaExceeded
from cosyserve.service.local.job_state import JobStateRecorder
from cosyserve.service.local.long_text_jobs import JobResult
from cosyserve.service.stores.batches import BatchStore
from cosyserve.service.stores.db import make_engine
from cosyserve.service.stores.jobs import JobStore

ITEMS = [{"name": str(n), "params": {"text": f"第{n}句。"}} for n in range(1, 5)]


@pytest.fixture
def stores(tmp_path: Path) -> tuple[JobStore, BatchStore]:
    engine = make_engine(f"sqlite:///{tmp_path / 'jobs.db'}")
    return JobStore(engine), BatchStore(engine)


def _running_batch(jobs: JobStore, batches: BatchStore) -> tuple[str, int]:
    batch = jobs.create({"voice": "alice"}, kind="batch")
    batches.add(batch.id, ITEMS)
    claimed = jobs.claim(batch.id, "w0", lease_s=30)
    assert claimed is not None
    assert batches.start(batch.id, 1, claimed.attempt)
    assert batches.finish(batch.id, 1, claimed.attempt, output_id="o1", duration_s=1.0, run_s=0.1)
    return batch.id, claimed.attempt


def _recorder(jobs: JobStore, batches: BatchStore, batch_id: str, attempt: int) -> JobStateRecorder:
    recorded = threading.Event()
    recorded.set()
    return JobStateRecorder(jobs, batches, None, batch_id, "batch", recorded, attempt=attempt)  # type: ignore[arg-type]


def _items_when_the_record_ends(jobs: JobStore, batches: BatchStore, batch_id: str, method: str) -> list:
    """Wrap the job store's `method` to note the items' states at the moment the record is written."""
    seen: list = []
    original = getattr(jobs, method)

    def noting(*args, **kwargs):
        seen.extend(item.state for item in batches.items(batch_id))
        return original(*args, **kwargs)

    setattr(jobs, method, noting)
    return seen


def test_a_cancelled_batch_ends_its_items_before_its_record(stores) -> None:
    jobs, batches = stores
    batch_id, attempt = _running_batch(jobs, batches)
    seen = _items_when_the_record_ends(jobs, batches, batch_id, "finish_with_exception")
    _recorder(jobs, batches, batch_id, attempt)(SimpleNamespace(error=Cancelled("cancelled")), "cancelled")
    assert seen == ["done", "cancelled", "cancelled", "cancelled"]
    assert jobs.get(batch_id).state == "cancelled"  # type: ignore[union-attr]


def test_a_batch_stopped_at_the_quota_ends_its_items_before_its_record(stores) -> None:
    jobs, batches = stores
    batch_id, attempt = _running_batch(jobs, batches)
    seen = _items_when_the_record_ends(jobs, batches, batch_id, "finish_done")
    stopped = JobResult(None, {"audio_s": 1.0}, QuotaExceeded("the daily audio quota is used up", 3600))
    _recorder(jobs, batches, batch_id, attempt)(SimpleNamespace(value=stopped), "done")
    assert seen == ["done", "cancelled", "cancelled", "cancelled"]
    codes = {item.error_code for item in batches.items(batch_id) if item.state == "cancelled"}
    assert codes == {"quota_exceeded"}


def test_an_attempt_that_lost_the_batch_leaves_its_items_alone(stores) -> None:
    jobs, batches = stores
    batch_id, attempt = _running_batch(jobs, batches)
    jobs.release(batch_id, attempt)  # as after a lapsed lease: another worker takes it over
    taken = jobs.claim(batch_id, "w1", lease_s=30)
    assert taken is not None and taken.attempt == attempt + 1
    _recorder(jobs, batches, batch_id, attempt)(SimpleNamespace(error=Cancelled("late")), "cancelled")
    assert [item.state for item in batches.items(batch_id)] == ["done", "queued", "queued", "queued"]
    assert jobs.get(batch_id).state == "running"  # type: ignore[union-attr]
