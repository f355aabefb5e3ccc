"""A stream tells its caller whether its audio was saved: the SSE stream in its final event (`saved`,
`storage_error`); a raw audio stream, which has no end to say it in, by a warning header when the output
directory already could not take results as it began, and by its output listed under its request id."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from tests.conftest import API_TEXT, enrol_voice
from tests.test_api_storage_full import full_disk  # noqa: F401  (fixture: a real full tmpfs)

SSE = {"model": "tts-1", "input": API_TEXT, "voice": "alice", "stream_format": "sse"}


def _events(response) -> list[dict]:
    return [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")]


def _outputs_of(client, response) -> list[dict]:
    return client.get("/v1/outputs", params={"request_id": response.headers["x-request-id"]}).json()["data"]


@pytest.fixture(scope="module")
def client(start_api_server, prompt_wav_bytes):
    live = start_api_server()
    with live.client() as client:
        enrol_voice(client, "alice", prompt_wav_bytes)
        yield client
    live.stop()


def test_saved_streams_say_so(client) -> None:
    events = _events(client.post("/v1/audio/speech", json=SSE))
    done = events[-1]
    assert done["type"] == "speech.audio.done" and done["saved"] is True and done["output_id"]
    assert "storage_error" not in done
    raw = client.post("/v1/tts", json={"text": API_TEXT, "voice": "alice", "stream": True})
    assert raw.status_code == 200 and "x-cosyserve-storage-warning" not in raw.headers
    assert len(_outputs_of(client, raw)) == 1


def test_a_full_disk_is_told_to_streams(start_api_server, prompt_wav_bytes, full_disk: Path) -> None:  # noqa: F811
    live = start_api_server(output_dir=str(full_disk), min_free_mb=0, wait_ready=False)
    try:
        deadline = time.monotonic() + 60
        while live.service.model_state != "ready":  # /ready stays 503: the disk is full
            assert time.monotonic() < deadline, "the model did not load"
            time.sleep(0.05)
        with live.client() as client:
            enrol_voice(client, "alice", prompt_wav_bytes)
            sse = client.post("/v1/audio/speech", json=SSE)
            warning = sse.headers["x-cosyserve-storage-warning"]  # said to users without the folder's path
            assert sse.status_code == 200 and "can't be saved" in warning and str(full_disk) not in warning
            with live.client() as anyone:  # /ready too; an admin's detailed one names the path
                reason = anyone.get("/ready").json()["error"]["message"]
            assert "can't be saved" in reason and str(full_disk) not in reason
            assert "No space" in live.service.readiness(detailed=True)["storage"]
            events = _events(sse)
            assert any(event["type"] == "speech.audio.delta" for event in events)  # the audio still came
            done = events[-1]
            assert (
                done["type"] == "speech.audio.done" and done["saved"] is False and done["output_id"] is None
            )
            assert "No space left" in done["storage_error"]
            raw = client.post("/v1/tts", json={"text": API_TEXT, "voice": "alice", "stream": True})
            assert raw.status_code == 200 and len(raw.content) > 1000
            assert "can't be saved" in raw.headers["x-cosyserve-storage-warning"]
            assert _outputs_of(client, raw) == [] and client.get("/v1/outputs").json()["data"] == []
    finally:
        live.stop()
