"""The narrow window of a crash: an attempt saved its output but died before recording it. The next start
adopts that output (a job's result, a batch item's file) instead of making it a second time."""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa

from conftest import enrol_voice
from cosyserve.service.stores.batches import batch_items_table
from cosyserve.service.stores.job_table import jobs_table

TERMINAL = {"done", "failed", "cancelled"}


def wait(client, path: str, timeout: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout
    while (body := client.get(path).json())["state"] not in TERMINAL:
        assert time.monotonic() < deadline, body
        time.sleep(0.1)
    return body


def crash_after_save(service, job_id: str, position: int | None = None) -> None:
    """Put the rows back as they were when the process died: running as attempt 1, output not recorded."""
    with service.db.begin() as conn:
        conn.execute(
            sa.update(jobs_table)
            .where(jobs_table.c.id == job_id)
            .values(state="running", output_id=None, output_path=None, finished_at=None, attempt=1)
        )
        if position is not None:
            item = (batch_items_table.c.batch_id == job_id) & (batch_items_table.c.position == position)
            made_s = conn.execute(sa.select(batch_items_table.c.duration_s).where(item)).scalar_one()
            conn.execute(
                sa.update(batch_items_table).where(item).values(state="running", output_id=None, attempt=1)
            )
            conn.execute(  # nor charged: an item is charged once it is recorded
                sa.update(jobs_table)
                .where(jobs_table.c.id == job_id)
                .values(charged_s=jobs_table.c.charged_s - made_s)
            )


def test_outputs_saved_before_a_crash_are_adopted(start_api_server, prompt_wav_bytes, tmp_path) -> None:
    first = start_api_server(data_dir=tmp_path)
    with first.client() as client:
        enrol_voice(client, "alice", prompt_wav_bytes)
        job_id = client.post("/v1/jobs", json={"text": "第一句。", "voice": "alice"}).json()["id"]
        job = wait(client, f"/v1/jobs/{job_id}")
        items = {"voice": "alice", "items": ["一。", "二。", "三。"]}
        batch_id = client.post("/v1/batches", json=items).json()["id"]
        batch = wait(client, f"/v1/batches/{batch_id}")
        outputs_before = {o["id"] for o in client.get("/v1/outputs").json()["data"]}
    first.stop()
    crash_after_save(first.service, job["id"])
    crash_after_save(first.service, batch_id, position=2)

    again = start_api_server(data_dir=tmp_path)
    with again.client() as client:
        job_after = wait(client, f"/v1/jobs/{job['id']}")
        batch_after = wait(client, f"/v1/batches/{batch_id}")
        outputs_after = {o["id"] for o in client.get("/v1/outputs").json()["data"]}
    again.stop()
    assert job_after["state"] == "done" and job_after["output_id"] == job["output_id"]
    assert job["quality"] and job_after["quality"] == job["quality"]  # the take scores were kept too
    assert batch_after["state"] == "done"
    assert [i["quality"] for i in batch_after["items"]] == [i["quality"] for i in batch["items"]]
    assert [i["output_id"] for i in batch_after["items"]] == [i["output_id"] for i in batch["items"]]
    assert outputs_after == outputs_before  # nothing was made a second time
    assert batch_after["charged_s"] == pytest.approx(batch["charged_s"])  # the adopted item is charged
