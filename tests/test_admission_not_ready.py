"""Jobs, batches and dubs are admitted by the same rule as /v1/tts: while the model is loading, failed to
load or is stopped, each answers 503 `model_not_ready` with Retry-After and records nothing. The rule is one
(`ModelHost.require_ready`): a job accepted while the model loads could only wait on a load that may fail,
so loading refuses too, durable queue or not; during an admin restart everything is accepted and waits for
the new model."""

from __future__ import annotations

import threading

import pytest
from tests.conftest import sharing
from tests.test_api_admin import wait_for

SRT = "1\n00:00:00,000 --> 00:00:01,500\nhi there.\n"
SUBMISSIONS = (
    ("/v1/tts", {"text": "hi", "voice": "alice"}),
    ("/v1/jobs", {"text": "hi", "voice": "alice"}),
    ("/v1/batches", {"voice": "alice", "items": ["hi.", "there."]}),
    ("/v1/dub", {"voice": "alice", "subtitles": SRT}),
)


def _assert_refused(client, *, because: str) -> None:
    for path, body in SUBMISSIONS:
        response = client.post(path, json=body)
        assert response.status_code == 503, (path, response.text)
        error = response.json()["error"]
        assert error["code"] == "model_not_ready" and because in error["message"], (path, error)
        assert int(response.headers["retry-after"]) >= 1, path
    files = {"prompt_wav": ("me.wav", b"RIFF0000WAVE", "audio/wav")}
    multipart = client.post("/v1/jobs", data={"text": "hi"}, files=files)
    assert multipart.status_code == 503 and multipart.json()["error"]["code"] == "model_not_ready"
    assert client.get("/v1/jobs").json()["data"] == []  # nothing was recorded
    assert client.get("/v1/batches").json()["data"] == []


@pytest.fixture
def gated(start_api_server, api_synthesizer):
    gate = threading.Event()

    def factory(settings, voices):
        gate.wait(60)
        return sharing(api_synthesizer)(settings, voices)

    live = start_api_server(factory=factory, wait_ready=False)
    live.gate = gate
    yield live
    gate.set()
    live.stop()


def test_refused_while_the_model_loads(gated) -> None:
    with gated.client() as client:
        assert client.get("/ready").status_code == 503
        _assert_refused(client, because="loading")
        gated.gate.set()
        wait_for(lambda: client.get("/ready").status_code == 200)
        accepted = client.post("/v1/jobs", json={"text": "hi", "voice": "nobody"})
        assert accepted.status_code == 404  # the same request, once ready: now its voice is looked up


def test_refused_after_a_failed_load(start_api_server) -> None:
    def broken(settings, voices):
        raise RuntimeError("no weights here")

    live = start_api_server(factory=broken, wait_ready=False)
    try:
        with live.client() as client:
            wait_for(lambda: live.service.model_state == "failed")
            assert client.get("/ready").status_code == 503
            _assert_refused(client, because="no weights here")
    finally:
        live.stop()
