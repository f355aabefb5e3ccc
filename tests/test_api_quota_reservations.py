"""Issue 25 over HTTP: every path that makes audio for a key reserves its estimate first. Concurrent
requests against a 10 s quota are charged at most 10 s plus one request's length; requests, jobs,
batches, dubs, OpenAI speech and previews whose estimate does not fit are refused with 429
`quota_exceeded` before any work; what a job holds is given back when it ends."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from conftest import enrol_voice

TEXT = "第一句话说得很长很长。"  # about 2.9 s reserved in alice's pace
SEED = 4  # the demo model's 2.3 s for TEXT: within its estimate
TERMINAL = ("done", "failed", "cancelled")


@pytest.fixture(scope="module")
def server(start_api_server, prompt_wav_bytes):
    live = start_api_server(api_keys_required=True, queue_size=64, rate_limit_per_minute=0)
    live.admin_key = live.service.keys.create("ops", "admin")[1]
    with as_key(live, live.admin_key) as admin:
        enrol_voice(admin, "alice", prompt_wav_bytes)
    yield live
    live.stop()


def as_key(server, key: str) -> httpx.Client:
    return server.client(headers={"Authorization": f"Bearer {key}"})


def quota_of(client: httpx.Client) -> dict:
    return client.get("/v1/me").json()["quota"]


def settled(client: httpx.Client, timeout_s: float = 30.0) -> dict:
    """The key's quota once nothing is held any more (streams settle after their last chunk)."""
    deadline = time.monotonic() + timeout_s
    while (quota := quota_of(client))["reserved_s"] > 0:
        assert time.monotonic() < deadline, quota
        time.sleep(0.05)
    return quota


@pytest.mark.parametrize("requests", [10, 50])
def test_concurrent_requests_are_charged_at_most_the_quota_plus_one_request(server, requests) -> None:
    _, key = server.service.keys.create(f"burst-{requests}", "user", quota=10.0)
    barrier = threading.Barrier(requests)
    answers: list[httpx.Response] = []

    def request(number: int) -> None:
        with as_key(server, key) as client:
            barrier.wait()
            if number % 2:
                body = {"text": TEXT, "voice": "alice", "seed": SEED}
                answers.append(client.post("/v1/tts", json=body))
            else:
                body = {"input": TEXT, "voice": "alice", "seed": SEED, "response_format": "wav"}
                answers.append(client.post("/v1/audio/speech", json={**body, "model": "cosyvoice"}))

    threads = [threading.Thread(target=request, args=(n,)) for n in range(requests)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    made = [float(a.headers["x-cosyserve-duration"]) for a in answers if a.status_code == 200]
    refused = [a for a in answers if a.status_code != 200]
    assert made and refused and len(made) + len(refused) == requests
    assert {(a.status_code, a.json()["error"]["code"]) for a in refused} == {(429, "quota_exceeded")}
    with as_key(server, key) as client:
        quota = settled(client)
    assert quota["used_s"] == pytest.approx(sum(made), abs=0.01)  # charged for exactly what was made
    assert quota["used_s"] <= 10.0 + max(made)  # without reservations: all of them, 4-14x the quota


def test_a_streamed_request_settles_its_reservation(server) -> None:
    _, key = server.service.keys.create("streamer", "user", quota=10.0)
    with as_key(server, key) as client:
        body = {"text": TEXT, "voice": "alice", "seed": SEED, "stream": True, "format": "pcm"}
        with client.stream("POST", "/v1/tts", json=body) as response:
            assert response.status_code == 200
            audio = response.read()
        quota = settled(client)
    rate = int(response.headers.get("x-cosyserve-sample-rate") or 24000)
    assert quota["used_s"] == pytest.approx(len(audio) / 2 / rate, abs=0.05)


def test_every_path_refuses_what_does_not_fit_before_any_work(server) -> None:
    _, key = server.service.keys.create("small", "user", quota=2.0)
    subtitles = "1\n00:00:00,000 --> 00:00:01,000\n你好。\n\n2\n00:00:05,000 --> 00:00:06,000\n再见。\n"
    with as_key(server, key) as client:
        calls = {
            "tts": lambda: client.post("/v1/tts", json={"text": TEXT, "voice": "alice"}),
            "openai": lambda: client.post(
                "/v1/audio/speech", json={"model": "cosyvoice", "input": TEXT, "voice": "alice"}
            ),
            "preview": lambda: client.get("/v1/voices/alice/preview", params={"text": TEXT}),
            "job": lambda: client.post("/v1/jobs", json={"text": TEXT * 3, "voice": "alice"}),
            "batch": lambda: client.post("/v1/batches", json={"voice": "alice", "items": [{"text": TEXT}]}),
            "dub (a 6 s track)": lambda: client.post(
                "/v1/dub", json={"voice": "alice", "subtitles": subtitles}
            ),
        }
        for path, call in calls.items():
            answer = call()
            assert answer.status_code == 429, (path, answer.text)
            error = answer.json()["error"]
            assert error["code"] == "quota_exceeded" and "2.0 s left" in error["message"], (path, error)
        quota = quota_of(client)
    assert quota["used_s"] == 0.0 and quota["reserved_s"] == 0.0  # nothing was made, nothing is held


def test_a_job_holds_its_estimate_until_it_ends(server) -> None:
    _, key = server.service.keys.create("jobs", "user", quota=10.0)
    scheduler = server.service.scheduler
    with as_key(server, key) as client:
        gate = threading.Event()
        blocker = scheduler.submit(lambda ctx: gate.wait(30))  # keeps the job queued while we look
        try:
            job = client.post("/v1/jobs", json={"text": TEXT * 3, "voice": "alice", "seed": SEED}).json()
            held = quota_of(client)["reserved_s"]
            assert 7.0 < held <= 10.0  # the whole text's estimate, from submit on
            second = client.post("/v1/jobs", json={"text": TEXT, "voice": "alice"})
            assert second.status_code == 429 and "reserved by requests and jobs" in second.text
            # it fits once the key's own job has ended: a retry soon may pass, not one after midnight
            assert (second.headers["retry-after"], second.headers["x-should-retry"]) == ("5", "true")
            assert client.delete(f"/v1/jobs/{job['id']}").status_code == 202
            assert quota_of(client)["reserved_s"] == 0.0  # a cancelled job gives it back at once
        finally:
            gate.set()
            blocker.wait(30)
        job = client.post("/v1/jobs", json={"text": TEXT * 2, "voice": "alice", "seed": SEED}).json()
        deadline = time.monotonic() + 60
        while (job := client.get(f"/v1/jobs/{job['id']}").json())["state"] not in ("done", "failed"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert job["state"] == "done", job
        quota = settled(client)
    assert quota["used_s"] == pytest.approx(job["duration_s"], abs=0.01)  # charged per segment, once


def test_a_batch_holds_the_sum_of_its_items(server) -> None:
    _, key = server.service.keys.create("batches", "user", quota=10.0)
    with as_key(server, key) as client:
        items = [{"text": "你好，世界。", "seed": SEED}] * 3  # about 1.5 s each in alice's pace
        response = client.post("/v1/batches", json={"voice": "alice", "items": items})
        assert response.status_code == 202, response.text
        batch = response.json()
        too_many = client.post("/v1/batches", json={"voice": "alice", "items": [{"text": TEXT}] * 2})
        assert too_many.status_code == 429  # 4.4 s held by the first, 5.9 s more do not fit in 10
        deadline = time.monotonic() + 60
        while (batch := client.get(f"/v1/batches/{batch['id']}").json())["state"] not in ("done", "failed"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        quota = settled(client)
    assert batch["state"] == "done", batch
    assert quota["used_s"] == pytest.approx(sum(item["duration_s"] for item in batch["items"]), abs=0.01)


def test_the_web_ui_reserves_like_the_api(server, tmp_path) -> None:
    from cosyserve.service.access.principals import Principal, QuotaExceeded
    from cosyserve.service.requests import SynthesisRequest
    from cosyserve.ui.bridge import BatchBridge, UiBridge

    record, _ = server.service.keys.create("ui-user", "user", quota=4.0)
    principal = Principal("key", "user", key=record, name=record.name)
    bridge = UiBridge(server.service)
    request = SynthesisRequest(text=TEXT, voice="alice", seed=SEED)
    ticket = bridge.submit(principal, request, mode="voice", request_id="ui-1")
    with pytest.raises(QuotaExceeded, match="reserved by requests and jobs"):  # 2.9 s held, 2.9 more: no
        bridge.submit(principal, request, mode="voice", request_id="ui-2")
    outcome = ticket.result(60)
    script = tmp_path / "script.txt"
    script.write_text(f"{TEXT}\n", encoding="utf-8")
    with pytest.raises(QuotaExceeded):  # what the first made and one more line do not fit
        BatchBridge(bridge).submit(
            principal, script, voice="alice", instruct=None, fmt="wav", max_speed=1.25, request_id="ui-3"
        )
    status = server.service.access.quota.check(record)
    assert status.used_s == pytest.approx(outcome.duration_s) and status.reserved_s == 0.0


def test_requests_waiting_when_the_quota_is_lowered_below_the_usage_do_not_start(server) -> None:
    """A request admitted under the old quota used to run (and be charged) once its turn came, however far
    an admin had lowered the quota meanwhile (a job made and was charged its first segment); now each ends
    with quota_exceeded as it starts, as batch items stop by the quota in force, nothing made or charged."""
    record, key = server.service.keys.create("lowered", "user", quota=60.0)
    release, answers = threading.Event(), []

    def ask(path: str, body: dict) -> None:
        with as_key(server, key) as client:
            answers.append(client.post(path, json=body))

    with as_key(server, key) as client, as_key(server, server.admin_key) as admin:
        assert client.post("/v1/tts", json={"text": TEXT, "voice": "alice", "seed": SEED}).status_code == 200
        used = settled(client)["used_s"]
        blocker = server.service.scheduler.submit(lambda ctx: release.wait(60))
        asking = [
            threading.Thread(target=ask, args=("/v1/tts", {"text": TEXT, "voice": "alice", "stream": True})),
            threading.Thread(target=ask, args=("/v1/audio/speech", {"input": TEXT, "voice": "alice"})),
        ]
        try:
            for thread in asking:
                thread.start()
            deadline = time.monotonic() + 60
            while server.service.scheduler.stats()["queued"] < 2:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            job = client.post("/v1/jobs", json={"text": TEXT, "voice": "alice"})
            assert job.status_code == 202, job.text
            assert quota_of(client)["reserved_s"] > 0  # all three were admitted under 60 s
            lowered = admin.patch(f"/admin/keys/{record.id}", json={"daily_audio_seconds_quota": 1})
            assert lowered.status_code == 200, lowered.text
        finally:
            release.set()
            blocker.wait(30)
            for thread in asking:
                thread.join(60)
        job_id, deadline = job.json()["id"], time.monotonic() + 60
        while (ended := client.get(f"/v1/jobs/{job_id}").json())["state"] not in TERMINAL:
            assert time.monotonic() < deadline, ended
            time.sleep(0.05)
        quota = settled(client)
    assert ended["state"] == "failed" and ended["error"]["code"] == "quota_exceeded", ended
    assert "while the job waited: nothing was made" in ended["error"]["message"]
    assert [(a.status_code, a.json()["error"]["code"]) for a in answers] == [(429, "quota_exceeded")] * 2
    assert "used up" in answers[0].json()["error"]["message"] and answers[0].headers.get("retry-after")
    assert quota["used_s"] == pytest.approx(used) and quota["reserved_s"] == 0.0


def test_the_early_refusal_says_soon_when_only_the_keys_own_work_holds_the_rest(server) -> None:
    record, key = server.service.keys.create("held-early", "user", quota=10.0)
    quota = server.service.access.quota
    held = quota.reserve(record, 10.0)  # its own work in flight holds the whole day
    with as_key(server, key) as client:
        soon = client.post("/v1/jobs", json={"text": TEXT, "voice": "alice"})
        assert soon.status_code == 429 and "held by this key's work in flight" in soon.text
        assert (soon.headers["retry-after"], soon.headers["x-should-retry"]) == ("5", "true")
        quota.settle(held, record, 10.0)  # it made its 10 s: now the day is spent
        spent = client.post("/v1/jobs", json={"text": TEXT, "voice": "alice"})
        assert spent.status_code == 429 and "resets at 00:00 UTC" in spent.text
        assert spent.headers["x-should-retry"] == "false" and int(spent.headers["retry-after"]) >= 1
