"""Fair scheduling through the API: another key's batch does not hold up a /v1/tts; a cancel frees it."""

from __future__ import annotations

import time

import pytest

from conftest import PROMPT_TRANSCRIPT

TERMINAL = {"done", "failed", "cancelled"}


@pytest.fixture(scope="module")
def server(start_api_server, prompt_wav_bytes):
    live = start_api_server(
        api_keys_required=True, rate_limit_per_minute=0, queue_size=16, background_running=1
    )
    admin = live.service.keys.create("ops", "admin")[1]
    with live.client(headers={"Authorization": f"Bearer {admin}"}) as client:
        files = {"audio": ("prompt.wav", prompt_wav_bytes, "audio/wav")}
        fields = {"name": "alice", "transcript": PROMPT_TRANSCRIPT, "consent": "true", "shared": "true"}
        assert client.post("/v1/voices", data=fields, files=files).status_code == 201
    live.keys = {name: live.service.keys.create(name, "user")[1] for name in ("A", "B")}
    yield live
    live.stop()


def as_key(server, name: str):
    return server.client(headers={"Authorization": f"Bearer {server.keys[name]}"})


def tts_seconds(client) -> float:
    began = time.monotonic()
    response = client.post("/v1/tts", json={"text": "hi", "voice": "alice", "seed": 1})
    assert response.status_code == 200, response.text
    return time.monotonic() - began


def wait_for(client, path: str, until, timeout: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout
    while not until(body := client.get(path).json()):
        assert time.monotonic() < deadline, body
        time.sleep(0.05)
    return body


def test_a_tts_is_served_within_about_one_unit_of_another_keys_batch(server) -> None:
    with as_key(server, "A") as a, as_key(server, "B") as b:
        tts_seconds(b)  # warm
        alone = min(tts_seconds(b) for _ in range(2))
        items = [f"line {i}" for i in range(40)]
        batch = a.post("/v1/batches", json={"voice": "alice", "items": items})
        assert batch.status_code == 202, batch.text
        path = f"/v1/batches/{batch.json()['id']}"
        wait_for(a, path, lambda body: body["done"] >= 1)
        shared = tts_seconds(b)
        during = a.get(path).json()
        assert during["state"] == "running" and during["done"] < 40  # B did not wait for the batch
        unit = server.service.scheduler.stats()["unit_seconds"]["background"]["unit_s"]
        assert shared < 3 * alone + 2 * unit + 1.0, (shared, alone, unit)

        # a job from B waits (one background job at a time here) with a place and an estimate
        job = b.post("/v1/jobs", json={"text": "hi there", "voice": "alice"}).json()
        assert job["state"] == "queued" and job["position"] == 0 and job["estimated_wait_s"] > 0
        second = b.post("/v1/batches", json={"voice": "alice", "items": ["one", "two"]}).json()
        assert second["state"] == "queued" and second["position"] == 1
        assert second["estimated_wait_s"] > 0
        units = server.service.scheduler._slots.units  # what the runner told the scheduler
        scheduler = server.service.scheduler
        assert units[scheduler.get(job["id"])] == 1 and units[scheduler.get(second["id"])] == 2

        began = time.monotonic()
        assert a.delete(path).status_code == 202
        ended = wait_for(a, path, lambda body: body["state"] in TERMINAL)
        assert ended["state"] == "cancelled"
        assert time.monotonic() - began < max(5.0, 3 * unit)  # freed within about a unit
        final = wait_for(b, f"/v1/jobs/{job['id']}", lambda body: body["state"] in TERMINAL)
        assert final["state"] == "done"
        done = wait_for(b, f"/v1/batches/{second['id']}", lambda body: body["state"] in TERMINAL)
        assert done["state"] == "done" and done["position"] is None
