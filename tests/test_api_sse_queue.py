"""An SSE speech stream that waits in the queue: it begins at once with `queued` events (place, estimate),
then the audio; errors after it began are its `error` event; hanging up while queued cancels the ticket."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator

import pytest
from tests.conftest import API_SEED, API_TEXT, enrol_voice

SSE_BODY = {
    "model": "tts-1",
    "voice": "alice",
    "input": API_TEXT,
    "response_format": "pcm",
    "stream_format": "sse",
    "seed": API_SEED,
}


@pytest.fixture(scope="module")
def server(start_api_server, prompt_wav_bytes):
    live = start_api_server(concurrency=1, queue_size=3)
    with live.client() as client:
        enrol_voice(client, "alice", prompt_wav_bytes)
    yield live
    live.stop()


def events(lines: Iterator[str]) -> Iterator[tuple[str | None, dict]]:
    """(event name or None, its JSON data) for each SSE event read from `lines`."""
    name, data = None, []
    for line in lines:
        if line.startswith("event: "):
            name = line[len("event: ") :]
        elif line.startswith("data: "):
            data.append(line[len("data: ") :])
        elif not line and data:
            yield name, json.loads("\n".join(data))
            name, data = None, []


def block(server, running: bool = True) -> tuple[threading.Event, object]:
    """A ticket that holds the engine slot (`running`: once it does; else it waits for it) until its
    event is set."""
    release = threading.Event()
    ticket = server.service.scheduler.submit(lambda ctx: release.wait(60))
    if running:
        wait_for(lambda: ticket.state == "running")
    return release, ticket


def wait_for(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def the_stream_ticket(server, blockers: list):
    """The one ticket that is not a blocker: the SSE request's."""
    others = [t for t in list(server.service.scheduler._active.values()) if t not in blockers]
    assert len(others) == 1 and others[0].state == "queued", (others, blockers)
    return others[0]


def test_a_waiting_stream_reports_its_place_as_it_moves_then_the_audio(server) -> None:
    for _ in range(30):  # units of about 5 s measured (the enrolment alone may have been quick): an ETA
        server.service.scheduler._slots.times.observe("interactive", 5.0)
    first, running = block(server)
    second, waiting = block(server, running=False)
    try:
        with server.client() as http, http.stream("POST", "/v1/audio/speech", json=SSE_BODY) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            assert "x-cosyserve-seed" not in response.headers  # not known yet: the done event has it
            read = events(response.iter_lines())
            name, queued = next(read)
            assert name == "queued" and queued["type"] == "queued"
            assert queued["position"] == queued["ahead"] == 1 and queued["eta_s"] > 0
            first.set()  # the other waiting ticket starts: this one is next
            while queued["position"] != 0:
                name, queued = next(read)
                assert name == "queued", queued
            assert queued["ahead"] == 0
            second.set()
            rest = list(read)
    finally:
        first.set(), second.set()
        running.wait(30), waiting.wait(30)
    kinds = [data["type"] for _, data in rest]
    assert set(kinds[:-1]) <= {"queued", "speech.audio.delta"} and "speech.audio.delta" in kinds
    done = rest[-1][1]
    assert done["type"] == "speech.audio.done" and done["seed"] == API_SEED and done["saved"]
    deltas = [data["audio"] for _, data in rest if data["type"] == "speech.audio.delta"]
    pcm = b"".join(base64.b64decode(audio) for audio in deltas)
    assert len(pcm) / 2 / 24000 == pytest.approx(done["duration_s"], abs=1e-3)


def test_an_error_while_queued_arrives_as_the_streams_error_event(server) -> None:
    release, blocker = block(server)
    try:
        with server.client() as http, http.stream("POST", "/v1/audio/speech", json=SSE_BODY) as response:
            assert response.status_code == 200
            read = events(response.iter_lines())
            assert next(read)[0] == "queued"
            the_stream_ticket(server, [blocker]).cancel("the operator cancelled it")
            rest = list(read)
    finally:
        release.set()
        blocker.wait(30)
    error = rest[-1][1]
    assert error["type"] == "error" and error["error"]["code"] == "cancelled"
    assert "the operator cancelled it" in error["error"]["message"]


def test_hanging_up_while_queued_cancels_the_ticket(server) -> None:
    stats = server.service.scheduler.stats
    release, blocker = block(server)
    try:
        before = stats()["finished"]["cancelled"]
        with server.client() as http, http.stream("POST", "/v1/audio/speech", json=SSE_BODY) as response:
            read = events(response.iter_lines())  # kept: a dropped reader may close the connection
            assert next(read)[0] == "queued"
            ticket = the_stream_ticket(server, [blocker])
        wait_for(lambda: ticket.state == "cancelled")
        assert stats()["finished"]["cancelled"] == before + 1 and stats()["queued"] == 0
        assert blocker.state == "running"  # the work ahead was not touched
    finally:
        release.set()
        blocker.wait(30)


def test_refusals_before_the_stream_stay_json_errors(server) -> None:
    release, blocker = block(server)
    waiting = [server.service.scheduler.submit(lambda ctx: release.wait(60)) for _ in range(3)]
    try:
        with server.client() as http:
            bad = http.post("/v1/audio/speech", json={**SSE_BODY, "speed": 3.0})
            assert bad.status_code == 400 and bad.json()["error"]["code"]
            full = http.post("/v1/audio/speech", json=SSE_BODY)
            assert full.status_code == 429 and int(full.headers["retry-after"]) >= 1
            assert full.json()["error"]["code"] == "queue_full"
    finally:
        release.set()
        for ticket in [blocker, *waiting]:
            ticket.wait(30)


def test_a_stream_that_starts_at_once_keeps_its_headers(server) -> None:
    with server.client() as http, http.stream("POST", "/v1/audio/speech", json=SSE_BODY) as response:
        assert response.headers["x-cosyserve-seed"] == str(API_SEED)
        kinds = [data["type"] for _, data in events(response.iter_lines())]
    assert "queued" not in kinds and kinds[-1] == "speech.audio.done"
