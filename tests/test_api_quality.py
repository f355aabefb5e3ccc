"""The take scores where users see them, over HTTP with the demo model (its audio is noise, so its takes
fail): /v1/tts headers, a job's and a batch's status, manifest.csv and /metrics."""

from __future__ import annotations

import csv
import io
import time
import zipfile

import pytest

from conftest import PROMPT_TRANSCRIPT, enrol_voice

TEXT = "今天天气很好。"


@pytest.fixture(scope="module")
def server(start_api_server, prompt_wav_bytes):
    live = start_api_server(max_text_chars=40)
    with live.client() as client:
        enrol_voice(client, "alice", prompt_wav_bytes)
    yield live
    live.stop()


def _finished(client, path: str, timeout: float = 300.0) -> dict:
    deadline = time.monotonic() + timeout
    while (status := client.get(path).json())["state"] in ("queued", "running"):
        assert time.monotonic() < deadline, status
        time.sleep(0.2)
    return status


@pytest.fixture
def client(server):
    with server.client() as http:
        yield http


def test_tts_headers_say_how_the_kept_take_scored(client) -> None:
    response = client.post("/v1/tts", json={"text": TEXT, "voice": "alice", "seed": 4, "takes": 2})
    assert response.status_code == 200, response.text
    headers = response.headers
    assert headers["x-takes"] == "2" and headers["x-take-passed"] == "false"
    assert "noise" in headers["x-take-failed"].split(",")
    assert headers["x-cosyserve-seed"] in ("4", "5") and float(headers["x-take-similarity"]) <= 1.0
    manifest = client.get(f"/v1/outputs/{headers['x-cosyserve-output-id']}/manifest").json()
    assert manifest["quality"]["takes"] == 2 and manifest["takes"] == 2  # scores and the request's takes
    one = client.post("/v1/tts", json={"text": TEXT, "voice": "alice", "seed": 4})
    assert one.headers["x-takes"] == "1"  # the server's default: scored, not made again
    assert client.post("/v1/tts", json={"text": "hi", "voice": "alice", "takes": 9}).status_code == 422
    metrics = client.get("/metrics").text
    assert "cosyserve_takes_bucket" in metrics
    assert 'cosyserve_take_failed_checks_total{check="noise"}' in metrics


def test_job_and_batch_status_and_the_manifest(client) -> None:
    job = client.post("/v1/jobs", json={"text": "今天天气很好。明天也很好。", "voice": "alice", "seed": 1})
    done = _finished(client, f"/v1/jobs/{job.json()['id']}")
    assert done["state"] == "done" and done["quality"]["takes"] == 1 and done["quality"]["passed"] is False

    body = {"voice": "alice", "items": [{"text": "第一句话。", "seed": 1}]}
    batch = _finished(client, f"/v1/batches/{client.post('/v1/batches', json=body).json()['id']}")
    assert batch["state"] == "done" and batch["check_these"] == [1]
    assert "noise" in batch["items"][0]["quality"]["failed"]
    archive = client.get(batch["archive_url"])
    with zipfile.ZipFile(io.BytesIO(archive.content)) as zipped:
        rows = list(csv.DictReader(io.StringIO(zipped.read("manifest.csv").decode())))
    assert rows[0]["check"] == "listen" and rows[0]["take_passed"] == "no" and rows[0]["takes"] == "1"
    assert "noise" in rows[0]["take_failed"].split()


def test_a_requests_own_thresholds_over_json_multipart_and_jobs(client, prompt_wav_bytes) -> None:
    """`thresholds` judge this request's takes alone (the demo model's noise passes a flatness limit of 1);
    an unknown name or a value out of range is a 422 naming it."""
    lenient = {"max_flatness": 1.0}
    response = client.post("/v1/tts", json={"text": TEXT, "voice": "alice", "seed": 4, "thresholds": lenient})
    assert response.status_code == 200, response.text
    assert "noise" not in response.headers["x-take-failed"].split(",")
    manifest = client.get(f"/v1/outputs/{response.headers['x-cosyserve-output-id']}/manifest").json()
    assert manifest["thresholds"] == lenient
    form = {"text": TEXT, "prompt_text": PROMPT_TRANSCRIPT, "seed": "4", "thresholds": '{"max_flatness": 1}'}
    files = {"prompt_wav": ("p.wav", prompt_wav_bytes, "audio/wav")}
    multipart = client.post("/v1/tts", data=form, files=files)
    assert multipart.status_code == 200, multipart.text
    assert "noise" not in multipart.headers["x-take-failed"].split(",")
    for wrong, name in (({"min_similarity": 2}, "min_similarity"), ({"loudness": 1}, "loudness")):
        refused = client.post("/v1/tts", json={"text": TEXT, "voice": "alice", "thresholds": wrong})
        assert refused.status_code == 422 and name in refused.text, refused.text
    job = client.post("/v1/jobs", json={"text": TEXT, "voice": "alice", "seed": 1, "thresholds": lenient})
    done = _finished(client, f"/v1/jobs/{job.json()['id']}")
    assert done["state"] == "done" and "noise" not in done["quality"]["failed"]


def test_batch_and_dub_takes_and_thresholds(client) -> None:
    """A batch's `takes` and `thresholds` are every item's; an item's own win (JSON items); a dub's form
    takes them as fields (thresholds as JSON text)."""
    body = {
        "voice": "alice",
        "takes": 2,
        "thresholds": {"max_flatness": 1.0},
        "items": [{"text": "第一句话。", "seed": 1}, {"text": "第二句话。", "seed": 1, "takes": 1,
                                                      "thresholds": {"max_flatness": 0.01}}],
    }  # fmt: skip
    batch = _finished(client, f"/v1/batches/{client.post('/v1/batches', json=body).json()['id']}")
    first, second = batch["items"]
    assert "noise" not in first["quality"]["failed"] and second["quality"]["takes"] == 1
    assert "noise" in second["quality"]["failed"] and batch["params"]["thresholds"] == {"max_flatness": 1.0}
    refused = client.post("/v1/batches", json={**body, "thresholds": {"max_flatness": 2}})
    assert refused.status_code == 422 and "max_flatness" in refused.text
    srt = "1\n00:00:00,000 --> 00:00:03,000\n你好。\n".encode()
    form = {"voice": "alice", "seed": "1", "takes": "2", "thresholds": '{"max_flatness": 1}'}
    files = {"file": ("a.srt", srt, "application/x-subrip")}
    dub = client.post("/v1/dub", data=form, files=files)
    assert dub.status_code == 202, dub.text
    done = _finished(client, f"/v1/dub/{dub.json()['id']}")
    assert done["state"] == "done" and "noise" not in done["items"][0]["quality"]["failed"]
