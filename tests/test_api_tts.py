"""POST /v1/tts over real HTTP: JSON and multipart, every format, streaming, disconnects, stored outputs."""

from __future__ import annotations

import base64
import io
import time

import httpx
import pytest
import soundfile as sf
from tests.conftest import API_SEED, API_TEXT, LONG_TEXT, PROMPT_TRANSCRIPT, enrol_voice


@pytest.fixture(scope="module")
def server(start_api_server, prompt_wav_bytes):
    live = start_api_server()
    with live.client() as client:
        enrol_voice(client, "alice", prompt_wav_bytes)
    yield live
    live.stop()


@pytest.fixture
def client(server):
    with server.client() as http:
        yield http


def wait_for(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def test_json_saved_voice_returns_wav_with_headers_and_stored_output(client) -> None:
    response = client.post("/v1/tts", json={"text": API_TEXT, "voice": "alice", "seed": API_SEED})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "audio/wav"
    assert response.headers["x-cosyserve-seed"] == str(API_SEED)
    audio, rate = sf.read(io.BytesIO(response.content))
    assert rate == 24000 and len(audio) > 0
    assert float(response.headers["x-cosyserve-duration"]) == pytest.approx(len(audio) / rate, abs=1e-3)
    output_id = response.headers["x-cosyserve-output-id"]
    assert output_id.startswith("output_")
    manifest = client.get(f"/v1/outputs/{output_id}/manifest").json()
    assert manifest["seed"] == API_SEED and manifest["voice"] == "alice" and manifest["text"] == API_TEXT
    assert manifest["parameters"]["request_id"] == response.headers["x-request-id"]
    assert manifest["file"] == f"{output_id}.wav"


def test_same_seed_same_audio(client) -> None:
    body = {"text": API_TEXT, "voice": "alice", "seed": API_SEED, "format": "pcm"}
    first, second = client.post("/v1/tts", json=body), client.post("/v1/tts", json=body)
    assert first.status_code == second.status_code == 200
    assert first.headers["content-type"] == "audio/pcm"
    assert first.content == second.content and len(first.content) % 2 == 0


def test_multipart_upload_with_transcript_as_mp3_at_16k(client, prompt_wav_bytes) -> None:
    data = {
        "text": API_TEXT,
        "prompt_text": PROMPT_TRANSCRIPT,
        "seed": "3",
        "format": "mp3",
        "sample_rate": "16000",
    }
    files = {"prompt_wav": ("me.wav", prompt_wav_bytes, "audio/wav")}
    response = client.post("/v1/tts", data=data, files=files)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "audio/mpeg"
    audio, rate = sf.read(io.BytesIO(response.content))
    assert rate == 16000 and len(audio) > 0


def test_json_base64_prompt_as_flac(client, prompt_wav_bytes) -> None:
    encoded = "data:audio/wav;base64," + base64.b64encode(prompt_wav_bytes).decode()
    body = {
        "text": API_TEXT,
        "prompt_wav": encoded,
        "prompt_text": PROMPT_TRANSCRIPT,
        "seed": 5,
        "format": "flac",
    }
    response = client.post("/v1/tts", json=body)
    assert response.status_code == 200, response.text
    audio, rate = sf.read(io.BytesIO(response.content))
    assert rate == 24000 and len(audio) > 0
    assert response.headers["x-cosyserve-seed"] == "5"


def test_stream_starts_before_synthesis_ends_and_is_stored(client) -> None:
    body = {"text": "今天天气很好，我们一起去公园散步吧。", "voice": "alice", "seed": 1, "stream": True}
    started = time.monotonic()
    pieces, arrivals = [], []
    with client.stream("POST", "/v1/tts", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "audio/wav"
        assert "content-length" not in response.headers  # chunked
        assert response.headers["x-cosyserve-seed"] == "1"
        request_id = response.headers["x-request-id"]
        for piece in response.iter_raw():
            pieces.append(piece)
            arrivals.append(time.monotonic() - started)
    data = b"".join(pieces)
    assert data[:4] == b"RIFF" and len(data) > 44
    audio, rate = sf.read(io.BytesIO(data))
    assert rate == 24000 and len(audio) > 0
    assert arrivals[0] < arrivals[-1]  # the header went out while the audio was still being made
    listed = client.get("/v1/outputs", params={"request_id": request_id}).json()["data"]
    assert len(listed) == 1 and listed[0]["seed"] == 1
    # by the id the client sent too (it leads the request's own): found without the answer's headers
    traced = client.post("/v1/tts", json={**body, "stream": False}, headers={"X-Request-Id": "my-trace-7"})
    found = client.get("/v1/outputs", params={"request_id": "my-trace-7"}).json()["data"]
    assert [o["id"] for o in found] == [traced.headers["x-cosyserve-output-id"]]


def test_stream_mp3_and_errors_before_start_are_envelopes(client) -> None:
    body = {"text": API_TEXT, "voice": "alice", "seed": API_SEED, "stream": True, "format": "mp3"}
    with client.stream("POST", "/v1/tts", json=body) as response:
        assert response.status_code == 200 and response.headers["content-type"] == "audio/mpeg"
        data = response.read()
    assert len(sf.read(io.BytesIO(data))[0]) > 0
    bad = client.post("/v1/tts", json={**body, "voice": "nobody"})
    assert bad.status_code == 404 and bad.json()["error"]["code"] == "voice_not_found"


def test_stream_disconnect_cancels_the_work(server) -> None:
    stats = server.service.scheduler.stats
    before = stats()["finished"]["cancelled"]
    with server.client() as http:
        body = {"text": LONG_TEXT, "voice": "alice", "seed": 1, "stream": True, "format": "pcm"}
        with http.stream("POST", "/v1/tts", json=body) as response:
            assert response.status_code == 200
            next(response.iter_raw())  # started; now hang up
    wait_for(lambda: stats()["finished"]["cancelled"] > before)
    wait_for(lambda: stats()["running"] == 0)


def test_disconnect_while_waiting_cancels_the_work(server, monkeypatch) -> None:
    stats = server.service.scheduler.stats
    before = stats()["finished"]["cancelled"]
    with server.service.model.synthesizer() as synth:
        engine = synth.engine
    generate = engine.generate

    def generate_after_cancel(*args, cancel, **kwargs):
        """Hold the work until it is cancelled (at most 30 s): it can't finish before the client leaves."""
        deadline = time.monotonic() + 30.0
        while not cancel() and time.monotonic() < deadline:
            time.sleep(0.02)
        yield from generate(*args, cancel=cancel, **kwargs)

    monkeypatch.setattr(engine, "generate", generate_after_cancel)
    with server.client(timeout=1.0) as http, pytest.raises(httpx.ReadTimeout):
        http.post("/v1/tts", json={"text": LONG_TEXT, "voice": "alice"})
    wait_for(lambda: stats()["finished"]["cancelled"] > before)
    wait_for(lambda: stats()["running"] == 0)


def _first_chunk_figures(client) -> tuple[float, float]:
    """(count, sum) of the first-chunk latency histogram, from GET /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    values = {}
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            values[sample.name] = sample.value
    prefix = "cosyserve_first_chunk_latency_seconds"
    return values[f"{prefix}_count"], values[f"{prefix}_sum"]


def test_first_chunk_latency_is_taken_at_the_first_audio(server, monkeypatch) -> None:
    """The figure counts until audio exists, not until the stream's headers could be sent."""
    with server.service.model.synthesizer() as synth:
        engine = synth.engine
    generate = engine.generate

    def slow_generate(*args, **kwargs):
        time.sleep(0.5)  # the LM "thinks" before the first audio
        yield from generate(*args, **kwargs)

    monkeypatch.setattr(engine, "generate", slow_generate)
    with server.client() as http:
        count, total = _first_chunk_figures(http)
        body = {"text": API_TEXT, "voice": "alice", "seed": API_SEED, "stream": True, "format": "pcm"}
        assert http.post("/v1/tts", json=body).status_code == 200
        new_count, new_total = _first_chunk_figures(http)
    assert new_count == count + 1
    assert new_total - total >= 0.5


def test_outputs_list_download_transcode_subtitles_delete(client) -> None:
    response = client.post("/v1/tts", json={"text": API_TEXT, "voice": "alice", "seed": API_SEED})
    output_id = response.headers["x-cosyserve-output-id"]
    listed = client.get("/v1/outputs").json()["data"]
    entry = next(item for item in listed if item["id"] == output_id)
    assert entry["seed"] == API_SEED and "sig=" in entry["url"]
    signed = httpx.get(client.base_url.join(entry["url"]))  # no credentials needed
    assert signed.status_code == 200 and signed.content == response.content
    mp3 = client.get(f"/v1/outputs/{output_id}", params={"format": "mp3", "sample_rate": 22050})
    assert mp3.headers["content-type"] == "audio/mpeg" and sf.read(io.BytesIO(mp3.content))[1] == 22050
    srt = client.get(f"/v1/outputs/{output_id}/subtitles").text
    assert srt.startswith("1\n00:00:00,000 --> ")
    assert client.get(f"/v1/outputs/{output_id}/subtitles", params={"format": "vtt"}).text.startswith(
        "WEBVTT"
    )
    assert client.delete(f"/v1/outputs/{output_id}").status_code == 204
    gone = client.get(f"/v1/outputs/{output_id}")
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "output_not_found"
    assert client.get("/v1/outputs/..%2Fetc").status_code in (400, 404)
    assert client.get("/v1/outputs/not_an_id").json()["error"]["code"] == "invalid_input"


def test_subtitles_show_the_typed_text(client) -> None:
    """Issue 29: `第2课` is read 第二课, and the subtitles show it as typed."""
    response = client.post("/v1/tts", json={"text": "第2课：你好", "voice": "alice", "seed": API_SEED})
    assert response.status_code == 200, response.text
    output_id = response.headers["x-cosyserve-output-id"]
    srt = client.get(f"/v1/outputs/{output_id}/subtitles").text
    assert srt.splitlines()[2] == "第2课：你好", srt
    vtt = client.get(f"/v1/outputs/{output_id}/subtitles", params={"format": "vtt"}).text
    assert "第2课：你好" in vtt and "第二课" not in vtt


def test_bad_signature_is_refused(client) -> None:
    response = client.post("/v1/tts", json={"text": API_TEXT, "voice": "alice", "seed": API_SEED})
    output_id = response.headers["x-cosyserve-output-id"]
    url = f"/v1/outputs/{output_id}"
    for query in ({"exp": "9999999999", "sig": "forged"}, {"exp": "1", "sig": "x"}, {"exp": "soon"}):
        refused = httpx.get(client.base_url.join(url), params=query)
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
