"""Jobs over HTTP: long texts in pieces, progress, signed results, cancel, and no lost jobs at shutdown."""

from __future__ import annotations

import io
import time

import httpx
import pytest
import soundfile as sf
from tests.conftest import API_TEXT, LONG_TEXT, enrol_voice

TERMINAL = {"done", "failed", "cancelled"}


@pytest.fixture(scope="module")
def server(start_api_server, prompt_wav_bytes):
    live = start_api_server(max_text_chars=12)
    with live.client() as client:
        enrol_voice(client, "alice", prompt_wav_bytes)
    yield live
    live.stop()


@pytest.fixture
def client(server):
    with server.client() as http:
        yield http


def wait_job(client, job_id: str, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if job["state"] in TERMINAL:
            return job
        assert time.monotonic() < deadline, f"job {job_id} still {job['state']}"
        time.sleep(0.1)


def test_long_text_job_is_split_and_its_result_downloads_signed(client) -> None:
    text = "hi there. how are you? fine."  # 28 characters, limit 12: three pieces
    assert client.post("/v1/tts", json={"text": text, "voice": "alice"}).status_code == 400  # too long
    response = client.post("/v1/jobs", json={"text": text, "voice": "alice", "seed": 3, "format": "mp3"})
    assert response.status_code == 202, response.text
    job = response.json()
    assert response.headers["location"] == f"/v1/jobs/{job['id']}"
    assert job["state"] in ("queued", "running", "done") and job["params"]["text"] == text
    done = wait_job(client, job["id"])
    assert done["state"] == "done" and done["progress"] == 1.0 and done["seed"] == 3
    assert "format=mp3" in done["result_url"]
    audio = httpx.get(client.base_url.join(done["result_url"]))  # no API key: the URL is signed
    assert audio.status_code == 200 and audio.headers["content-type"] == "audio/mpeg"
    samples, rate = sf.read(io.BytesIO(audio.content))
    assert len(samples) / rate == pytest.approx(done["duration_s"], abs=0.1)
    manifest = client.get(f"/v1/outputs/{done['output_id']}/manifest").json()
    assert len(manifest["sentences"]) >= 3 and manifest["text"] == text
    redirect = client.get(f"/v1/jobs/{job['id']}/result", follow_redirects=False)
    assert redirect.status_code == 307 and redirect.headers["location"].startswith(
        f"/v1/outputs/{done['output_id']}?"
    )
    assert job["id"] in [j["id"] for j in client.get("/v1/jobs").json()["data"]]
    assert client.get("/v1/jobs", params={"state": "done"}).status_code == 200
    # its result deleted, the job no longer offers a link that answers 404
    assert client.delete(f"/v1/outputs/{done['output_id']}").status_code == 204
    gone = client.get(f"/v1/jobs/{job['id']}").json()
    assert gone["state"] == "done" and gone["result_deleted"] is True
    assert gone["result_url"] is None and gone["output_id"] is None
    refused = client.get(f"/v1/jobs/{job['id']}/result", follow_redirects=False)
    assert refused.status_code == 409 and "deleted" in refused.json()["error"]["message"], refused.text


def test_cancel_queued_and_running_jobs(client) -> None:
    long_job = {"text": LONG_TEXT * 3, "voice": "alice"}
    running = client.post("/v1/jobs", json=long_job).json()
    queued = client.post("/v1/jobs", json=long_job).json()
    assert queued["state"] == "queued" and queued["position"] == 0 and queued["estimated_wait_s"] > 0
    cancelled = client.delete(f"/v1/jobs/{queued['id']}")
    assert cancelled.status_code == 202 and cancelled.json()["state"] == "cancelled"
    assert client.delete(f"/v1/jobs/{running['id']}").status_code == 202
    final = wait_job(client, running["id"])
    assert final["state"] == "cancelled" and final["error"]["code"] == "cancelled"
    again = client.delete(f"/v1/jobs/{running['id']}")
    assert again.status_code == 409 and again.json()["error"]["code"] == "conflict"
    assert client.get(f"/v1/jobs/{running['id']}/result").status_code == 409


def test_a_cancel_as_a_job_finishes_keeps_its_result(server, client, monkeypatch) -> None:
    """The attempt leaves the scheduler a moment before its end is written: a cancel in that moment ended
    the record `cancelled` and the result was deleted (a dub's key stayed charged its whole track). The
    cancel waits for the write and answers that the job already ended."""
    import threading

    from cosyserve.service.local.job_state import JobStateRecorder

    writing, go = threading.Event(), threading.Event()
    done = JobStateRecorder._done

    def slow_done(self, result):
        writing.set()
        go.wait(30)
        return done(self, result)

    from cosyserve.service.local.job_runner import LocalJobs

    waiting, wait_for_end = threading.Event(), LocalJobs._after_its_end_is_written

    def waits(self, job_id):
        waiting.set()
        return wait_for_end(self, job_id)

    monkeypatch.setattr(JobStateRecorder, "_done", slow_done)
    monkeypatch.setattr(LocalJobs, "_after_its_end_is_written", waits)
    job = client.post("/v1/jobs", json={"text": API_TEXT, "voice": "alice"}).json()
    assert writing.wait(60)
    answers = []
    cancel = threading.Thread(target=lambda: answers.append(client.delete(f"/v1/jobs/{job['id']}")))
    cancel.start()
    assert waiting.wait(30)  # the cancel waits for the end being written
    go.set()
    cancel.join(30)
    final = wait_job(client, job["id"])
    assert final["state"] == "done" and final["output_id"], final
    assert answers[0].status_code == 409 and "already ended" in answers[0].json()["error"]["message"]
    assert client.get(f"/v1/outputs/{final['output_id']}").status_code == 200


def test_job_errors(client) -> None:
    assert client.get("/v1/jobs/nope").json()["error"]["code"] == "job_not_found"
    assert client.delete("/v1/jobs/nope").status_code == 404
    too_long = client.post("/v1/jobs", json={"text": "x" * (12 * 50 + 1), "voice": "alice"})
    assert too_long.status_code == 400 and "at most 600" in too_long.json()["error"]["message"]
    streaming = client.post("/v1/jobs", json={"text": "hi", "voice": "alice", "stream": True})
    assert streaming.status_code == 422
    unknown = client.post("/v1/jobs", json={"text": "hi", "voice": "nobody"})
    assert unknown.status_code == 404  # the voice is resolved when the job is accepted: the caller's error
    error = unknown.json()["error"]
    assert error["code"] == "voice_not_found" and "nobody" in error["message"]


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"text": "你好。"}, "exactly one of `voice`"),
        (
            {"text": "你好。", "voice": "alice", "prompt_wav": "aGVsbG8=", "prompt_text": "x"},
            "exactly one of",
        ),
        ({"text": "你好。", "prompt_wav": "aGVsbG8=", "prompt_text": "x"}, "could not be decoded"),
    ],
)
def test_a_job_is_refused_at_submit_for_what_tts_refuses(client, body, says) -> None:
    """Refused with the 400 `/v1/tts` gives, and nothing recorded; it used to be accepted, then fail."""
    before = len(client.get("/v1/jobs").json()["data"])
    for path in ("/v1/jobs", "/v1/tts"):
        answer = client.post(path, json=body)
        assert answer.status_code == 400 and says in answer.json()["error"]["message"], (path, answer.text)
    assert len(client.get("/v1/jobs").json()["data"]) == before


def test_shutdown_keeps_jobs_for_the_next_start(start_api_server, prompt_wav_bytes, tmp_path) -> None:
    """SIGTERM semantics: running work gets the grace period, then stops; no accepted job is lost: what
    did not finish stays queued (the running one as a later attempt) and the next start runs it."""
    live = start_api_server(data_dir=tmp_path, service_kwargs={"shutdown_grace_s": 0.5})
    with live.client() as client:
        enrol_voice(client, "alice", prompt_wav_bytes)
        texts = [LONG_TEXT, API_TEXT, API_TEXT]  # the first is running at the stop; the others wait
        ids = [client.post("/v1/jobs", json={"text": text, "voice": "alice"}).json()["id"] for text in texts]
    jobs = live.service.jobs
    deadline = time.monotonic() + 30
    while jobs.get(ids[0]).state != "running":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    live.stop()
    records = [jobs.get(job_id) for job_id in ids]
    assert [r.state for r in records[1:]] == ["queued", "queued"]  # never started: still waiting
    assert records[0].state in ("queued", "done") and live.service.scheduler.stats()["running"] == 0

    again = start_api_server(data_dir=tmp_path)
    with again.client() as client:
        finals = [wait_job(client, job_id) for job_id in ids]
    again.stop()
    assert [f["state"] for f in finals] == ["done"] * 3, finals
