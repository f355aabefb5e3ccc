"""A long-text job tells the scheduler its segments (the units it gives the engine back after), not its
pieces: the wait estimates of the work queued behind it count every segment."""

from __future__ import annotations

import threading
import time

import pytest
from tests.conftest import enrol_voice

from cosyserve.frontend.text.split import split_long_text
from cosyserve.service.requests import EVERY_VOICE, SynthesisRequest

SENTENCE = ("今天天气很好我们一起去公园散步" * 5)[:64] + "。"  # 65 characters: one segment each
TEXT = SENTENCE * 6  # max_text_chars 200: two pieces of three sentences, six segments


@pytest.fixture(scope="module")
def server(start_api_server, prompt_wav_bytes):
    live = start_api_server(concurrency=1, background_running=1, max_text_chars=200)
    with live.client() as client:
        enrol_voice(client, "alice", prompt_wav_bytes)
    yield live
    live.stop()


def wait_for(predicate, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.1)


def test_a_job_counts_its_segments_as_units_and_the_next_ones_wait_for_all_of_them(server) -> None:
    scheduler = server.service.scheduler
    release = threading.Event()
    blocker = scheduler.submit(lambda ctx: release.wait(120))  # holds the only slot: the jobs wait
    try:
        with server.client() as client:
            first = client.post("/v1/jobs", json={"text": TEXT, "voice": "alice", "seed": 1}).json()
            second = client.post("/v1/jobs", json={"text": "短的。", "voice": "alice", "seed": 1}).json()
            tickets = [scheduler.get(job["id"]) for job in (first, second)]
            units = scheduler._slots.units[tickets[0]]  # what the runner told the scheduler
            assert len(split_long_text(TEXT, 200)) == 2 and units == 6
            # one background ticket at a time: the second starts once every unit of the first ended
            behind = scheduler.estimated_wait_s(tickets[1]) - scheduler.estimated_wait_s(tickets[0])
            unit_s = scheduler._slots.times.unit_s("background")
            assert behind == pytest.approx(units * unit_s, rel=0.05, abs=0.2), (behind, unit_s)
            release.set()
            wait_for(lambda: client.get(f"/v1/jobs/{first['id']}").json()["state"] == "done")
            done = client.get(f"/v1/jobs/{first['id']}").json()
            manifest = client.get(f"/v1/outputs/{done['output_id']}/manifest").json()
        assert len(manifest["sentences"]) == units  # the segments it ran
    finally:
        release.set()
        blocker.wait(30)


def test_counting_a_long_jobs_segments_is_cheap(server) -> None:
    """The count runs at submit, on the request's thread: text preparation only, no engine."""
    synth = server.service.model.loaded
    jobs = server.service.backend.job_runner
    text = SENTENCE * 150  # about 10,000 characters: the longest job text the default limits allow
    pieces = split_long_text(text, 200)
    request = SynthesisRequest(text=text, voice="alice")
    began = time.perf_counter()
    units = jobs._segment_count(request, pieces, EVERY_VOICE)
    assert units == 150 and synth is not None
    assert time.perf_counter() - began < 5.0
