"""A cluster's cancel charges nothing that is thrown away (found by a team's run on Redis + PostgreSQL).

An API node of a cluster ends a cancelled job's record at once (`RemoteBackend.cancel_job`), while the
worker running it goes on until it notices: a long text then keeps no result, and a batch item finished
after the cancel is not kept. Before, both were charged: a cancelled job's key paid for all its audio, a
batch cancelled after 2 items paid for 3. Here the cancel is made as that API node makes it, between two
segments (items) of work that runs on this server's own engine, as a worker's would."""

from __future__ import annotations

import time

import pytest

from test_work_footing import TEXT, as_key, pause, server  # noqa: F401  (fixtures)


def cancel_as_an_api_node_does(service, job_id: str, batch: bool) -> None:
    """`RemoteBackend.cancel_job`: the items, then the record, then its charge and its reservation (a
    worker that died keeps nothing of it); a live worker goes on until it notices."""
    if batch:
        service.batches.cancel_rest(job_id, "cancelled", "cancelled by the client")
    service.jobs.finish_cancelled(job_id, "cancelled by the client")
    service.backend.reservations.ended_unkept(service.jobs, job_id)  # what it was charged goes back now


def settled(service, key_id: int, job_id: str, expected: float, timeout: float = 120.0) -> float:
    """The key's usage once the work behind the cancelled record has ended and it reads `expected` (or the
    time is up: what it reads then)."""
    deadline = time.monotonic() + timeout
    while service.scheduler.get(job_id) is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert service.scheduler.get(job_id) is None, "the cancelled work did not end"
    grace = time.monotonic() + 5.0  # its ticket's end is recorded just after the ticket leaves
    while (used := service.access.quota.used(key_id)) != pytest.approx(expected, abs=0.01):
        if time.monotonic() > grace:
            break
        time.sleep(0.05)
    return used


def test_a_long_text_cancelled_by_an_api_node_is_not_charged_for_the_audio_it_throws_away(
    server,  # noqa: F811  (the fixtures imported above)
    pause,  # noqa: F811
) -> None:
    key, secret = server.service.keys.create("cluster-cancel-job", "user")
    paused, go = pause(key.id, 2)  # its start, then its first segment (charged)
    with as_key(server, secret) as user:
        job = user.post("/v1/jobs", json={"text": TEXT, "voice": "alice", "seed": 3}).json()
        assert paused.wait(60)
        cancel_as_an_api_node_does(server.service, job["id"], batch=False)
        go.set()
        assert settled(server.service, key.id, job["id"], 0.0) == 0.0
        final = user.get(f"/v1/jobs/{job['id']}").json()
        assert final["state"] == "cancelled" and final["result_url"] is None
        assert user.get("/v1/outputs").json()["data"] == []  # the worker's audio is gone too
    assert server.service.jobs.get(job["id"]).charged_s == 0.0


def test_a_batch_item_finished_after_an_api_nodes_cancel_is_neither_kept_nor_charged(
    server,  # noqa: F811  (the fixtures imported above)
    pause,  # noqa: F811
) -> None:
    key, secret = server.service.keys.create("cluster-cancel-batch", "user")
    paused, go = pause(key.id, 4)  # item 1: before it, once made; item 2: before it, once made (not kept)
    lines = "\n".join(f"第{n}句话。" for n in range(1, 6))
    with as_key(server, secret) as user:
        response = user.post(
            "/v1/batches",
            content=lines.encode(),
            params={"voice": "alice"},
            headers={"content-type": "text/plain"},
        )
        assert response.status_code == 202, response.text
        batch_id = response.json()["id"]
        assert paused.wait(60)
        cancel_as_an_api_node_does(server.service, batch_id, batch=True)
        go.set()
        first = server.service.batches.items(batch_id)[0]
        used = settled(server.service, key.id, batch_id, first.duration_s or 0.0)
        batch = user.get(f"/v1/batches/{batch_id}").json()
    states = [item["state"] for item in batch["items"]]
    assert states == ["done", "cancelled", "cancelled", "cancelled", "cancelled"], states
    assert used == pytest.approx(batch["items"][0]["duration_s"], abs=0.01)  # item 1 alone
