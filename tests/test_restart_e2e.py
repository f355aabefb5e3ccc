"""Jobs and batches survive `kill -9` of a real `cosyserve serve` process: on the next start queued jobs
run again, the one that was running is retried as its next attempt (its partial work discarded), and a
batch resumes at its first unfinished item; every job and every item ends with exactly one output."""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from conftest import PROMPT_TRANSCRIPT
from server_process import ServerProcess

pytestmark = pytest.mark.slow

TERMINAL = {"done", "failed", "cancelled"}
JOB_TEXT = "第一句话。第二句话。第三句话。"  # 15 characters: 3 pieces of at most 6
QUEUED_TEXT = "第一句话。"  # one piece: a queued job only has to run once


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


def serve(demo_model_path: Path, data_dir: Path) -> ServerProcess:
    return ServerProcess(demo_model_path, data_dir, "--max-text-chars", "6").start()


def until(predicate, timeout: float = 120.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)  # each poll is a request the busy server must answer between pieces


def kill_hard(server: ServerProcess) -> None:
    server.signal(signal.SIGKILL)
    server.process.wait(30)


def outputs_by(client: httpx.Client, key: str) -> Counter:
    """How many stored outputs carry each value of manifest parameter `key` (job_id, batch_id + item)."""
    found: Counter = Counter()
    for output in client.get("/v1/outputs", params={"limit": 1000}).json()["data"]:
        parameters = client.get(f"/v1/outputs/{output['id']}/manifest").json().get("parameters") or {}
        if key in parameters:
            found[(parameters[key], parameters.get("item"))] += 1
    return found


def test_kill_9_with_one_running_and_two_queued_jobs(demo_model_path, prompt_wav_bytes, data_dir) -> None:
    first = serve(demo_model_path, data_dir)
    with httpx.Client(base_url=first.url, timeout=60) as client:
        files = {"audio": ("p.wav", prompt_wav_bytes, "audio/wav")}
        assert client.post("/v1/voices", data={"name": "alice", "transcript": PROMPT_TRANSCRIPT}, files=files)
        texts = [JOB_TEXT, QUEUED_TEXT, QUEUED_TEXT]
        ids = [
            client.post("/v1/jobs", json={"text": text, "voice": "alice", "seed": n}).json()["id"]
            for n, text in enumerate(texts)
        ]

        def one_running_two_queued() -> bool:
            states = [client.get(f"/v1/jobs/{job_id}").json() for job_id in ids]
            return (
                states[0]["state"] == "running"
                and states[0]["progress"] > 0
                and all(s["state"] == "queued" for s in states[1:])
            )

        until(one_running_two_queued, what="the first job to be under way")
    kill_hard(first)

    second = serve(demo_model_path, data_dir)
    try:
        with httpx.Client(base_url=second.url, timeout=60) as client:
            until(
                lambda: all(client.get(f"/v1/jobs/{i}").json()["state"] in TERMINAL for i in ids),
                timeout=300,
                what="every job to end",
            )
            jobs = [client.get(f"/v1/jobs/{job_id}").json() for job_id in ids]
            assert [job["state"] for job in jobs] == ["done"] * 3, jobs
            outputs = outputs_by(client, "job_id")
            assert {job_id: outputs[(job_id, None)] for job_id in ids} == dict.fromkeys(ids, 1)
            for job in jobs:
                assert client.get(f"/v1/jobs/{job['id']}/result", follow_redirects=True).status_code == 200
    finally:
        second.stop()
    attempts = [record.attempt for record in _records(data_dir, ids)]
    assert attempts == [2, 1, 1]  # the running one was retried once; the queued ones ran once


ITEMS = 5  # killed at 2 done with 3 left; the 30-line batch is tested in test_api_batches


def test_kill_9_mid_batch_resumes_at_the_first_unfinished_item(
    demo_model_path, prompt_wav_bytes, data_dir
) -> None:
    first = serve(demo_model_path, data_dir)
    lines = "\n".join(f"第{n}句。" for n in range(1, ITEMS + 1)).encode()
    with httpx.Client(base_url=first.url, timeout=60) as client:
        files = {"audio": ("p.wav", prompt_wav_bytes, "audio/wav")}
        assert client.post("/v1/voices", data={"name": "alice", "transcript": PROMPT_TRANSCRIPT}, files=files)
        batch = client.post(
            "/v1/batches", data={"voice": "alice"}, files={"file": ("script.txt", lines, "text/plain")}
        ).json()
        until(lambda: client.get(f"/v1/batches/{batch['id']}").json()["done"] >= 2, what="2 items done")
    kill_hard(first)

    second = serve(demo_model_path, data_dir)
    try:
        with httpx.Client(base_url=second.url, timeout=60) as client:
            path = f"/v1/batches/{batch['id']}"
            until(lambda: client.get(path).json()["state"] in TERMINAL, timeout=300, what="the batch")
            final = client.get(path, params={"limit": 1000}).json()
            assert final["state"] == "done" and final["done"] == ITEMS, final
            outputs = outputs_by(client, "batch_id")
            assert {key: n for key, n in outputs.items() if key[0] == batch["id"]} == {
                (batch["id"], position): 1 for position in range(1, ITEMS + 1)
            }
            assert {item["output_id"] for item in final["items"]} == {
                o["id"] for o in client.get("/v1/outputs", params={"limit": 1000}).json()["data"]
            }
    finally:
        second.stop()
    assert _records(data_dir, [batch["id"]])[0].attempt == 2  # it was killed mid-way, not after its end


def _records(data_dir: Path, ids: list[str]):
    from cosyserve.service.stores.db import make_engine
    from cosyserve.service.stores.jobs import JobStore

    store = JobStore(make_engine(f"sqlite:///{data_dir / 'cosyserve.db'}"))
    try:
        return [store.get(job_id) for job_id in ids]
    finally:
        store.engine.dispose()
