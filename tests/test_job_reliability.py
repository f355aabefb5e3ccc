"""Issue 16 for jobs, over HTTP: quotas that hold (reserved at submit, charged per segment or item, a job
stopped at the quota keeps its finished part), timeouts per segment apart from the request timeout,
storage failures that never end `done`, and texts with nothing to speak refused at submit."""

from __future__ import annotations

import io
import time
from datetime import timedelta

import httpx
import pytest
import soundfile as sf

from conftest import LONG_TEXT, enrol_voice
from test_api_storage_full import full_disk  # noqa: F401  (fixture: a full tmpfs as the output directory)

TERMINAL = {"done", "failed", "cancelled"}
SENTENCES = "第一句话。第二句话。第三句话。第四句话。第五句话。第六句话。"


@pytest.fixture(scope="module")
def server(start_api_server, prompt_wav_bytes):
    live = start_api_server(max_text_chars=40, request_timeout_s=1.5, api_keys_required=True)
    live.admin_key = live.service.keys.create("ops", "admin")[1]
    with as_key(live, live.admin_key) as admin:
        enrol_voice(admin, "alice", prompt_wav_bytes)
    yield live
    live.stop()


def as_key(server, key: str) -> httpx.Client:
    return server.client(headers={"Authorization": f"Bearer {key}"})


def wait(client, path: str, timeout: float = 120.0) -> dict:
    """Poll until the job or batch ends, within the key's rate limit (60 a minute: a job running longer
    than the polls it may make waits out its 429s instead of failing on them)."""
    deadline = time.monotonic() + timeout
    while True:
        response = client.get(path)
        assert time.monotonic() < deadline, response.text
        if response.status_code == 429:
            time.sleep(float(response.headers.get("retry-after", 1)))
            continue
        if (body := response.json())["state"] in TERMINAL:
            return body
        time.sleep(0.25)


def underestimate(monkeypatch, seconds: float) -> None:
    """Every text is estimated at `seconds` (speech that outruns its estimate: the quota stops it)."""
    monkeypatch.setattr("cosyserve.service.reservations.request_estimate_s", lambda *_a, **_k: seconds)


def test_a_job_that_outruns_its_estimate_stops_at_the_quota(server, monkeypatch) -> None:
    underestimate(monkeypatch, 0.5)
    _, key = server.service.keys.create("one-second", "user", quota=1.0)
    with as_key(server, key) as client:
        job = client.post("/v1/jobs", json={"text": SENTENCES * 2, "voice": "alice", "seed": 3}).json()
        final = wait(client, f"/v1/jobs/{job['id']}")
        assert final["state"] == "failed" and final["error"]["code"] == "quota_exceeded", final
        assert final["partial"] and final["result_url"]  # what it finished is kept and downloadable
        audio, rate = sf.read(io.BytesIO(httpx.get(client.base_url.join(final["result_url"])).content))
        used = client.get("/v1/me").json()["quota"]["used_s"]
        assert used >= 1.0 and abs(used - len(audio) / rate) < 0.01  # charged for exactly what it made
        manifest = client.get(f"/v1/outputs/{final['output_id']}/manifest").json()
        assert len(manifest["sentences"]) == 1  # it stopped after the segment that crossed the quota
        refused = client.post("/v1/jobs", json={"text": "再来一句。", "voice": "alice"})
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "quota_exceeded"


def test_a_job_whose_estimate_exceeds_the_quota_is_refused_at_submit(server) -> None:
    _, key = server.service.keys.create("ten-seconds", "user", quota=10.0)
    with as_key(server, key) as client:
        refused = client.post("/v1/jobs", json={"text": LONG_TEXT * 2, "voice": "alice"})  # ~40 s estimated
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "quota_exceeded"
        assert "10.0 s left" in refused.json()["error"]["message"]
        quota = client.get("/v1/me").json()["quota"]
        assert quota["used_s"] == 0.0 and quota["reserved_s"] == 0.0  # nothing was made or held for it


def test_a_batch_is_charged_per_item_and_stops_at_the_quota(server, monkeypatch) -> None:
    underestimate(monkeypatch, 0.1)
    _, key = server.service.keys.create("two-seconds", "user", quota=2.0)
    with as_key(server, key) as client:
        lines = "\n".join(f"第{n}句话。" for n in range(1, 11))
        response = client.post(
            "/v1/batches",
            content=lines.encode(),
            params={"voice": "alice"},
            headers={"content-type": "text/plain"},
        )
        assert response.status_code == 202, response.text
        batch = wait(client, f"/v1/batches/{response.json()['id']}")
        assert batch["state"] == "failed" and batch["error"]["code"] == "quota_exceeded", batch
        done = [item for item in batch["items"] if item["state"] == "done"]
        rest = [item for item in batch["items"] if item["state"] == "cancelled"]
        assert done and rest and len(done) + len(rest) == 10
        assert {item["error"]["code"] for item in rest} == {"quota_exceeded"}
        used = client.get("/v1/me").json()["quota"]["used_s"]
        assert used == pytest.approx(sum(item["duration_s"] for item in done), abs=0.01)
        assert client.get(batch["archive_url"]).status_code == 200  # the finished part downloads


def test_a_dub_is_reserved_and_charged_its_tracks_length(server) -> None:
    """The audio a dub's caller receives is its track (silence included), not the speech made: that is
    what it sets aside at submit and what the key is charged, a cue that failed included."""
    _, key = server.service.keys.create("dubber", "user", quota=100.0)
    srt = (
        "1\n00:00:01,000 --> 00:00:02,000\n第一句话。\n\n"
        "2\n00:00:05,000 --> 00:00:06,000\n" + "太长" * 30 + "\n\n"  # too long: fails alone
        "3\n00:00:20,000 --> 00:00:21,000\n第三句话。\n"
    )
    with as_key(server, key) as client:
        response = client.post("/v1/dub", data={"voice": "alice"}, files={"file": ("a.srt", srt.encode())})
        assert response.status_code == 202, response.text
        dub_id = response.json()["id"]
        assert server.service.jobs.get(dub_id).reserved_s == 21.0
        dub = wait(client, f"/v1/dub/{dub_id}")
        assert dub["state"] == "done" and (dub["done"], dub["failed"]) == (2, 1), dub
        used = client.get("/v1/me").json()["quota"]["used_s"]
        assert used == pytest.approx(21.0, abs=0.01)
        assert dub["charged_s"] == pytest.approx(21.0, abs=0.01) and dub["duration_s"] == pytest.approx(21.0)
        report = client.get(f"/v1/dub/{dub_id}/report").json()
        assert report["track_s"] == 21.0 and report["charged_s"] == pytest.approx(21.0, abs=0.01)
        assert server.service.jobs.get(dub_id).result_extra["charged_s"] == pytest.approx(21.0, abs=0.01)


def test_a_dub_longer_than_the_quota_left_is_refused_before_any_work(server) -> None:
    """A dub reserves its whole track (what the caller receives and is charged): one that does not fit is
    refused at submit, saying what it needs, and nothing is used or held."""
    _, key = server.service.keys.create("three-seconds", "user", quota=3.0)
    srt = "".join(
        f"{n}\n00:00:{a:02d},000 --> 00:00:{a + 1:02d},000\n第{n}句话。\n\n"
        for n, a in ((1, 1), (2, 5), (3, 20))
    )
    with as_key(server, key) as client:
        response = client.post("/v1/dub", data={"voice": "alice"}, files={"file": ("a.srt", srt.encode())})
        assert response.status_code == 429 and response.json()["error"]["code"] == "quota_exceeded"
        assert "21.0 s" in response.json()["error"]["message"]  # the track runs to the last cue's end
        quota = client.get("/v1/me").json()["quota"]
        assert quota["used_s"] == 0 and quota["reserved_s"] == 0


def test_jobs_have_their_own_timeout_per_segment(
    server, start_api_server, prompt_wav_bytes, monkeypatch
) -> None:
    # A request timeout far below what 18 segments take on any machine (each runs all three networks), so
    # the job certainly outlives it; how fast this CPU is does not matter.
    monkeypatch.setattr(server.service.scheduler, "request_timeout_s", 0.05)
    with as_key(server, server.admin_key) as client:
        started = time.monotonic()
        job = client.post("/v1/jobs", json={"text": SENTENCES * 3, "voice": "alice", "seed": 5}).json()
        final = wait(client, f"/v1/jobs/{job['id']}")
        elapsed = time.monotonic() - started
        assert final["state"] == "done", final
        assert elapsed > 0.05  # longer than the request timeout, and still done
        interactive = client.post("/v1/tts", json={"text": SENTENCES[:30], "voice": "alice"})
        assert interactive.status_code == 504  # the request timeout was in force all along
    monkeypatch.undo()
    # A segment has 2 ms: less than any segment takes (the tiny model's three networks take tens of ms
    # even on a fast CPU), so every segment runs out of time, each on its own clock.
    hasty = start_api_server(max_text_chars=40, job_segment_timeout_s=0.002)
    with hasty.client() as client:
        enrol_voice(client, "alice", prompt_wav_bytes)
        job = client.post("/v1/jobs", json={"text": SENTENCES, "voice": "alice"}).json()
        final = wait(client, f"/v1/jobs/{job['id']}")
        items = {"voice": "alice", "items": ["第一句话。", "第二句话。", "第三句话。"]}
        batch = wait(client, f"/v1/batches/{client.post('/v1/batches', json=items).json()['id']}")
    hasty.stop()
    assert final["state"] == "failed" and final["error"]["code"] == "timeout", final
    assert "job_segment_timeout_s" in final["error"]["message"]
    # each item has its own time: every one of them ran and failed alone (the batch went on after the
    # first), none was charged to another's clock
    codes = [(item["error"] or {}).get("code", "done") for item in batch["items"]]
    assert codes == ["timeout"] * 3, batch


def test_a_result_that_cannot_be_saved_fails_with_storage_error(server, monkeypatch) -> None:
    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(server.service.outputs, "save", disk_full)
    with as_key(server, server.admin_key) as client:
        job = client.post("/v1/jobs", json={"text": "第一句话。", "voice": "alice"}).json()
        final = wait(client, f"/v1/jobs/{job['id']}")
        assert (final["state"], final["error"]["code"], final["result_url"]) == (
            "failed",
            "storage_error",
            None,
        )
        batch = client.post("/v1/batches", json={"voice": "alice", "items": ["第一句。", "第二句。"]}).json()
        final = wait(client, f"/v1/batches/{batch['id']}")
        assert final["state"] == "failed" and final["archive_url"] is None
        assert {item["error"]["code"] for item in final["items"]} == {"storage_error"}


def test_a_long_texts_kept_pieces_give_their_room_to_its_result(server, monkeypatch) -> None:
    """Its pieces (float32, twice the result's bytes) filled the disk the result was to be saved on: the
    work was thrown away while deleting them would have made room."""
    save, calls = server.service.outputs.save, []

    def full_until_the_pieces_go(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise OSError(28, "No space left on device")
        return save(*args, **kwargs)

    monkeypatch.setattr(server.service.outputs, "save", full_until_the_pieces_go)
    with as_key(server, server.admin_key) as client:
        job = client.post("/v1/jobs", json={"text": SENTENCES, "voice": "alice", "seed": 3}).json()
        final = wait(client, f"/v1/jobs/{job['id']}")
    assert final["state"] == "done" and len(calls) == 2, final
    assert not (server.service.outputs.root / ".job-pieces" / job["id"]).exists()


def test_a_job_that_cannot_save_its_result_is_counted_once(server, monkeypatch) -> None:
    """Saving, making room and saving again each counted: one failed job was three storage errors and
    twice its audio in the metrics."""

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(server.service.outputs, "save", disk_full)
    metrics = server.service.metrics
    errors = metrics.errors_total.labels(kind="storage_error")

    def observed() -> float:  # syntheses counted (the real-time factor's observations)
        samples = next(iter(metrics.real_time_factor.collect())).samples
        return next(sample.value for sample in samples if sample.name.endswith("_count"))

    before = errors._value.get(), observed()
    with as_key(server, server.admin_key) as client:
        job = client.post("/v1/jobs", json={"text": SENTENCES, "voice": "alice", "seed": 3}).json()
        final = wait(client, f"/v1/jobs/{job['id']}")
    assert (final["state"], final["error"]["code"]) == ("failed", "storage_error"), final
    assert errors._value.get() - before[0] == 1 and observed() - before[1] == 1


def test_a_dub_whose_track_cannot_be_written_is_charged_its_speech_not_the_track(server, monkeypatch) -> None:
    from cosyserve.service.local import batches

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(batches, "write_track", disk_full)
    _, key = server.service.keys.create("dubber", "user", quota=200.0)
    subtitles = "1\n00:00:00,000 --> 00:00:01,000\n你好。\n\n2\n00:01:30,000 --> 00:01:31,000\n再见。\n"
    with as_key(server, key) as client:
        dub = client.post("/v1/dub", json={"voice": "alice", "subtitles": subtitles}).json()
        final = wait(client, f"/v1/batches/{dub['id']}")
        used = client.get("/v1/me").json()["quota"]["used_s"]
    assert (final["state"], final["error"]["code"]) == ("failed", "storage_error"), final
    assert "91 s" in final["error"]["message"] and "MB free" in final["error"]["message"]
    speech = sum(item["duration_s"] or 0 for item in final["items"])
    assert used == pytest.approx(speech, abs=0.01) and 0 < used < 10  # not the 91 s track it never got


@pytest.mark.parametrize("text", ["。。。！！", "……！？" * 200])
def test_a_text_with_nothing_to_speak_is_refused_at_submit(server, text: str) -> None:
    with as_key(server, server.admin_key) as client:
        for path in ("/v1/tts", "/v1/jobs"):
            response = client.post(
                path, json={"text": text[:40] if path == "/v1/tts" else text, "voice": "alice"}
            )
            assert response.status_code == 400, (path, response.text)
            said = response.json()["error"]["message"]  # (and logged): the text's start, not all of it
            assert "nothing to speak" in said and len(said) < 200, said


def test_a_batch_uses_only_the_voices_its_key_may_use(server, prompt_wav_bytes) -> None:
    _, mine = server.service.keys.create("carol-app", "user")
    _, theirs = server.service.keys.create("dave-app", "user")
    with as_key(server, theirs) as dave:
        enrol_voice(dave, "dave-voice", prompt_wav_bytes)
    with as_key(server, mine) as carol:
        items = [{"text": "一。", "voice": "alice"}, {"text": "二。", "voice": "dave-voice"}]
        batch_id = carol.post("/v1/batches", json={"items": items}).json()["id"]
        batch = wait(carol, f"/v1/batches/{batch_id}")
    assert [item["state"] for item in batch["items"]] == ["done", "failed"]  # alice is shared
    assert "dave-voice" in batch["items"][1]["error"]["message"]


def test_jobs_on_a_full_disk_end_with_storage_error(
    start_api_server,
    prompt_wav_bytes,
    full_disk,  # noqa: F811  (the fixture imported above)
) -> None:
    live = start_api_server(output_dir=str(full_disk), min_free_mb=0, wait_ready=False)
    try:
        deadline = time.monotonic() + 60
        while live.service.model_state != "ready":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        with live.client() as client:
            enrol_voice(client, "alice", prompt_wav_bytes)
            job_id = client.post("/v1/jobs", json={"text": "一。", "voice": "alice"}).json()["id"]
            job = wait(client, f"/v1/jobs/{job_id}")
            assert (job["state"], job["error"]["code"]) == ("failed", "storage_error")
            assert "No space" in job["error"]["message"]
            assert client.get(f"/v1/jobs/{job['id']}/result").status_code == 409
            items = {"voice": "alice", "items": ["一。", "二。"]}
            batch_id = client.post("/v1/batches", json=items).json()["id"]
            batch = wait(client, f"/v1/batches/{batch_id}")
            assert (batch["state"], batch["error"]["code"]) == ("failed", "items_failed")
            assert {item["error"]["code"] for item in batch["items"]} == {"storage_error"}
    finally:
        live.stop()


def test_thresholds_that_leave_no_pace_range_are_refused_at_submit(server) -> None:
    """Accepted (202) and then failed, every item of a batch too (a team's run): the server's maximum pace
    ratio is 2, so a minimum of 3 leaves none."""
    with as_key(server, server.admin_key) as client:
        bad = {"min_pace_ratio": 3}
        job = client.post("/v1/jobs", json={"text": SENTENCES, "voice": "alice", "thresholds": bad})
        batch = client.post(
            "/v1/batches", json={"items": [{"text": "第一句。"}], "voice": "alice", "thresholds": bad}
        )
        for response in (job, batch):
            assert response.status_code == 400, response.text
            assert "min_pace_ratio 3 is above max_pace_ratio 2" in response.json()["error"]["message"]


def test_records_of_jobs_that_ended_long_ago_are_removed(server) -> None:
    """40,000 job records (their users' texts) were kept for ever while their audio went after 7 days."""
    import sqlalchemy as sa

    from cosyserve.service.stores.job_table import jobs_table

    jobs = server.service.jobs
    old, recent = jobs.create({"text": "去年的文字。"}), jobs.create({"text": "今天的。"})
    for job in (old, recent):
        jobs.finish_cancelled(job.id)
    days = server.service.settings.storage.job_retention_days
    with jobs.engine.begin() as conn:
        long_ago = old.created_at - timedelta(days=days + 1)
        conn.execute(sa.update(jobs_table).where(jobs_table.c.id == old.id).values(finished_at=long_ago))
    server.service._purge_old_jobs()  # what each retention pass does
    assert jobs.get(old.id) is None and jobs.get(recent.id) is not None
