"""Issue 32 (items 1, 2), over HTTP: work in flight keeps its footing. A job keeps the voice it was submitted
with (renamed, changed or deleted meanwhile), a voice in use cannot be deleted, a vanished voice is the
server's `voice_unavailable`, never the caller's `invalid_input`; a revoked key's streams, jobs and batches
stop at the next segment with `key_revoked` and nothing after the revoke is charged; a job stopped midway
keeps its finished segments; admins list, revoke and change keys.

The tests act between two segments of running work: `pause(key_id, n)` holds the key's work right after
its n-th passing key check (the start of a job counts one, then every finished segment or item)."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import threading
import time
from collections.abc import Callable
from types import SimpleNamespace

import httpx
import pytest
import soundfile as sf

from conftest import LONG_TEXT, enrol_voice
from cosyserve.service.access.key_watch import KeyWatch

TERMINAL = {"done", "failed", "cancelled"}
TEXT = "第一句话。第二句话。第三句话。第四句话。第五句话。第六句话。" * 4  # pieces of at most 40 characters


@pytest.fixture(scope="module")
def server(start_api_server, prompt_wav_bytes):
    live = start_api_server(max_text_chars=40, api_keys_required=True, rate_limit_per_minute=0)
    live.admin_key = live.service.keys.create("ops", "admin")[1]
    with as_key(live, live.admin_key) as admin:
        enrol_voice(admin, "alice", prompt_wav_bytes)  # shared
    yield live
    live.stop()


@pytest.fixture
def pause(monkeypatch):
    """`pause(key_id, n)` → (paused, go): the key's work waits after its n-th passing key check until `go`."""
    original = KeyWatch.check
    plans: dict[int, dict] = {}

    def check(self, voice_owners=(), **stage):
        key = original(self, voice_owners, **stage)
        plan = plans.get(self.key_id)
        if plan is not None:
            plan["count"] += 1
            if plan["count"] == plan["after"]:
                plan["paused"].set()
                plan["go"].wait(60)
        return key

    monkeypatch.setattr(KeyWatch, "check", check)

    def hold(key_id: int, after: int) -> tuple[threading.Event, threading.Event]:
        plans[key_id] = {"count": 0, "after": after, "paused": threading.Event(), "go": threading.Event()}
        return plans[key_id]["paused"], plans[key_id]["go"]

    yield hold
    for plan in plans.values():
        plan["go"].set()


def as_key(server, key: str) -> httpx.Client:
    return server.client(headers={"Authorization": f"Bearer {key}"})


def wait(client, path: str, timeout: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout
    while (body := client.get(path).json()).get("state") not in TERMINAL:
        assert time.monotonic() < deadline and "state" in body, body
        time.sleep(0.1)
    return body


def seconds_of(client, url: str) -> float:
    audio, rate = sf.read(io.BytesIO(httpx.get(client.base_url.join(url)).content))
    return len(audio) / rate


# -- item 1: voices --------------------------------------------------------------------------------------


def test_renaming_or_deleting_a_voice_leaves_its_running_job_alone(server, pause, prompt_wav_bytes) -> None:
    key, secret = server.service.keys.create("bob-app", "user")
    with as_key(server, secret) as bob:
        enrol_voice(bob, "bob-voice", prompt_wav_bytes)
        paused, go = pause(key.id, 2)  # the job started and made its first segment
        job = bob.post("/v1/jobs", json={"text": TEXT, "voice": "bob-voice", "seed": 3}).json()
        assert paused.wait(60)
        renamed = bob.patch("/v1/voices/bob-voice", json={"name": "bobby", "transcript": "别的文字。"})
        assert renamed.status_code == 200 and renamed.json()["name"] == "bobby"
        refused = bob.delete("/v1/voices/bobby")
        assert refused.status_code == 409, refused.text
        assert (
            refused.json()["error"]["code"] == "voice_in_use"
            and job["id"] in refused.json()["error"]["message"]
        )
        go.set()
        final = wait(bob, f"/v1/jobs/{job['id']}")
        assert final["state"] == "done" and final["partial"] is None and final["error"] is None, final
        assert "voice_snapshots" not in final["params"] and final["params"]["voice"] == "bob-voice"
        assert bob.delete("/v1/voices/bobby").status_code == 204  # no longer in use


def test_a_voice_in_use_by_someone_elses_job_is_not_named_to_its_owner(
    server, pause, prompt_wav_bytes
) -> None:
    """The owner is told to wait, not to cancel a job it cannot see (its DELETE answered 404)."""
    _key, secret = server.service.keys.create("dana-app", "user")
    ops, ops_secret = server.service.keys.create("ops-in-use", "admin")
    with as_key(server, secret) as dana, as_key(server, ops_secret) as admin:
        voice = enrol_voice(dana, "dana-voice", prompt_wav_bytes)["id"]
        paused, go = pause(ops.id, 2)
        try:
            job = admin.post("/v1/jobs", json={"text": TEXT, "voice": voice, "seed": 3}).json()
            assert paused.wait(60)
            refused = dana.delete(f"/v1/voices/{voice}")
            message = refused.json()["error"]["message"]
            assert refused.status_code == 409 and job["id"] not in message, message
            assert "1 of other users'" in message and "DELETE" not in message
            assert job["id"] in admin.delete(f"/v1/voices/{voice}").json()["error"]["message"]
        finally:
            go.set()
        wait(admin, f"/v1/jobs/{job['id']}")


def test_a_voice_deleted_out_of_band_fails_waiting_work_as_voice_unavailable(
    server, pause, prompt_wav_bytes
) -> None:
    blocker_key, blocker = server.service.keys.create("blocker", "user")
    _key, secret = server.service.keys.create("carol-app", "user")
    with as_key(server, blocker) as first, as_key(server, secret) as carol:
        enrol_voice(carol, "carol-voice", prompt_wav_bytes)
        enrol_voice(carol, "carol-two", prompt_wav_bytes)
        paused, go = pause(blocker_key.id, 1)  # holds the only worker: carol's work waits in the queue
        ahead = first.post("/v1/jobs", json={"text": "一。", "voice": "alice"}).json()
        assert paused.wait(60)
        job = carol.post("/v1/jobs", json={"text": "第一句话。", "voice": "carol-voice"}).json()
        items = [{"text": "一。", "voice": "carol-two"}, {"text": "二。", "voice": "alice"}]
        batch = carol.post("/v1/batches", json={"items": items}).json()
        server.service.voices.delete("carol-voice")  # behind the API's back (another tool, another node)
        server.service.voices.delete("carol-two")
        go.set()
        assert wait(first, f"/v1/jobs/{ahead['id']}")["state"] == "done"
        failed = wait(carol, f"/v1/jobs/{job['id']}")
        finished = wait(carol, f"/v1/batches/{batch['id']}")
    assert failed["state"] == "failed" and failed["error"]["code"] == "voice_unavailable", failed
    assert "carol-voice" in failed["error"]["message"] and "deleted" in failed["error"]["message"]
    assert [item["state"] for item in finished["items"]] == ["failed", "done"]
    assert finished["items"][0]["error"]["code"] == "voice_unavailable"


def test_a_running_job_keeps_its_pinned_voice_when_it_is_deleted_out_of_band(
    server, pause, prompt_wav_bytes
) -> None:
    key, secret = server.service.keys.create("dora-app", "user")
    with as_key(server, secret) as dora:
        enrol_voice(dora, "dora-voice", prompt_wav_bytes)
        paused, go = pause(key.id, 2)
        job = dora.post("/v1/jobs", json={"text": TEXT, "voice": "dora-voice"}).json()
        assert paused.wait(60)
        server.service.voices.delete("dora-voice")
        go.set()
        final = wait(dora, f"/v1/jobs/{job['id']}")
    assert final["state"] == "done", final


# -- item 2: keys ----------------------------------------------------------------------------------------


def test_a_revoked_keys_job_stops_at_the_next_segment_keeping_what_was_charged(server, pause, caplog) -> None:
    caplog.set_level("INFO", logger="cosyserve.activity")
    failed_before = _jobs_counted(server, "failed")
    key, secret = server.service.keys.create("revoked-job", "user")
    paused, go = pause(key.id, 2)  # its start, then its first segment
    with as_key(server, secret) as user, as_key(server, server.admin_key) as admin:
        job = user.post("/v1/jobs", json={"text": TEXT, "voice": "alice", "seed": 3}).json()
        assert paused.wait(60)
        revoked = admin.post(f"/admin/keys/{key.id}/revoke")
        assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
        assert user.get("/v1/me").status_code == 401  # its new requests: refused at once
        go.set()
        final = wait(admin, f"/v1/jobs/{job['id']}")
        assert final["state"] == "failed" and final["error"]["code"] == "key_revoked", final
        partial = final["partial"]
        assert partial["segments_done"] == partial["missing_from"] == 1 and partial["segments_total"] >= 3
        assert final["progress"] == pytest.approx(1 / partial["segments_total"], abs=1e-3)  # how far it got
        assert seconds_of(admin, final["result_url"]) == pytest.approx(partial["audio_s"], abs=0.01)
    # charged for its first segment, made before the revoke; nothing made after it
    assert server.service.access.quota.used(key.id) == pytest.approx(partial["audio_s"], abs=0.01)
    # the activity log and the metrics say how it ended (they said `job ok` and counted it done)
    lines = [
        r for r in caplog.records if r.name == "cosyserve.activity" and getattr(r, "job_id", 0) == job["id"]
    ]
    assert [r.result for r in lines] == ["key_revoked"], [r.getMessage() for r in lines]
    assert _jobs_counted(server, "failed") == failed_before + 1


def test_work_whose_key_was_revoked_before_it_started_says_nothing_was_made(server, pause) -> None:
    """A job and a batch revoked while they waited behind another key's job said "revoked while this work
    ran: ... the parts finished before are kept and charged", with nothing made or charged."""
    holder, holder_secret = server.service.keys.create("holder", "user")
    key, secret = server.service.keys.create("revoked-waiting", "user")
    paused, go = pause(holder.id, 1)  # the holder's job keeps the engine at its start
    with as_key(server, holder_secret) as other, as_key(server, secret) as user:
        held = other.post("/v1/jobs", json={"text": TEXT, "voice": "alice"}).json()
        assert paused.wait(60)
        job = user.post("/v1/jobs", json={"text": TEXT, "voice": "alice"}).json()
        batch = user.post("/v1/batches", json={"voice": "alice", "items": ["一。", "二。"]}).json()
        server.service.keys.revoke(key.id)
        go.set()
        with as_key(server, server.admin_key) as admin:
            ended = [wait(admin, f"/v1/jobs/{job['id']}"), wait(admin, f"/v1/batches/{batch['id']}")]
            assert wait(admin, f"/v1/jobs/{held['id']}")["state"] == "done"
    for final in ended:
        assert final["state"] == "failed" and final["error"]["code"] == "key_revoked", final
        assert "before this work started: nothing was made or charged" in final["error"]["message"], final
    assert server.service.access.quota.used(key.id) == 0


def _jobs_counted(server, state: str) -> float:
    return server.service.metrics.jobs_total.labels(state=state)._value.get()


@pytest.fixture
def roomy(start_api_server, prompt_wav_bytes):
    """A server whose one request of LONG_TEXT has two segments, with an admin key and a shared voice."""
    live = start_api_server(max_text_chars=200, api_keys_required=True, rate_limit_per_minute=0)
    live.admin_key = live.service.keys.create("ops", "admin")[1]
    with as_key(live, live.admin_key) as admin:
        enrol_voice(admin, "alice", prompt_wav_bytes)
    yield live
    live.stop()


def revoked_midway(server, key_id: int, pause, listen: Callable[[], None]) -> None:
    """`listen` (a client of the key's stream) in a thread; the key revoked after its work's first segment
    (the start's check, then that segment's), then the work let go on."""
    paused, go = pause(key_id, 2)
    listener = threading.Thread(target=listen)
    listener.start()
    try:
        assert paused.wait(60)
        with as_key(server, server.admin_key) as admin:
            assert admin.post(f"/admin/keys/{key_id}/revoke").status_code == 200
    finally:
        go.set()
        listener.join(60)


def test_a_revoked_keys_stream_stops_at_its_next_chunk_and_is_charged_what_it_was_sent(roomy, pause) -> None:
    """Checked only between segments, a revoked key's one-segment stream ran to its end and was charged
    nothing (a team's run: 55 s streamed after the revoke). The key is checked before every chunk: the
    stream stops at the next one, and the audio handed over before the revoke is charged, as a hang-up's."""
    key, secret = roomy.service.keys.create("revoked-stream", "user")
    events: list[dict] = []
    body = {
        "model": "tts-1",
        "voice": "alice",
        "input": LONG_TEXT,
        "stream_format": "sse",
        "response_format": "pcm",
    }

    def listen() -> None:
        with as_key(roomy, secret) as user, user.stream("POST", "/v1/audio/speech", json=body) as response:
            events.extend(json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: "))

    counted = roomy.service.metrics.audio_seconds_total
    before = counted._value.get()
    revoked_midway(roomy, key.id, pause, listen)  # revoked as its first chunk was about to be sent
    assert events and events[-1]["type"] == "error", events[-1:]
    assert events[-1]["error"]["code"] == "key_revoked" and events[-1]["error"]["status"] == 401
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    pcm = b"".join(base64.b64decode(e["audio"]) for e in deltas)
    received_s = len(pcm) / 2 / roomy.service.backend.model_info["sample_rate"]  # 16-bit PCM
    assert received_s > 0 and len(deltas) <= 2, len(deltas)  # that chunk, and none made after the revoke
    assert settled(roomy, key.id) == pytest.approx(received_s, abs=0.01)
    # the metrics count what was charged (they counted a hang-up's audio, not a revoke's)
    assert counted._value.get() - before == pytest.approx(received_s, abs=0.01)


def test_a_raw_stream_cut_off_by_a_revoke_is_logged_as_key_revoked(roomy, pause, caplog) -> None:
    """Starlette wraps an error raised once the response began ("Caught handled exception, but response
    already started"): it was logged and counted as an internal error (500), which would page someone."""
    caplog.set_level("INFO", logger="cosyserve.failures")
    key, secret = roomy.service.keys.create("revoked-raw", "user")
    body = {"text": LONG_TEXT, "voice": "alice", "stream": True, "format": "pcm"}
    received: list[bytes] = []

    def listen() -> None:
        cut_off = contextlib.suppress(httpx.HTTPError)  # a raw stream can only be cut off
        with as_key(roomy, secret) as user, cut_off, user.stream("POST", "/v1/tts", json=body) as response:
            received.extend(response.iter_bytes())

    revoked_midway(roomy, key.id, pause, listen)
    assert received  # the first segment's audio came before the cut
    failures = [r.getMessage() for r in caplog.records if r.name == "cosyserve.failures"]
    assert any("key_revoked" in line for line in failures), failures
    assert not any("already started" in line or "internal" in line for line in failures), failures


def settled(server, key_id: int, timeout: float = 60.0) -> float:
    """The key's usage once none of its work holds a reservation any more."""
    quota, deadline = server.service.access.quota, time.monotonic() + timeout
    while quota.reserved(key_id) > 0 or server.service.scheduler.stats()["running"]:
        assert time.monotonic() < deadline, "the key's work did not end"
        time.sleep(0.05)
    return quota.used(key_id)


def test_a_stream_left_early_is_charged_for_the_audio_it_was_sent(server) -> None:
    """Hanging up on a stream (or cancelling it) made all of its audio free, so a client could read every
    stream but its last chunk at no cost. Now it is charged for what it was sent; a whole one as before."""
    key, secret = server.service.keys.create("hang-up", "user")
    body = {"text": "第一句话。第二句话。第三句话。第四句话。", "voice": "alice", "stream": True,
            "format": "pcm", "seed": 7}  # fmt: skip
    rate = server.service.backend.model_info["sample_rate"]
    left = server.service.metrics.requests_total.labels(route="/v1/tts", status="499")
    left_before = left._value.get()
    with as_key(server, secret) as user:
        whole = user.post("/v1/tts", json=body)
        assert whole.status_code == 200, whole.text
        whole_s = len(whole.content) / 2 / rate
        assert settled(server, key.id) == pytest.approx(whole_s, abs=0.05)
        with user.stream("POST", "/v1/tts", json=body) as response:
            received = next(response.iter_bytes())  # the first chunk, then the client hangs up
    left_early = settled(server, key.id) - whole_s
    assert len(received) / 2 / rate - 0.01 <= left_early < whole_s, (left_early, whole_s)
    # counted and logged as left (499), as the README says: it was a 200, as if it had been read whole
    deadline = time.monotonic() + 30
    while left._value.get() < left_before + 1:
        assert time.monotonic() < deadline, "the hung-up stream was not counted as 499"
        time.sleep(0.05)


def test_a_stream_left_early_is_charged_what_its_reader_took_not_what_waited_in_its_buffer() -> None:
    """Chunks still in the ticket's buffer never reached the client: a hang-up was charged 7.5 s for 4.9 s
    received. The charge and the audio metric count the items the reader took."""
    from cosyserve.errors import Cancelled
    from cosyserve.service.local.key_guard import SentAudio
    from cosyserve.service.requests import OutputSpec

    taken = [0]
    sent = SentAudio(24000, lambda: taken[0])
    for number in (2, 3, 4, 5):  # the start was item 1; four 1-second chunks went into the buffer
        sent.handed(24000, number)
    taken[0] = 3  # the reader took the start and two chunks
    settled, counted = [], []
    spec = OutputSpec(key=SimpleNamespace(id=1))
    with pytest.raises(Cancelled), sent.charged_if_left(lambda s, seconds: settled.append(seconds), spec,
                                                        counted.append):  # fmt: skip
        raise Cancelled("the client hung up")
    assert settled == counted == [2.0] and sent.samples == 4 * 24000


def test_a_revoked_keys_waiting_request_gets_no_engine_time_and_no_audio(server) -> None:
    """Requests of a key revoked while they waited in the queue used to run once their turn came (a stream
    sent its whole audio before its error); now each ends with 401 key_revoked as it starts."""
    key, secret = server.service.keys.create("revoked-waiting", "user")
    release, answers = threading.Event(), []
    blocker = server.service.scheduler.submit(lambda ctx: release.wait(60))
    body = {"text": "第一句话。第二句话。", "voice": "alice", "stream": True, "format": "pcm"}

    def ask() -> None:
        with as_key(server, secret) as user:
            answers.append(user.post("/v1/tts", json=body))

    asking = threading.Thread(target=ask)
    try:
        asking.start()
        deadline = time.monotonic() + 60
        while server.service.scheduler.stats()["queued"] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        with as_key(server, server.admin_key) as admin:
            assert admin.post(f"/admin/keys/{key.id}/revoke").status_code == 200
    finally:
        release.set()
        blocker.wait(30)
        asking.join(60)
    (answer,) = answers
    assert answer.status_code == 401 and answer.json()["error"]["code"] == "key_revoked", answer.text
    assert settled(server, key.id) == 0.0


def test_a_revoked_keys_batch_stops_between_items(server, pause) -> None:
    key, secret = server.service.keys.create("revoked-batch", "user")
    paused, go = pause(key.id, 2)  # before item 1, then before charging it
    with as_key(server, secret) as user, as_key(server, server.admin_key) as admin:
        items = {"voice": "alice", "items": ["一。", "二。", "三。"]}
        batch = user.post("/v1/batches", json=items).json()
        assert paused.wait(60)
        admin.post(f"/admin/keys/{key.id}/revoke")
        go.set()
        final = wait(admin, f"/v1/batches/{batch['id']}")
    assert final["state"] == "failed" and final["error"]["code"] == "key_revoked", final
    assert [item["state"] for item in final["items"]] == ["done", "cancelled", "cancelled"]
    assert {item["error"]["code"] for item in final["items"][1:]} == {"key_revoked"}
    assert final["partial"]["segments_done"] == 1 and final["partial"]["missing"] == [2, 3]
    used = server.service.access.quota.used(key.id)
    assert used == pytest.approx(final["items"][0]["duration_s"], abs=0.01)


def test_a_key_demoted_to_user_stops_work_with_a_voice_it_may_no_longer_use(
    server, pause, prompt_wav_bytes
) -> None:
    _owner_key, owner = server.service.keys.create("erin-app", "user")
    key, secret = server.service.keys.create("second-admin", "admin")
    with (
        as_key(server, owner) as erin,
        as_key(server, secret) as ops,
        as_key(server, server.admin_key) as admin,
    ):
        enrol_voice(erin, "erin-voice", prompt_wav_bytes)  # erin's own: admins may use it, users not
        paused, go = pause(key.id, 2)
        job = ops.post("/v1/jobs", json={"text": TEXT, "voice": "erin-voice"}).json()
        assert paused.wait(60)
        changed = admin.patch(f"/admin/keys/{key.id}", json={"role": "user"})
        assert changed.status_code == 200 and changed.json()["role"] == "user"
        go.set()
        final = wait(admin, f"/v1/jobs/{job['id']}")
    assert final["state"] == "failed" and final["error"]["code"] == "key_changed", final
    assert final["partial"]["segments_done"] == 1


def test_a_cancelled_job_keeps_its_finished_segments(server, pause) -> None:
    key, secret = server.service.keys.create("cancelling", "user")
    paused, go = pause(key.id, 2)
    with as_key(server, secret) as user:
        job = user.post("/v1/jobs", json={"text": TEXT, "voice": "alice"}).json()
        assert paused.wait(60)
        assert user.delete(f"/v1/jobs/{job['id']}").status_code == 202
        go.set()
        final = wait(user, f"/v1/jobs/{job['id']}")
        assert final["state"] == "cancelled" and final["error"]["code"] == "cancelled", final
        assert final["partial"]["segments_done"] >= 1 and final["partial"]["segments_total"] >= 3
        assert seconds_of(user, final["result_url"]) == pytest.approx(final["partial"]["audio_s"], abs=0.01)
        assert user.get(f"/v1/jobs/{job['id']}/result", follow_redirects=False).status_code == 307


# -- admin routes ----------------------------------------------------------------------------------------


def test_admins_list_revoke_and_change_keys(server) -> None:
    key, secret = server.service.keys.create("frank-app", "user")
    server.service.access.quota.add(key, 2.5)
    with as_key(server, secret) as user, as_key(server, server.admin_key) as admin:
        assert user.get("/admin/keys").status_code == 403
        assert user.post(f"/admin/keys/{key.id}/revoke").status_code == 403
        listed = {k["id"]: k for k in admin.get("/admin/keys").json()["data"]}
        assert listed[key.id]["usage_today"]["used_s"] == 2.5 and "hash" not in listed[key.id]
        changed = admin.patch(
            f"/admin/keys/{key.id}", json={"daily_audio_seconds_quota": 3, "rate_limit_per_minute": 0}
        )
        assert changed.status_code == 200, changed.text
        assert changed.json()["usage_today"] == {
            **changed.json()["usage_today"],
            "limit_s": 3.0,
            "used_s": 2.5,
        }
        assert user.get("/v1/me").json()["quota"]["limit_s"] == 3.0
        reset = admin.patch(f"/admin/keys/{key.id}", json={"daily_audio_seconds_quota": None})
        assert (
            reset.json()["daily_audio_seconds_quota"] is None and reset.json()["rate_limit_per_minute"] == 0
        )
        huge = 10**20  # was a 500 (SQLite's INTEGER overflowed); `true` became a quota of 1 s
        for bad in (
            {"daily_audio_seconds_quota": -1},
            {"daily_audio_seconds_quota": True},
            {"rate_limit_per_minute": huge},
            {"rate_limit_per_minute": True},
            {"role": "root"},
            {"colour": "red"},
        ):
            answer = admin.patch(f"/admin/keys/{key.id}", json=bad)
            assert answer.status_code == 422 and answer.json()["error"]["code"] == "invalid_request", bad
        empty = admin.patch(f"/admin/keys/{key.id}", json={})
        assert empty.status_code == 400 and "nothing to change" in empty.json()["error"]["message"]
        no_role = admin.patch(f"/admin/keys/{key.id}", json={"role": None})
        assert no_role.status_code == 400 and "role cannot be null" in no_role.json()["error"]["message"]
        for path in ("/admin/keys/999999/revoke", "/admin/keys/nope/revoke"):
            assert admin.post(path).json()["error"]["code"] == "key_not_found"
        assert admin.patch("/admin/keys/999999", json={"role": "user"}).status_code == 404
        assert admin.post(f"/admin/keys/{key.id}/revoke").json()["active"] is False
        assert user.get("/v1/me").status_code == 401
        active = {k["id"] for k in admin.get("/admin/keys", params={"include_revoked": False}).json()["data"]}
        assert key.id not in active


def test_a_one_shot_request_stopped_by_a_revoke_charges_nothing_and_says_so(roomy, pause) -> None:
    """Its finished segments were charged though its answer was a 401 with no audio, and the message
    said "what finished before is kept"."""
    key, secret = roomy.service.keys.create("revoked-one-shot", "user")
    answers: list[httpx.Response] = []

    def listen() -> None:
        with as_key(roomy, secret) as user:
            answers.append(user.post("/v1/tts", json={"text": LONG_TEXT, "voice": "alice", "format": "wav"}))

    revoked_midway(roomy, key.id, pause, listen)  # after its first segment (the start's check, then it)
    error = answers[0].json()["error"]
    assert answers[0].status_code == 401 and error["code"] == "key_revoked", answers[0].text
    assert "nothing was kept or charged" in error["message"], error
    assert settled(roomy, key.id) == 0.0
