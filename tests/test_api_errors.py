"""Every error is the JSON envelope with the right status; bad input (hypothesis) never gives a 500 or
kills a worker."""

from __future__ import annotations

import base64
import io
import json
import re
from urllib.parse import quote

import numpy as np
import pytest
import soundfile as sf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.conftest import API_SEED, API_TEXT, LONG_TEXT, enrol_voice

UPLOAD_MB = 1.0


@pytest.fixture(scope="module")
def server(start_api_server, prompt_wav_bytes):
    live = start_api_server(max_upload_mb=UPLOAD_MB, max_text_chars=40)
    with live.client() as client:
        enrol_voice(client, "alice", prompt_wav_bytes)
    yield live
    live.stop()


@pytest.fixture
def client(server):
    with server.client() as http:
        yield http


def assert_envelope(response, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"code", "message", "request_id", "type", "param"}  # type, param: as OpenAI's
    assert error["type"] == ("server_error" if status >= 500 else error["type"]) and error["type"]
    assert error["request_id"] == response.headers["x-request-id"]
    assert error["message"] and "Traceback" not in error["message"]
    if code is not None:
        assert error["code"] == code, error
    return error


def test_input_errors(client, prompt_wav_bytes) -> None:
    wav64 = base64.b64encode(prompt_wav_bytes).decode()
    assert_envelope(client.post("/v1/tts", json={"text": API_TEXT}), 400, "invalid_input")  # no voice
    both = {"text": API_TEXT, "voice": "alice", "prompt_wav": wav64}
    assert_envelope(client.post("/v1/tts", json=both), 400, "invalid_input")
    assert_envelope(client.post("/v1/tts", json={"text": API_TEXT, "voice": "bob"}), 404, "voice_not_found")
    bad64 = {"text": API_TEXT, "prompt_wav": "not base64!"}
    assert "base64" in assert_envelope(client.post("/v1/tts", json=bad64), 400, "invalid_input")["message"]
    garbage = {"text": API_TEXT, "prompt_wav": base64.b64encode(b"\x00" * 5000).decode()}
    assert_envelope(client.post("/v1/tts", json=garbage), 400, "invalid_input")
    long_text = {"text": "字" * 41, "voice": "alice"}
    assert "limit is 40" in assert_envelope(client.post("/v1/tts", json=long_text), 400)["message"]
    mp3_rate = {"text": API_TEXT, "voice": "alice", "format": "mp3", "sample_rate": 9000}
    assert "mp3" in assert_envelope(client.post("/v1/tts", json=mp3_rate), 400, "invalid_input")["message"]


def test_malformed_requests(client) -> None:
    for body in ({"text": ""}, {"text": API_TEXT, "speed": 3}, {"text": API_TEXT, "format": "aiff"},
                 {"text": API_TEXT, "seed": -1}, {"text": API_TEXT, "colour": "blue"}):  # fmt: skip
        error = assert_envelope(client.post("/v1/tts", json=body), 422, "invalid_request")
        assert "'" not in error["message"] or "blue" not in error["message"]  # no values echoed
    not_json = client.post("/v1/tts", content=b"{nope", headers={"content-type": "application/json"})
    assert_envelope(not_json, 400, "invalid_input")
    assert_envelope(client.post("/v1/tts", json=[1, 2]), 400, "invalid_input")
    as_text = client.post("/v1/tts", content=b"hello", headers={"content-type": "text/plain"})
    assert_envelope(as_text, 415, "unsupported_media_type")
    assert_envelope(client.get("/v1/nothing-here"), 404, "not_found")
    assert_envelope(client.put("/v1/tts"), 405, "method_not_allowed")
    # OpenAI's route answers as OpenAI does: 400, with the field in `param` (its SDKs raise BadRequestError)
    no_voice = assert_envelope(
        client.post("/v1/audio/speech", json={"input": API_TEXT}), 400, "invalid_request"
    )
    assert no_voice["param"] == "voice" and no_voice["type"] == "invalid_request_error"
    for field, value, status in [("speed", 3, 400), ("response_format", "aac", 400),
                                 ("sample_rate", 12345, 400), ("voice", "nobody-has-this", 404)]:  # fmt: skip
        bad = client.post("/v1/audio/speech", json={"input": API_TEXT, "voice": "alice", field: value})
        assert assert_envelope(bad, status)["param"] == field, bad.text


def test_a_boolean_is_no_number(client) -> None:
    """`"seed": true` was seed 1 and `"volume": false` a silent result; a batch item's too."""
    for field in ("seed", "volume", "speed", "takes"):
        error = assert_envelope(
            client.post("/v1/tts", json={"text": API_TEXT, "voice": "alice", field: True}), 422
        )
        assert error["param"] == field and "must be a number, not true" in error["message"], error
    bad = client.post("/v1/audio/speech", json={"input": API_TEXT, "voice": "alice", "speed": True})
    assert assert_envelope(bad, 400)["param"] == "speed"
    items = [{"text": API_TEXT, "seed": True}, {"text": API_TEXT, "seed": -1}]
    batch = client.post("/v1/batches", json={"voice": "alice", "items": items})  # an item fails alone
    said = [item["error"]["message"] for item in batch.json()["items"]]
    assert said[0] == "seed True is not a number" and said[1].endswith("from 0 to 2147483647"), said


def test_deeply_nested_json_is_a_400_everywhere(client) -> None:
    deep = b"[" * 1000 + b"]" * 1000
    nested_object = b'{"text": ' + b'{"a": ' * 50 + b"1" + b"}" * 50 + b"}"
    headers = {"content-type": "application/json"}
    for method, path in [("POST", "/v1/tts"), ("POST", "/v1/jobs"), ("POST", "/v1/voices"),
                         ("POST", "/v1/audio/speech"), ("PATCH", "/v1/voices/alice")]:  # fmt: skip
        for body in (deep, nested_object):
            response = client.request(method, path, content=body, headers=headers)
            assert response.status_code in (400, 422), (path, response.text)
            assert_envelope(response, response.status_code)
    for method, path in [("PATCH", "/v1/voices/alice"), ("POST", "/v1/audio/speech"), ("POST", "/v1/tts")]:
        for body in (b"{nope", b"[" * 100_000):  # answered alike: 400 invalid_input, saying what was wrong
            error = assert_envelope(client.request(method, path, content=body, headers=headers), 400)
            assert error["code"] == "invalid_input" and (
                "JSON" in error["message"] or "deeply" in error["message"]
            ), (path, error)
    lexicon = "[" * 1000 + "]" * 1000
    form = client.post(
        "/v1/voices", data={"name": "deep", "lexicon": lexicon}, files={"audio": ("a.wav", b"RIFF")}
    )
    assert "nested too deeply" in assert_envelope(form, 400, "invalid_input")["message"]


def test_uploads_are_checked(client, prompt_wav_bytes) -> None:
    def upload(name: str, data: bytes, content_type: str):
        return client.post(
            "/v1/tts", data={"text": API_TEXT}, files={"prompt_wav": (name, data, content_type)}
        )

    assert_envelope(upload("notes.txt", prompt_wav_bytes, "text/plain"), 415, "unsupported_media_type")
    assert_envelope(upload("me.wav", prompt_wav_bytes, "image/png"), 415, "unsupported_media_type")
    assert_envelope(upload("me.wav", b"", "audio/wav"), 400, "invalid_input")
    big = np.random.default_rng(0).uniform(-0.5, 0.5, int(UPLOAD_MB * 1e6 / 2) + 24000).astype(np.float32)
    buffer = io.BytesIO()
    sf.write(buffer, big, 24000, format="WAV", subtype="PCM_16")
    assert_envelope(upload("big.wav", buffer.getvalue(), "audio/wav"), 413, "payload_too_large")
    huge_json = {"text": API_TEXT, "prompt_wav": "A" * int(UPLOAD_MB * 1e6 * 1.4)}
    assert_envelope(client.post("/v1/tts", json=huge_json), 413, "payload_too_large")
    body_cap = client.post(
        "/v1/tts", content=b"x" * int(UPLOAD_MB * 1e6 * 2.5), headers={"content-type": "application/json"}
    )
    assert_envelope(body_cap, 413, "payload_too_large")
    assert "a text with its recording is limited to" in body_cap.json()["error"]["message"]
    script = client.post(
        "/v1/batches", content=b"x" * int(UPLOAD_MB * 1e6 * 2.5), headers={"content-type": "text/csv"}
    )
    assert_envelope(script, 413, "payload_too_large")  # it said "recordings are limited to …"
    assert "a script or subtitle file" in script.json()["error"]["message"]
    twice = client.post("/v1/tts", data={"text": [API_TEXT, API_TEXT], "voice": "alice"})
    assert_envelope(twice, 400, "invalid_input")


def test_timeout_is_504_and_frees_the_worker(server, client) -> None:
    scheduler = server.service.scheduler
    scheduler.request_timeout_s = 0.3
    try:
        response = client.post("/v1/tts", json={"text": LONG_TEXT[:40], "voice": "alice"})
    finally:
        scheduler.request_timeout_s = 120.0
    assert "request timeout" in assert_envelope(response, 504, "timeout")["message"]
    assert response.headers["x-should-retry"] == "false"  # OpenAI's SDKs ran the doomed request 3 times
    assert (
        client.post("/v1/tts", json={"text": API_TEXT, "voice": "alice", "seed": API_SEED}).status_code == 200
    )


def test_unexpected_errors_are_500_without_details(server, client, monkeypatch) -> None:
    def explode(*_args: object) -> None:
        raise RuntimeError("secret internal detail")

    monkeypatch.setattr(server.service.voices, "list", explode)
    error = assert_envelope(client.get("/v1/voices"), 500, "internal")
    assert "secret" not in error["message"] and error["request_id"] in error["message"]
    logs = client.get("/admin/logs", params={"level": "ERROR"}).json()["data"]
    assert any("secret internal detail" in entry["message"] and entry.get("exc") for entry in logs)


# -- property-based: arbitrary bodies and uploads ------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=8,
)
FIELDS = [
    *("text", "voice", "prompt_wav", "prompt_text", "instruct", "seed", "speed", "volume", "format"),
    *("sample_rate", "stream", "input", "model", "response_format", "stream_format", "name", "audio"),
]
bodies = st.dictionaries(
    st.sampled_from(FIELDS), json_values | st.sampled_from(["nobody", "wav", "sse", ""]), max_size=8
)
FUZZ = settings(
    max_examples=30, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def assert_handled(response) -> None:
    assert response.status_code != 500, response.text
    if response.status_code >= 400:
        assert response.json()["error"]["code"]


@FUZZ
@given(path=st.sampled_from(["/v1/tts", "/v1/jobs", "/v1/audio/speech", "/v1/voices"]), body=bodies)
def test_fuzz_json_bodies(client, path: str, body: dict) -> None:
    # Never a real voice: every request fails validation or lookup, so no synthesis runs.
    if isinstance(body.get("voice"), str) and body["voice"] == "alice":
        body["voice"] = "nobody"
    assert_handled(client.post(path, content=json.dumps(body), headers={"content-type": "application/json"}))


@FUZZ
@given(
    data=st.binary(max_size=3000)
    | st.sampled_from([b"RIFF", b"RIFF\xff\xff\xff\xffWAVEfmt ", b"fLaC" + b"\0" * 40]),
    name=st.sampled_from(["a.wav", "a.mp3", "a.flac", "a", "../../etc/passwd", "a.WAV", "x.txt"]),
    content_type=st.sampled_from(["audio/wav", "application/octet-stream", "", "text/plain", "audio/mpeg"]),
    fields=st.dictionaries(
        st.sampled_from(["text", "prompt_text", "seed", "speed", "format"]), st.text(max_size=12)
    ),
)
def test_fuzz_uploads(client, data: bytes, name: str, content_type: str, fields: dict) -> None:
    fields.setdefault("text", API_TEXT)
    files = {"prompt_wav": (name, data, content_type or "application/octet-stream")}
    assert_handled(client.post("/v1/tts", data=fields, files=files))
    assert_handled(
        client.post("/v1/voices", data={"name": "fuzz"}, files={"audio": (name, data, "audio/wav")})
    )


def test_workers_survive_the_fuzzing(server, client) -> None:
    scheduler = server.service.scheduler
    assert all(worker.is_alive() for worker in scheduler._workers)
    assert client.get("/ready").status_code == 200
    assert (
        client.post("/v1/tts", json={"text": API_TEXT, "voice": "alice", "seed": API_SEED}).status_code == 200
    )
    stats = scheduler.stats()
    assert stats["queued"] == 0 and stats["running"] == 0


# -- property-based: every route of the API's own schema ---------------------------------------------------

ODD_STRINGS = st.sampled_from(
    ["..", "%00", "a" * 300, "../../etc/passwd", "output_20250101_000000", "\u0000", ""]
)
SKIPPED_OPERATIONS = {("post", "/admin/engine/restart")}  # would reload the model under the other tests


def _operations(schema: dict) -> list[tuple[str, str, dict]]:
    return sorted(
        (method, path, operation)
        for path, item in schema["paths"].items()
        for method, operation in item.items()
        if method in ("get", "post", "put", "patch", "delete") and (method, path) not in SKIPPED_OPERATIONS
    )


@settings(
    max_examples=120,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_fuzz_every_route_of_the_schema(client, data) -> None:
    """Any route, odd path parameters, query strings and JSON bodies: never a 500, always the envelope."""
    operations = _operations(client.get("/openapi.json").json())
    method, path, operation = data.draw(st.sampled_from(operations))
    params = {}
    for parameter in operation.get("parameters", []):
        value = data.draw(ODD_STRINGS | st.text(max_size=12) | st.integers().map(str))
        if parameter["in"] == "path":
            path = path.replace("{" + parameter["name"] + "}", quote(value, safe="") or "x")
        elif parameter["in"] == "query" and data.draw(st.booleans()):
            params[parameter["name"]] = value
    body = data.draw(bodies) if method in ("post", "put", "patch") else None
    if isinstance(body, dict) and body.get("voice") == "alice":
        body["voice"] = "nobody"  # never a real synthesis: every request fails validation or lookup
    content = None if body is None else json.dumps(body)
    headers = {"content-type": "application/json"} if content is not None else {}
    assert_handled(client.request(method, path, params=params, content=content, headers=headers))


def test_null_volume_is_the_default_as_null_speed_is() -> None:
    from cosyserve.api.schemas import TtsParams

    asked = TtsParams.model_validate({"text": "你好。", "voice": "alice", "volume": None, "speed": None})
    request = asked.to_request(None)
    assert request.volume == 1.0 and request.speed is None


def test_a_huge_offset_or_position_is_a_422_not_a_500(client) -> None:
    """Past what a database integer holds: "Python int too large to convert to SQLite INTEGER" was a 500."""
    huge = "99999999999999999999"
    for path in (f"/v1/jobs?offset={huge}", f"/v1/batches?offset={huge}", f"/v1/outputs?offset={huge}",
                 f"/v1/batches/{'a' * 32}?offset={huge}", f"/v1/dub/{'a' * 32}?offset={huge}",
                 f"/v1/batches/{'a' * 32}/items/{huge}"):  # fmt: skip
        assert_envelope(client.get(path), 422, "invalid_request")


def test_every_reference_in_the_schema_resolves(client) -> None:
    """Request bodies pointed at `#/$defs/Thresholds`, which the document's root does not hold: clients
    and fuzzers skipped those parts of four operations."""
    schema = client.get("/openapi.json").json()
    text = json.dumps(schema)
    for ref in set(re.findall(r'"\$ref": "#/([^"]+)"', text)):
        node = schema
        for part in ref.split("/"):
            assert part in node, ref
            node = node[part]
    thresholds = schema["paths"]["/v1/tts"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert "min_similarity" in json.dumps(thresholds["properties"]["thresholds"])  # written in place


def test_a_batch_item_with_a_lone_surrogate_fails_alone(client) -> None:
    """`"hi\\ud800"` was kept as "hi\\ufffd" and read out; /v1/tts refuses the same text."""
    body = '{"voice": "alice", "items": ["hi\\ud800", "' + API_TEXT + '"]}'
    batch = client.post("/v1/batches", content=body, headers={"content-type": "application/json"})
    assert batch.status_code == 202, batch.text
    first = batch.json()["items"][0]
    assert first["state"] == "failed" and "lone surrogate" in first["error"]["message"], first
