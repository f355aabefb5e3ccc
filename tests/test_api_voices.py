"""The voice library over HTTP: enrol (multipart and JSON), list, read, update, preview, delete."""

from __future__ import annotations

import base64
import io
import json

import pytest
import soundfile as sf
from tests.conftest import PROMPT_TRANSCRIPT, enrol_voice


@pytest.fixture(scope="module")
def server(start_api_server):
    live = start_api_server()
    yield live
    live.stop()


@pytest.fixture
def client(server):
    with server.client() as http:
        yield http


def test_enrol_multipart_with_defaults_and_lexicon(client, prompt_wav_bytes) -> None:
    data = {
        "name": "bob",
        "transcript": PROMPT_TRANSCRIPT,
        "speed": "1.25",
        "seed": "9",
        "lexicon": json.dumps({"重庆": "[chóng qìng]"}, ensure_ascii=False),
    }
    response = client.post(
        "/v1/voices", data=data, files={"audio": ("bob.wav", prompt_wav_bytes, "audio/wav")}
    )
    assert response.status_code == 201, response.text
    voice = response.json()
    assert voice["name"] == "bob" and voice["transcript"] == PROMPT_TRANSCRIPT
    assert voice["defaults"] == {"instruct": None, "speed": 1.25, "seed": 9, "denoise": None}
    assert voice["lexicon"] == {"重庆": "[chóng qìng]"}
    assert voice["report"]["duration_s"] > 3
    assert client.get(f"/v1/voices/{voice['id']}").json() == voice
    assert client.get("/v1/voices/bob").json()["id"] == voice["id"]
    assert "bob" in [v["name"] for v in client.get("/v1/voices").json()["data"]]


def test_enrol_json_base64_and_duplicate_name(client, prompt_wav_bytes) -> None:
    body = {"name": "carol", "audio": base64.b64encode(prompt_wav_bytes).decode()}
    assert client.post("/v1/voices", json=body).status_code == 201
    again = client.post("/v1/voices", json=body)
    assert again.status_code == 400 and "already have a voice named" in again.json()["error"]["message"]
    every = [v["id"] for v in client.get("/v1/voices").json()["data"]]
    page = client.get("/v1/voices", params={"limit": 1, "offset": 1}).json()["data"]  # (were ignored)
    assert len(every) >= 2 and [v["id"] for v in page] == every[1:2]
    assert client.get("/v1/voices", params={"limit": 0}).status_code == 422


def test_enrol_accepts_the_tts_field_names(client, prompt_wav_bytes) -> None:
    """`prompt_wav`/`prompt_text`, as in /v1/tts, are aliases of `audio`/`transcript`."""
    files = {"prompt_wav": ("erin.wav", prompt_wav_bytes, "audio/wav")}
    response = client.post("/v1/voices", data={"name": "erin", "prompt_text": PROMPT_TRANSCRIPT}, files=files)
    assert response.status_code == 201, response.text
    assert response.json()["transcript"] == PROMPT_TRANSCRIPT
    encoded = base64.b64encode(prompt_wav_bytes).decode()
    by_json = client.post("/v1/voices", json={"name": "fay", "prompt_wav": encoded, "prompt_text": "你好"})
    assert by_json.status_code == 201 and by_json.json()["transcript"] == "你好"
    both = client.post("/v1/voices", json={"name": "gus", "audio": encoded, "prompt_wav": encoded})
    assert both.status_code == 400 and "give the recording once" in both.json()["error"]["message"]
    for name in ("erin", "fay"):
        assert client.delete(f"/v1/voices/{name}").status_code == 204


def test_enrol_needs_usable_audio(client) -> None:
    missing = client.post("/v1/voices", json={"name": "dave"})
    assert missing.status_code == 400 and "no recording" in missing.json()["error"]["message"]
    noise = client.post(
        "/v1/voices", data={"name": "dave"}, files={"audio": ("x.wav", b"RIFF0000WAVE", "audio/wav")}
    )
    assert noise.status_code == 400 and noise.json()["error"]["code"] == "invalid_input"
    bad_name = client.post("/v1/voices", data={"name": "a/b"}, files={"audio": ("x.wav", b"xx", "audio/wav")})
    assert bad_name.status_code == 400
    assert client.get("/v1/voices/dave").status_code == 404


@pytest.mark.parametrize(
    ("lexicon", "says"),
    [
        ({"": "x"}, "is empty or holds brackets"),
        ({"[x]": "y"}, "is empty or holds brackets"),
        ({"重庆": ""}, "has no pronunciation"),
        ({"重庆": "[chóng]"}, "重庆"),  # one syllable for two characters
        # sizes: 500,000 entries held the server for minutes; a 40,000-syllable reading refused every text
        ({f"w{i}": "[h][ào]" for i in range(2001)}, "at most 2000 entries"),
        ({"zz": "[h][ào]" * 100}, "at most 300"),
        ({"字" * 65: "zi4"}, "at most 64"),
        ({"w\u0000": "[h][ào]"}, "control characters"),
    ],
)
def test_a_lexicon_that_would_not_compile_is_refused_when_saved(
    client, prompt_wav_bytes, lexicon, says
) -> None:
    """A voice saved with such an entry refused every synthesis afterwards (its shared users' too, who can
    neither see nor fix it): the entry is refused at PATCH and at enrolment instead, naming it."""
    name = f"lex{abs(hash(json.dumps(lexicon))) % 10_000}"
    enrol_voice(client, name, prompt_wav_bytes)
    refused = client.patch(f"/v1/voices/{name}", json={"lexicon": lexicon})
    assert refused.status_code == 400 and says in refused.json()["error"]["message"], refused.text
    assert refused.json()["error"]["param"] == "lexicon"
    assert client.get(f"/v1/voices/{name}").json()["lexicon"] == {}
    spoken = client.post("/v1/tts", json={"text": "重庆你好。", "voice": name})
    assert spoken.status_code == 200, spoken.text
    files = {"audio": ("p.wav", prompt_wav_bytes, "audio/wav")}
    data = {"name": f"{name}b", "transcript": "你好。", "lexicon": json.dumps(lexicon, ensure_ascii=False)}
    assert client.post("/v1/voices", data=data, files=files).status_code == 400
    client.delete(f"/v1/voices/{name}")


def test_update_preview_delete(client, prompt_wav_bytes) -> None:
    voice = enrol_voice(client, "erin", prompt_wav_bytes)
    patched = client.patch(
        f"/v1/voices/{voice['id']}",
        json={"name": "erin2", "defaults": {"speed": 0.8, "instruct": "speak slowly"}, "lexicon": {}},
    )
    assert patched.status_code == 200, patched.text
    assert patched.json()["name"] == "erin2" and patched.json()["defaults"]["speed"] == 0.8
    assert client.patch("/v1/voices/erin2", json={"defaults": {"speed": 9}}).status_code == 422
    recording = client.get("/v1/voices/erin2/preview")
    assert recording.status_code == 200 and recording.content == prompt_wav_bytes
    spoken = client.get("/v1/voices/erin2/preview", params={"text": "hi"})
    assert spoken.status_code == 200 and len(sf.read(io.BytesIO(spoken.content))[0]) > 0
    assert client.delete("/v1/voices/erin2").status_code == 204
    gone = client.get(f"/v1/voices/{voice['id']}")
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "voice_not_found"
    assert client.delete("/v1/voices/erin2").status_code == 404


def test_a_name_typed_decomposed_is_the_same_name(client, prompt_wav_bytes) -> None:
    """ "ü" typed as u + a combining diaeresis (NFD) was refused at enrolment and not found at lookup,
    with a message naming a voice that looked exactly like the one saved."""
    import unicodedata

    composed = "声音ünï"
    decomposed = unicodedata.normalize("NFD", composed)
    assert decomposed != composed
    saved = enrol_voice(client, decomposed, prompt_wav_bytes)
    assert saved["name"] == composed
    assert client.get(f"/v1/voices/{decomposed}").json()["id"] == saved["id"]
    assert client.delete(f"/v1/voices/{composed}").status_code == 204


def test_one_owner_keeps_a_bounded_number_of_voices(server, client, prompt_wav_bytes) -> None:
    """Each voice keeps its recording (38 MB for a 6-channel 48 kHz one) where no retention frees it: a
    user could fill the disk every user shares (a team's run). One owner keeps at most
    max_voices_per_owner."""
    key, secret = server.service.keys.create("collector", "user")
    library = server.service.voices
    library.max_per_owner = 2
    try:
        with server.client(headers={"Authorization": f"Bearer {secret}"}) as user:
            for name in ("first", "second"):
                made = user.post(
                    "/v1/voices",
                    files={"audio": ("v.wav", prompt_wav_bytes, "audio/wav")},
                    data={"name": name, "transcript": PROMPT_TRANSCRIPT, "consent": "true"},
                )
                assert made.status_code == 201, made.text
            third = user.post(
                "/v1/voices",
                files={"audio": ("v.wav", prompt_wav_bytes, "audio/wav")},
                data={"name": "third", "transcript": PROMPT_TRANSCRIPT, "consent": "true"},
            )
            assert third.status_code == 400 and "max_voices_per_owner" in third.json()["error"]["message"]
            assert user.delete("/v1/voices/first").status_code == 204  # room again
    finally:
        library.max_per_owner = None
        server.service.keys.revoke(key.id)


def test_a_full_disk_is_a_503_storage_error_not_a_500(client, prompt_wav_bytes, monkeypatch) -> None:
    from cosyserve.service.stores import voices as voice_store

    def full(path, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(voice_store, "write_atomic", full)
    response = client.post(
        "/v1/voices",
        data={"name": "full-disk", "transcript": "你好。"},
        files={"audio": ("a.wav", prompt_wav_bytes)},
    )
    error = response.json()["error"]
    assert response.status_code == 503 and error["code"] == "storage_error", response.text
    assert "No space left on device" in error["message"] and "make room" in error["message"]
    monkeypatch.undo()
    assert client.get("/v1/voices/full-disk").status_code == 404  # nothing half-made is left


def test_a_voice_or_threshold_refusal_names_its_field(client, prompt_wav_bytes) -> None:
    """A bad voice name, a taken one and multipart thresholds that are not JSON answered `param: null`."""
    files = {"audio": ("p.wav", prompt_wav_bytes, "audio/wav")}
    enrol_voice(client, "dupe", prompt_wav_bytes)
    for name in ("】【", "dupe"):  # not a name; taken
        refused = client.post("/v1/voices", data={"name": name, "transcript": "你好。"}, files=files)
        assert refused.status_code in (400, 409) and refused.json()["error"]["param"] == "name", refused.text
    form = {"text": "你好。", "voice": "dupe", "thresholds": "{not json"}
    refused = client.post("/v1/tts", data=form, files={"x": ("", b"", "text/plain")})
    assert refused.json()["error"]["param"] == "thresholds", refused.text
