"""A bounded load test: 50 requests, 8 at a time, against concurrency 2 and a queue of 4.

Accepted work all finishes, the rest gets 429 with Retry-After, nothing hangs, and memory and threads
return to their baseline afterwards.
"""

from __future__ import annotations

import gc
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from tests.conftest import API_SEED, API_TEXT, enrol_voice

from cosyserve.service.metrics import process_rss_bytes

REQUESTS, PARALLEL = 50, 8
RSS_TOLERANCE = 200 * 2**20
TERMINAL = {"done", "failed", "cancelled"}
POOLED_THREAD, POOL_LIMIT = "AnyIO worker thread", 40  # anyio's default thread limiter


@pytest.fixture(scope="module")
def server(start_api_server, prompt_wav_bytes):
    live = start_api_server(concurrency=2, queue_size=4)
    with live.client() as client:
        enrol_voice(client, "alice", prompt_wav_bytes)
    yield live
    live.stop()


def own_threads() -> list[str]:
    """Every thread but the HTTP server's pooled request threads (reused, never one per request)."""
    return sorted(t.name for t in threading.enumerate() if t.name != POOLED_THREAD)


def settle(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        gc.collect()
        time.sleep(0.2)
    return True


def test_load_accepts_what_fits_refuses_the_rest_and_leaves_nothing_behind(server) -> None:
    body = {"text": API_TEXT, "voice": "alice", "seed": API_SEED}
    speech = {"input": API_TEXT, "voice": "alice", "seed": API_SEED, "response_format": "wav"}
    with server.client() as client:  # warm up: first-call allocations are not a leak
        assert client.post("/v1/tts", json=body).status_code == 200
        assert client.post("/v1/audio/speech", json=speech).status_code == 200
        warm_job = client.post("/v1/jobs", json=body).json()["id"]
        store = server.service.jobs
        assert settle(lambda: store.get(warm_job).state in TERMINAL, 60)
    gc.collect()
    rss_before, threads_before = process_rss_bytes(), own_threads()
    finished_before = sum(server.service.scheduler.stats()["finished"].values())

    def one(index: int) -> tuple[str, int, dict, dict | None]:
        path = ("/v1/tts", "/v1/jobs", "/v1/audio/speech")[index % 3]
        with server.client(timeout=120) as client:
            response = client.post(path, json=speech if path == "/v1/audio/speech" else body)
            data = response.json() if response.headers["content-type"] == "application/json" else None
            return path, response.status_code, dict(response.headers), data

    started = time.monotonic()
    with ThreadPoolExecutor(PARALLEL) as pool:
        results = list(pool.map(one, range(REQUESTS)))
    assert time.monotonic() - started < 120  # nothing hung

    statuses = [status for _, status, _, _ in results]
    assert set(statuses) <= {200, 202, 429}, statuses
    accepted = [r for r in results if r[1] in (200, 202)]
    refused = [r for r in results if r[1] == 429]
    assert len(accepted) >= 6 and refused, statuses  # 2 running + 4 queued fit at once
    for _, _, headers, data in refused:
        assert int(headers["retry-after"]) >= 1 and data["error"]["code"] == "queue_full"

    # Every accepted job ends (done), and the scheduler is empty again.
    jobs = [data["id"] for path, status, _, data in accepted if path == "/v1/jobs"]
    assert settle(lambda: all(store.get(job_id).state in TERMINAL for job_id in jobs), 120)
    assert {store.get(job_id).state for job_id in jobs} <= {"done"}
    stats = server.service.scheduler.stats()
    assert stats["queued"] == 0 and stats["running"] == 0
    assert sum(stats["finished"].values()) - finished_before == len(accepted)

    metrics = server.service.metrics
    assert metrics.queue_depth._value.get() == 0 and metrics.in_flight._value.get() == 0
    assert settle(lambda: own_threads() == threads_before, 30), (threads_before, own_threads())
    assert len(threading.enumerate()) - len(threads_before) <= POOL_LIMIT  # the request pool is bounded
    assert settle(lambda: process_rss_bytes() <= rss_before + RSS_TOLERANCE, 30), (
        process_rss_bytes() - rss_before
    )
    with server.client() as client:
        assert client.get("/ready").status_code == 200
