"""Labels through the real API: responses, streams, stored outputs and downloads carry the implicit label
(intact through `POST /v1/verify` and `cosyserve verify`), start with the audible cue when it is on, and
their subtitles account for it; only admins may skip the cue."""

from __future__ import annotations

import io
import time

import numpy as np
import pytest
import soundfile as sf
from tests.conftest import API_SEED, API_TEXT, enrol_voice
from tests.test_labels_cue import cue_correlation

from cosyserve.cli import main as cli_main
from cosyserve.service.labels import cue
from cosyserve.service.labels.containers import TAGGERS
from cosyserve.service.labels.verify import verify

SECRET = "test-signing-secret-0123456789abcdef"  # what start_api_server configures
PROVIDER = "Example Voice Co."


@pytest.fixture(scope="module")
def server(start_api_server, prompt_wav_bytes):
    live = start_api_server(label_explicit="start", label_provider=PROVIDER, c2pa=False)
    with live.client() as client:
        enrol_voice(client, "alice", prompt_wav_bytes)
    yield live
    live.stop()


@pytest.fixture
def client(server):
    with server.client() as http:
        yield http


def decoded(data: bytes) -> np.ndarray:
    return sf.read(io.BytesIO(data), dtype="float32")[0]


def check(client, data: bytes, name: str = "out") -> dict:
    """The API's verdict on `data`, which must equal the library's."""
    response = client.post("/v1/verify", files={"file": (name, data, "application/octet-stream")})
    assert response.status_code == 200, response.text
    report = response.json()
    assert report["status"] == verify(data, SECRET.encode()).status
    return report


@pytest.mark.parametrize("fmt", ["wav", "mp3", "flac", "opus"])
def test_responses_carry_an_intact_label_and_start_with_the_cue(client, fmt: str) -> None:
    body = {"text": API_TEXT, "voice": "alice", "seed": API_SEED, "format": fmt}
    response = client.post("/v1/tts", json=body)
    assert response.status_code == 200, response.text
    output_id = response.headers["x-cosyserve-output-id"]
    report = check(client, response.content, f"a.{fmt}")
    assert report["status"] == "intact" and report["signature"] == "valid", report
    assert report["label"]["ProduceID"] == output_id and report["label"]["ContentProducer"] == PROVIDER
    assert cue_correlation(decoded(response.content)) > 0.9
    stored = client.get(f"/v1/outputs/{output_id}")  # the stored wav, and a transcoded download
    assert check(client, stored.content)["label"]["ProduceID"] == output_id
    assert cue_correlation(decoded(stored.content)) > 0.9
    download = client.get(f"/v1/outputs/{output_id}", params={"format": "flac"})
    assert check(client, download.content)["status"] == "intact"


@pytest.mark.parametrize("fmt", ["wav", "mp3", "opus"])
def test_streams_start_with_the_cue_and_carry_a_stream_label(client, fmt: str) -> None:
    body = {"text": API_TEXT, "voice": "alice", "seed": API_SEED, "format": fmt, "stream": True}
    with client.stream("POST", "/v1/tts", json=body) as response:
        assert response.status_code == 200
        data = response.read()
    report = check(client, data)
    assert report["status"] == "unbound" and report["signature"] == "valid"
    assert report["label"]["ProduceID"] == response.headers["x-request-id"]
    assert cue_correlation(decoded(data)) > 0.9


def test_subtitles_and_duration_account_for_the_cue(client) -> None:
    response = client.post("/v1/tts", json={"text": API_TEXT, "voice": "alice", "seed": API_SEED})
    output_id = response.headers["x-cosyserve-output-id"]
    manifest = client.get(f"/v1/outputs/{output_id}/manifest").json()
    shift = cue.cue_seconds(24000)
    assert manifest["sentences"][0]["start_s"] == pytest.approx(shift, abs=1e-3)
    assert manifest["labels"] == {"implicit": True, "explicit": "start (cue)", "c2pa": "off (c2pa = false)"}
    vtt = client.get(f"/v1/outputs/{output_id}/subtitles", params={"format": "vtt"}).text
    assert f"00:00:00.{round(shift * 1000):03d} -->" in vtt
    audio = decoded(response.content)
    assert float(response.headers["x-cosyserve-duration"]) == pytest.approx(len(audio) / 24000, abs=1e-3)


def test_altered_and_stripped_files_are_reported(client) -> None:
    data = client.post("/v1/tts", json={"text": API_TEXT, "voice": "alice", "format": "wav"}).content
    payload = TAGGERS["wav"].payload(data)
    at = data.rindex(payload) + len(payload) // 2
    altered = data[:at] + bytes([data[at] ^ 0x40]) + data[at + 1 :]
    assert check(client, altered)["status"] == "altered"
    assert check(client, TAGGERS["wav"].strip(data))["status"] == "unlabelled"


def test_admin_may_skip_the_cue(client) -> None:
    body = {"text": API_TEXT, "voice": "alice", "seed": API_SEED, "explicit_label": False}
    response = client.post("/v1/tts", json=body)  # auth off: the caller is an admin
    assert response.status_code == 200
    assert cue_correlation(decoded(response.content)) < 0.5
    assert check(client, response.content)["status"] == "intact"  # the implicit label stays


def test_cli_verify_exit_status(client, tmp_path, monkeypatch, capsys) -> None:
    data = client.post("/v1/tts", json={"text": API_TEXT, "voice": "alice", "format": "mp3"}).content
    good, bare = tmp_path / "good.mp3", tmp_path / "bare.mp3"
    good.write_bytes(data)
    bare.write_bytes(TAGGERS["mp3"].strip(data))
    monkeypatch.setenv("COSYSERVE_SIGNING_SECRET", SECRET)
    assert cli_main(["verify", str(good), "--data-dir", str(tmp_path)]) == 0
    assert "intact (mp3)" in capsys.readouterr().out
    assert cli_main(["verify", str(good), str(bare), "--data-dir", str(tmp_path)]) == 2
    monkeypatch.setenv("COSYSERVE_SIGNING_SECRET", "another server's secret")
    assert cli_main(["verify", str(good), "--json", "--data-dir", str(tmp_path)]) == 1


def test_a_user_key_may_not_skip_the_cue(start_api_server) -> None:
    live = start_api_server(api_keys_required=True, label_explicit="start", c2pa=False)
    try:
        user_key = live.service.keys.create("app", "user")[1]
        with live.client(headers={"Authorization": f"Bearer {user_key}"}) as user:
            body = {"text": API_TEXT, "voice": "nobody", "explicit_label": False}
            response = user.post("/v1/tts", json=body)
            assert response.status_code == 403
            assert response.json()["error"]["code"] == "forbidden"
            assert "admin" in response.json()["error"]["message"]
    finally:
        live.stop()


def test_openai_speech_is_labelled_too(client) -> None:
    body = {"model": "cosyvoice3", "input": API_TEXT, "voice": "alice", "response_format": "mp3"}
    response = client.post("/v1/audio/speech", json=body)
    assert response.status_code == 200, response.text
    assert check(client, response.content)["status"] == "intact"


def test_c2pa_manifest_through_the_server(start_api_server, prompt_wav_bytes) -> None:
    pytest.importorskip("c2pa", reason="c2pa-python is not installed (pip install 'cosyserve[labels]')")
    live = start_api_server(c2pa=True)
    try:
        assert live.service.labels.describe()["c2pa"] == "on, self-signed (private deployment)"
        with live.client() as client:
            enrol_voice(client, "carol", prompt_wav_bytes)
            response = client.post("/v1/tts", json={"text": API_TEXT, "voice": "carol", "format": "mp3"})
            report = check(client, response.content)
            srt = "1\n00:00:00,000 --> 00:00:01,500\n你好。\n"
            dub = client.post("/v1/dub", json={"voice": "carol", "subtitles": srt}).json()
            assert wait_until_ended(client, f"/v1/dub/{dub['id']}")["state"] == "done"
            track = client.get(f"/v1/dub/{dub['id']}/track", follow_redirects=True)  # the stored WAV itself
            assert track.status_code == 200 and track.content[:4] == b"RIFF"
            track_report = check(client, track.content)
        assert report["status"] == "intact" and report["c2pa"]["status"] == "valid"
        assert report["c2pa"]["ai_generated"] and report["c2pa"]["generation"]["voice_id"] == "carol"
        # A dub's track is written on disk, not in memory: it had the implicit label only.
        assert track_report["status"] == "intact" and track_report["c2pa"]["status"] == "valid", track_report
    finally:
        live.stop()


def test_the_spoken_notice_starts_every_output_in_its_voice(start_api_server, prompt_wav_bytes) -> None:
    live = start_api_server(label_explicit="start", label_explicit_kind="notice", c2pa=False)
    try:
        with live.client() as client:
            enrol_voice(client, "dave", prompt_wav_bytes)
            first = client.post("/v1/tts", json={"text": "你好。", "voice": "dave", "seed": 1})
            body = {"text": "再见了。", "voice": "dave", "seed": 2, "stream": True, "format": "pcm"}
            with client.stream("POST", "/v1/tts", json=body) as response:
                streamed = np.frombuffer(response.read(), "<i2").astype(np.float32) / 32767
            manifest = client.get(f"/v1/outputs/{first.headers['x-cosyserve-output-id']}/manifest").json()
        notices = live.service.labels.notices
        assert notices.syntheses == 1  # one voice, one language: made once, then reused
        (notice,) = notices._entries.values()
        audio = decoded(first.content)
        np.testing.assert_allclose(audio[: len(notice)], notice, atol=2 / 32767)
        np.testing.assert_allclose(streamed[: len(notice)], notice, atol=2 / 32767)
        assert manifest["sentences"][0]["start_s"] == pytest.approx(len(notice) / 24000, abs=1e-3)
        assert manifest["labels"]["explicit"] == "start (notice)"
    finally:
        live.stop()


def test_two_users_voices_of_one_name_each_speak_their_own_notice(
    start_api_server, prompt_wav_bytes, shared_dir
) -> None:
    """The notice was cached by the name asked for: whoever asked first had their private voice speak it
    at the start of the other user's audio (a team's run)."""
    live = start_api_server(
        label_explicit="start", label_explicit_kind="notice", c2pa=False, api_keys_required=True
    )
    try:
        other = (shared_dir / "audio" / "prompt_b_22k.wav").read_bytes()
        starts = {}
        for who, recording in (("alice", prompt_wav_bytes), ("bob", other)):
            key = live.service.keys.create(who, "user")[1]
            with live.client(headers={"Authorization": f"Bearer {key}"}) as client:
                enrol_voice(client, "narrator", recording)
                spoken = client.post("/v1/tts", json={"text": "你好。", "voice": "narrator", "seed": 1})
                assert spoken.status_code == 200, spoken.text
                starts[who] = decoded(spoken.content)
        assert live.service.labels.notices.syntheses == 2  # one per voice, not one per name
        notices = list(live.service.labels.notices._entries.values())
        for who, notice in zip(("alice", "bob"), notices, strict=True):
            np.testing.assert_allclose(starts[who][: len(notice)], notice, atol=2 / 32767)
        shortest = min(len(notice) for notice in notices)
        assert not np.allclose(notices[0][:shortest], notices[1][:shortest], atol=1e-3)
    finally:
        live.stop()


def test_quotas_count_the_speech_not_the_label_nor_the_takes_not_kept(
    start_api_server, prompt_wav_bytes
) -> None:
    """A batch item used to be charged its audible cue too (a spoken notice made a 40-line batch cost
    ten times its speech), and a job of several takes every take it made; now every path charges the
    speech of the take delivered, as `/v1/tts` does."""
    live = start_api_server(
        api_keys_required=True, label_explicit="start", c2pa=False, rate_limit_per_minute=0
    )
    try:
        record, key = live.service.keys.create("charged", "user", quota=600.0)
        quota = live.service.access.quota
        cue_s = cue.cue_seconds(live.service.backend.model_info["sample_rate"])
        with live.client(headers={"Authorization": f"Bearer {key}"}) as user:
            enrol_voice(user, "mine", prompt_wav_bytes)
            spoken = user.post("/v1/tts", json={"text": API_TEXT, "voice": "mine", "seed": API_SEED})
            delivered_s = float(spoken.headers["x-cosyserve-duration"])
            assert quota.used(record.id) == pytest.approx(delivered_s - cue_s, abs=0.01)

            batch = user.post("/v1/batches", json={"voice": "mine", "items": [API_TEXT]}).json()
            finished = wait_until_ended(user, f"/v1/batches/{batch['id']}")
            item_s = finished["items"][0]["duration_s"]
            assert quota.used(record.id) == pytest.approx(delivered_s - cue_s + item_s - cue_s, abs=0.01)

            before = quota.used(record.id)
            job = user.post(
                "/v1/jobs", json={"text": API_TEXT, "voice": "mine", "seed": 11, "takes": 3}
            ).json()
            ended = wait_until_ended(user, f"/v1/jobs/{job['id']}")
            assert ended["state"] == "done" and ended["quality"]["takes"] >= 2, (
                ended
            )  # the random model fails checks
            assert quota.used(record.id) - before == pytest.approx(ended["duration_s"] - cue_s, abs=0.01)
    finally:
        live.stop()


def wait_until_ended(client, path: str, timeout_s: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while (body := client.get(path).json()).get("state") not in ("done", "failed", "cancelled"):
        assert time.monotonic() < deadline, body
        time.sleep(0.05)
    return body


def test_a_file_too_large_to_verify_says_what_to_do(start_api_server) -> None:
    """Its 413 spoke of recordings and base64 JSON (a team's run, verifying a long dub track)."""
    live = start_api_server(max_upload_mb=0.05)
    try:
        with live.client() as client:
            response = client.post("/v1/verify", files={"file": ("track.wav", b"\0" * 200_000, "audio/wav")})
        message = response.json()["error"]["message"]
        assert response.status_code == 413 and "cosyserve verify" in message and "recording" not in message
    finally:
        live.stop()
