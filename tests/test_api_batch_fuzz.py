"""Whatever a client sends as a batch or a subtitle file, the answer is a 202 or an error envelope, never a
500: JSON bodies of any shape, CSV/JSONL/text files of any bytes, subtitle files of any text, and JSON
nested too deeply. The voice is never a real one, so nothing is synthesised."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FUZZ = settings(
    max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
FIELDS = [
    "text",
    "voice",
    "instruct",
    "seed",
    "speed",
    "volume",
    "format",
    "name",
    "colour",
    "items",
    "prompt_wav",
]
scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
items = st.lists(
    st.dictionaries(st.sampled_from(FIELDS), values, max_size=5) | st.text(max_size=20) | values, max_size=6
)


@pytest.fixture(scope="module")
def client(start_api_server):
    live = start_api_server(max_text_chars=40, max_batch_items=5)
    with live.client() as http:
        yield http
    live.stop()


def assert_handled(response) -> None:
    assert response.status_code != 500, response.text
    if response.status_code >= 400:
        assert response.json()["error"]["code"], response.text
    else:
        assert response.status_code == 202


@FUZZ
@given(shared=st.dictionaries(st.sampled_from(FIELDS), values, max_size=5), entries=items)
def test_fuzz_json_batches(client, shared: dict, entries: list) -> None:
    body = {**shared, "voice": "nobody", "items": entries}
    assert_handled(
        client.post("/v1/batches", content=json.dumps(body), headers={"content-type": "application/json"})
    )


@FUZZ
@given(
    data=st.binary(max_size=600) | st.text(max_size=300).map(str.encode),
    name=st.sampled_from(["a.csv", "a.jsonl", "a.json", "a.txt", "a", "a.srt", "../a.csv"]),
)
def test_fuzz_batch_files(client, data: bytes, name: str) -> None:
    assert_handled(client.post("/v1/batches", data={"voice": "nobody"}, files={"file": (name, data)}))


cue = st.tuples(st.integers(0, 20_000), st.integers(0, 20_000), st.text(max_size=15))


@FUZZ
@given(
    cues=st.lists(cue, max_size=6),
    noise=st.text(max_size=40),
    vtt=st.booleans(),
    max_speed=st.sampled_from(["1.25", "0.5", "3", "x", ""]),
)
def test_fuzz_subtitle_files(client, cues: list, noise: str, vtt: bool, max_speed: str) -> None:
    def clock(ms: int) -> str:
        return f"00:{ms // 60000 % 60:02d}:{ms // 1000 % 60:02d}{'.' if vtt else ','}{ms % 1000:03d}"

    text = (
        ("WEBVTT\n\n" if vtt else "")
        + "".join(f"{clock(a)} --> {clock(b)}\n{t}\n\n" for a, b, t in cues)
        + noise
    )
    fields = {"voice": "nobody", "max_speed": max_speed}
    assert_handled(
        client.post("/v1/dub", data=fields, files={"file": ("a.vtt" if vtt else "a.srt", text.encode())})
    )


def test_deeply_nested_json_is_refused(client) -> None:
    deep = b"[" * 1000 + b"]" * 1000
    for path in ("/v1/batches", "/v1/dub"):
        response = client.post(path, content=deep, headers={"content-type": "application/json"})
        assert response.status_code == 400 and "nested too deeply" in response.json()["error"]["message"]
    form = client.post("/v1/batches", data={"voice": "nobody", "items": "[" * 1000 + "]" * 1000})
    assert form.status_code == 400 and form.json()["error"]["code"] == "invalid_input"
