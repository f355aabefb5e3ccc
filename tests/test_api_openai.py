"""POST /v1/audio/speech with the real `openai` SDK pointed at the local server, and OpenAI-shaped calls"""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import openai
import pytest
import soundfile as sf
from tests.conftest import API_SEED, API_TEXT, enrol_voice


@pytest.fixture(scope="module")
def server(start_api_server, prompt_wav_bytes):
    live = start_api_server()
    with live.client() as client:
        enrol_voice(client, "alice", prompt_wav_bytes)
    yield live
    live.stop()


@pytest.fixture
def sdk(server) -> openai.OpenAI:
    # Auth is off here: the SDK's placeholder key is ignored, as by other local OpenAI-compatible servers.
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="sk-placeholder", max_retries=0, timeout=120)


def test_sdk_create_wav_with_seed(sdk: openai.OpenAI) -> None:
    response = sdk.audio.speech.create(
        model="tts-1", voice="alice", input=API_TEXT, response_format="wav", extra_body={"seed": API_SEED}
    )
    audio, rate = sf.read(io.BytesIO(response.content))
    assert rate == 24000 and len(audio) > 0
    assert response.response.headers["x-cosyserve-seed"] == str(API_SEED)


def test_sdk_default_format_is_mp3_and_instructions_are_accepted(sdk: openai.OpenAI) -> None:
    response = sdk.audio.speech.create(
        model="gpt-4o-mini-tts", voice="alice", input=API_TEXT, instructions="speak happily", speed=1.0
    )
    assert response.response.headers["content-type"] == "audio/mpeg"
    assert len(sf.read(io.BytesIO(response.content))[0]) > 0


def test_sdk_streaming_audio(sdk: openai.OpenAI) -> None:
    with sdk.audio.speech.with_streaming_response.create(
        model="tts-1", voice="alice", input=API_TEXT, response_format="pcm", stream_format="audio"
    ) as response:
        assert response.headers["content-type"] == "audio/pcm"
        assert "content-length" not in response.headers
        data = b"".join(response.iter_bytes())
    assert len(data) > 0 and len(data) % 2 == 0


def test_sdk_streaming_sse_events(sdk: openai.OpenAI) -> None:
    with sdk.audio.speech.with_streaming_response.create(
        model="tts-1",
        voice="alice",
        input=API_TEXT,
        response_format="pcm",
        stream_format="sse",
        extra_body={"seed": API_SEED},
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    assert deltas and events[-1]["type"] == "speech.audio.done"
    usage = events[-1]["usage"]
    assert (
        usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"] and usage["output_tokens"] > 0
    )
    pcm = b"".join(base64.b64decode(e["audio"]) for e in deltas)
    samples = np.frombuffer(pcm, dtype="<i2")
    assert events[-1]["seed"] == API_SEED
    assert len(samples) / 24000 == pytest.approx(events[-1]["duration_s"], abs=1e-3)


def test_sdk_unknown_voice_says_how_to_create_one(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        sdk.audio.speech.create(model="tts-1", voice="nova", input=API_TEXT)
    assert "POST /v1/voices" in str(info.value)
    assert info.value.body["code"] == "voice_not_found"


def test_sdk_speed_and_format_limits(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        sdk.audio.speech.create(model="tts-1", voice="alice", input=API_TEXT, speed=3.0)
    assert "0.5 to 2.0" in str(info.value)
    for outside_openai_s_range_too in (0.1, 5.0):  # one message whatever the speed (it was a 422 here)
        with pytest.raises(openai.BadRequestError, match=r"0\.5 to 2\.0"):
            sdk.audio.speech.create(
                model="tts-1", voice="alice", input=API_TEXT, speed=outside_openai_s_range_too
            )
    with pytest.raises(openai.BadRequestError, match="aac"):
        sdk.audio.speech.create(model="tts-1", voice="alice", input=API_TEXT, response_format="aac")


def test_sdk_models_list(sdk: openai.OpenAI) -> None:
    ids = {model.id for model in sdk.models.list()}
    assert {"cosyvoice3", "tts-1", "tts-1-hd", "gpt-4o-mini-tts"} <= ids
    assert sdk.models.retrieve("tts-1").id == "tts-1"  # it was a 404 "no such endpoint"
    with pytest.raises(openai.NotFoundError, match="GET /v1/models lists them"):
        sdk.models.retrieve("gpt-5")


def test_sdk_sees_every_bad_parameter_as_a_bad_request_with_its_param(sdk: openai.OpenAI) -> None:
    """Half of them were 422s (another exception class), and `type` and `param` were always None."""
    for wrong in ({"input": ""}, {"response_format": "m4a"}, {"instructions": "x" * 501}):
        arguments = {"model": "tts-1", "voice": "alice", "input": API_TEXT, **wrong}
        with pytest.raises(openai.BadRequestError) as info:
            sdk.audio.speech.create(**arguments)
        assert info.value.type == "invalid_request_error" and info.value.param == next(iter(wrong)), wrong
    with pytest.raises(openai.BadRequestError) as info:
        sdk.audio.speech.create(model="tts-1", voice="alice", input=API_TEXT, speed=3.0)
    assert info.value.type == "invalid_request_error"


def test_a_text_over_the_limit_names_its_field(server) -> None:
    """An over-long `input` was a 400 with `param: null`; /v1/tts's names `text`."""
    long = "字" * 5000
    with server.client() as client:
        for extra in ({}, {"stream_format": "sse"}, {"stream_format": "audio"}):
            body = {"model": "tts-1", "voice": "alice", "input": long, **extra}
            error = client.post("/v1/audio/speech", json=body).json()["error"]
            assert error["param"] == "input" and error["message"].startswith("input is 5000 characters"), (
                extra
            )
        error = client.post("/v1/tts", json={"text": long, "voice": "alice"}).json()["error"]
        assert error["param"] == "text" and error["message"].startswith("text is 5000 characters")
        # an input with nothing to speak is about `input` too (it said "the text …", param null)
        counted = server.service.metrics.errors_total.labels(kind="invalid_input")
        for empty, says in (("   ", "the input is empty"), ("!!!", "the input '!!!' has nothing"),
                            ("[sad]", "the input '[sad]' is only an instruction tag")):  # fmt: skip
            body = {"model": "tts-1", "voice": "alice", "input": empty}
            before = counted._value.get()
            error = client.post("/v1/audio/speech", json=body).json()["error"]
            assert error["param"] == "input" and error["message"].startswith(says), error
            assert counted._value.get() == before + 1  # once (renamed for `input`, it counted twice)


def test_a_body_that_is_not_json_says_so(server) -> None:
    with server.client() as client:
        answer = client.post(
            "/v1/audio/speech", content=b"{not json", headers={"Content-Type": "application/json"}
        )
    assert answer.status_code == 400
    assert "the body is not valid JSON" in answer.json()["error"]["message"], answer.text


def test_speed_left_out_is_the_voices_default(server) -> None:
    """The OpenAI route always asked for speed 1.0, so a voice's default speed never applied."""
    with server.client() as client:
        client.patch("/v1/voices/alice", json={"defaults": {"speed": 2.0}})
        try:
            body = {"model": "tts-1", "voice": "alice", "input": API_TEXT, "response_format": "wav"}
            default = client.post("/v1/audio/speech", json={**body, "seed": API_SEED})
            normal = client.post("/v1/audio/speech", json={**body, "seed": API_SEED, "speed": 1.0})
        finally:
            client.patch("/v1/voices/alice", json={"defaults": {}})
    default_s = len(sf.read(io.BytesIO(default.content))[0])
    normal_s = len(sf.read(io.BytesIO(normal.content))[0])
    assert default_s < 0.75 * normal_s, (default_s, normal_s)


def test_raw_voice_object_and_unknown_fields(server) -> None:
    with server.client() as client:
        body = {
            "model": "whatever",
            "input": API_TEXT,
            "voice": {"id": "alice"},
            "response_format": "opus",
            "seed": API_SEED,
            "some_future_field": True,
        }
        response = client.post("/v1/audio/speech", json=body)
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("audio/ogg")
        manifest = client.get(f"/v1/outputs/{response.headers['x-cosyserve-output-id']}/manifest").json()
        assert (
            manifest["parameters"]["model"] == "whatever" and manifest["parameters"]["endpoint"] == "openai"
        )
