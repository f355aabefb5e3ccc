"""Auth on: API keys (roles, revocation, rate limit, quota, owners), UI login, signed URLs, safe binding."""

from __future__ import annotations

import time

import httpx
import openai
import pytest
from tests.conftest import API_SEED, API_TEXT, enrol_voice

from cosyserve.cli import main as cli_main
from cosyserve.errors import SettingsError
from cosyserve.service.assembly import Service
from cosyserve.service.settings import Settings


@pytest.fixture(scope="module")
def server(start_api_server, prompt_wav_bytes):
    live = start_api_server(api_keys_required=True, ui_username="admin", ui_password="correct horse")
    keys = live.service.keys
    live.admin_key = keys.create("ops", "admin")[1]
    live.user_key = keys.create("alice-app", "user")[1]
    live.other_key = keys.create("bob-app", "user")[1]
    with live.client(headers={"Authorization": f"Bearer {live.admin_key}"}) as client:
        enrol_voice(client, "alice", prompt_wav_bytes)
    yield live
    live.stop()


def wait_for_job(client: httpx.Client, job_id: str, timeout_s: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while (job := client.get(f"/v1/jobs/{job_id}").json())["state"] in ("queued", "running"):
        assert time.monotonic() < deadline, job
        time.sleep(0.1)
    return job


def as_key(server, key: str | None) -> httpx.Client:
    return server.client(headers={"Authorization": f"Bearer {key}"} if key else {})


def test_requests_without_a_valid_key_are_refused(server) -> None:
    with as_key(server, None) as anonymous:
        response = anonymous.get("/v1/voices")
        assert response.status_code == 401 and response.json()["error"]["code"] == "auth_required"
        assert response.headers["www-authenticate"].startswith("Bearer")
        for path in ("/health", "/ready", "/metrics", "/docs"):
            assert anonymous.get(path).status_code == 200, path  # probes and docs stay open
    with as_key(server, "cs_" + "x" * 43) as wrong:
        assert wrong.get("/v1/voices").status_code == 401
    with server.client(headers={"X-API-Key": server.user_key}) as user:
        assert user.get("/v1/voices").status_code == 200


def test_roles(server, prompt_wav_bytes) -> None:
    with as_key(server, server.user_key) as user:
        assert (
            user.post("/v1/tts", json={"text": API_TEXT, "voice": "alice", "seed": API_SEED}).status_code
            == 200
        )
        files = {"audio": ("a.wav", prompt_wav_bytes, "audio/wav")}
        unconfirmed = user.post("/v1/voices", data={"name": "mine"}, files=files)
        assert unconfirmed.status_code == 400 and unconfirmed.json()["error"]["code"] == "consent_required"
        statement = user.get("/v1/voices/consent").json()
        assert (
            statement["required"] is True and statement["statement"] in unconfirmed.json()["error"]["message"]
        )
        own = user.post("/v1/voices", data={"name": "mine", "consent": "true"}, files=files)
        assert own.status_code == 201 and own.json()["shared"] is False  # a user key's voice is its own
        assert own.json()["own"] is True and own.json()["consent"]["statement"] == statement["statement"]
        shared = user.post("/v1/voices", data={"name": "x", "consent": "true", "shared": "true"}, files=files)
        assert shared.status_code == 403  # only admins share voices
        assert user.delete("/v1/voices/alice").json()["error"]["code"] == "forbidden"  # shared: admins only
        assert user.delete("/v1/voices/mine").status_code == 204
        assert user.get("/admin/logs").status_code == 403
        assert user.post("/admin/engine/restart").status_code == 403
        me = user.get("/v1/me").json()
        assert me["role"] == "user" and me["key_prefix"] == server.user_key[:11]
    with as_key(server, server.admin_key) as admin:
        assert admin.get("/admin/status").status_code == 200


def test_voices_belong_to_the_key_that_enrolled_them(server, prompt_wav_bytes) -> None:
    """A user key's voice is its own: another user key gets 404 for it, its preview and its use; only
    owners and admins get a voice's original recording; admins' voices are shared."""
    files = {"audio": ("a.wav", prompt_wav_bytes, "audio/wav")}
    with as_key(server, server.user_key) as user, as_key(server, server.other_key) as other:
        created = user.post(
            "/v1/voices", data={"name": "carol", "transcript": "你好", "consent": "true"}, files=files
        )
        assert created.status_code == 201 and created.json()["shared"] is False
        voice_id = created.json()["id"]
        for path in (f"/v1/voices/{voice_id}", "/v1/voices/carol", f"/v1/voices/{voice_id}/preview"):
            response = other.get(path)
            assert response.status_code == 404 and response.json()["error"]["code"] == "voice_not_found", path
        assert "carol" not in [v["name"] for v in other.get("/v1/voices").json()["data"]]
        speech = {"model": "tts-1", "input": API_TEXT, "voice": "carol"}
        for path, body in [("/v1/tts", {"text": API_TEXT, "voice": "carol"}), ("/v1/audio/speech", speech)]:
            assert other.post(path, json=body).status_code == 404, path
        job = other.post("/v1/jobs", json={"text": API_TEXT, "voice": "carol"})  # as for a missing voice
        assert job.status_code == 404 and "no voice 'carol'" in job.json()["error"]["message"]
        assert other.delete("/v1/voices/carol").status_code == 404
        assert user.get(f"/v1/voices/{voice_id}/preview").status_code == 200  # the owner's recording
        shared = user.get("/v1/voices/alice/preview")
        assert shared.status_code == 403 and "?text=" in shared.json()["error"]["message"]
        assert user.get("/v1/voices/alice/preview", params={"text": "你好"}).status_code == 200
        assert {"alice", "carol"} <= {v["name"] for v in user.get("/v1/voices").json()["data"]}
    with as_key(server, server.other_key) as other:  # names are per owner: "carol" is free for another key
        mine = other.post("/v1/voices", data={"name": "carol", "consent": "true"}, files=files)
        assert mine.status_code == 201 and other.get("/v1/voices/carol").json()["id"] == mine.json()["id"]
    with as_key(server, server.admin_key) as admin:
        ambiguous = admin.get("/v1/voices/carol")  # two users' voices, neither the admin's: ask for the id
        assert ambiguous.status_code == 400 and "by its id" in ambiguous.json()["error"]["message"]
        assert admin.get(f"/v1/voices/{voice_id}/preview").status_code == 200
        assert admin.get(f"/v1/voices/{voice_id}").json()["transcript"] == "你好"
        assert admin.delete(f"/v1/voices/{voice_id}").status_code == 204
        assert admin.delete(f"/v1/voices/{mine.json()['id']}").status_code == 204


def test_jobs_and_outputs_belong_to_their_key(server) -> None:
    with as_key(server, server.user_key) as user, as_key(server, server.other_key) as other:
        spoken = user.post("/v1/tts", json={"text": API_TEXT, "voice": "alice", "seed": API_SEED})
        output_id = spoken.headers["x-cosyserve-output-id"]
        job = user.post("/v1/jobs", json={"text": API_TEXT, "voice": "alice"}).json()
        assert other.get(f"/v1/outputs/{output_id}").status_code == 404
        assert other.get(f"/v1/outputs/{output_id}/manifest").status_code == 404
        assert other.get(f"/v1/jobs/{job['id']}").status_code == 404
        assert other.delete(f"/v1/jobs/{job['id']}").status_code == 404
        assert job["id"] not in [j["id"] for j in other.get("/v1/jobs").json()["data"]]
        assert output_id not in [o["id"] for o in other.get("/v1/outputs").json()["data"]]
        assert user.get(f"/v1/outputs/{output_id}").status_code == 200
        listed = user.get("/v1/outputs").json()["data"]
        signed = next(o["url"] for o in listed if o["id"] == output_id)
    with as_key(server, None) as anonymous:
        assert anonymous.get(f"/v1/outputs/{output_id}").status_code == 401  # no key, no signature
        assert anonymous.get(signed).status_code == 200  # the signed URL is enough
    with as_key(server, server.admin_key) as admin:
        assert admin.get(f"/v1/jobs/{job['id']}").status_code == 200


def test_revoked_key_stops_working(server) -> None:
    record, key = server.service.keys.create("temp", "user")
    with as_key(server, key) as client:
        assert client.get("/v1/voices").status_code == 200
        server.service.keys.revoke(record.id)
        assert client.get("/v1/voices").status_code == 401


def test_rate_limit_per_key(server) -> None:
    _, key = server.service.keys.create("chatty", "user", rate_limit=3)
    with as_key(server, key) as client:
        statuses = [client.post("/v1/tts", json={}).status_code for _ in range(4)]
        assert statuses == [422, 422, 422, 429]
        limited = client.post("/v1/tts", json={})
        assert limited.json()["error"]["code"] == "rate_limited" and int(limited.headers["retry-after"]) >= 1
        # the message says what the header says (it said "retry in 0 s" beside Retry-After: 1)
        assert limited.json()["error"]["message"].endswith(f"retry in {limited.headers['retry-after']} s")


def test_polling_does_not_use_up_the_requests_that_submit_work(server) -> None:
    """Reads were counted with writes: a client polling its job once a second had no request left to
    submit the next one. Reads have an allowance of their own, ten times the key's."""
    _, key = server.service.keys.create("poller", "user", rate_limit=3)
    with as_key(server, key) as client:
        reads = [client.get("/v1/voices").status_code for _ in range(31)]
        assert reads == [200] * 30 + [429]
        assert "30 reads (GET requests) per minute" in client.get("/v1/voices").json()["error"]["message"]
        assert [client.post("/v1/tts", json={}).status_code for _ in range(4)] == [422, 422, 422, 429]
        # a preview of a text synthesises: it is a request, not a read
        assert client.get("/v1/voices/nobody/preview", params={"text": "你好"}).status_code == 429


def test_daily_audio_quota(server) -> None:
    _, key = server.service.keys.create("frugal", "user", quota=1.0)
    with as_key(server, key) as client:
        body = {"text": API_TEXT, "voice": "alice", "seed": API_SEED}
        first = client.post("/v1/tts", json=body)  # about 0.6 s reserved: it fits
        assert first.status_code == 200
        over = client.post("/v1/tts", json=body)  # what it made and another 0.6 s do not fit
        assert over.status_code == 429 and over.json()["error"]["code"] == "quota_exceeded"
        assert int(over.headers["retry-after"]) > 0
        used = client.get("/v1/me").json()["quota"]["used_s"]
        assert used == pytest.approx(float(first.headers["x-cosyserve-duration"]), abs=0.01)


def test_ui_login_session(server) -> None:
    with server.client() as browser:
        wrong = browser.post("/auth/login", json={"username": "admin", "password": "nope"})
        assert wrong.status_code == 401
        assert (
            browser.post("/auth/login", json={"username": "admin", "password": "correct horse"}).status_code
            == 200
        )
        assert browser.get("/v1/voices").status_code == 200
        assert browser.get("/admin/status").status_code == 200
        session = dict(browser.cookies)
        browser.post("/auth/logout")
        browser.cookies.clear()
        assert browser.get("/v1/voices").status_code == 401
    with server.client(cookies=session) as stale:  # an ended sign-in is told so (it was told to send a key)
        ended = stale.get("/v1/voices")
        assert ended.status_code == 401 and "your sign-in has ended" in ended.json()["error"]["message"]


def test_openai_sdk_with_a_key(server) -> None:
    sdk = openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.user_key, max_retries=0)
    audio = sdk.audio.speech.create(model="tts-1", voice="alice", input=API_TEXT, response_format="wav")
    assert audio.content[:4] == b"RIFF"
    bad = openai.OpenAI(base_url=f"{server.url}/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.audio.speech.create(model="tts-1", voice="alice", input=API_TEXT)


def test_keys_cli_creates_a_key_the_server_accepts(server, capsys) -> None:
    data_dir = str(server.service.settings.storage.data_dir)
    assert cli_main(["keys", "create", "from-cli", "--role", "user", "--quiet", "--data-dir", data_dir]) == 0
    key = capsys.readouterr().out.strip()
    with as_key(server, key) as client:
        assert client.get("/v1/voices").status_code == 200
    assert cli_main(["keys", "list", "--data-dir", data_dir]) == 0
    assert "from-cli" in capsys.readouterr().out
    assert cli_main(["keys", "revoke", key[:11], "--data-dir", data_dir]) == 0
    with as_key(server, key) as client:
        assert client.get("/v1/voices").status_code == 401


def test_public_address_needs_auth(tmp_path) -> None:
    made: list[Service] = []

    def safety(**values) -> list[str]:
        data_dir = tmp_path / str(len(made))
        made.append(Service(Settings(model="demo", device="cpu", data_dir=data_dir, **values)))
        return made[-1].check_startup_safety()

    try:
        assert safety() == []  # loopback: fine without auth
        with pytest.raises(SettingsError, match=r"refusing to listen on 0\.0\.0\.0"):
            safety(host="0.0.0.0")
        assert "--insecure" in safety(host="0.0.0.0", insecure=True)[0]
        assert safety(host="0.0.0.0", ui_username="u", ui_password="p") == []
    finally:
        for service in made:
            service.shutdown()


def test_cloning_a_recording_needs_consent_as_enrolling_does(server, prompt_wav_bytes, tmp_path) -> None:
    """A user key could clone any recording through prompt_wav without the consent that enrolling the same
    recording demands; now every path that takes a recording asks for it, and keeps it with the output."""
    import base64

    wav = base64.b64encode(prompt_wav_bytes).decode()
    srt = "1\n00:00:00,000 --> 00:00:02,000\n你好。\n"
    paths = {
        "/v1/tts": {"text": API_TEXT, "prompt_wav": wav, "seed": API_SEED},
        "/v1/jobs": {"text": API_TEXT, "prompt_wav": wav},
        "/v1/batches": {"prompt_wav": wav, "items": [API_TEXT]},
        "/v1/dub": {"prompt_wav": wav, "subtitles": srt},
    }
    with as_key(server, server.user_key) as user, as_key(server, server.admin_key) as admin:
        statement = user.get("/v1/voices/consent").json()["statement"]
        for path, body in paths.items():
            refused = user.post(path, json=body)
            assert refused.status_code == 400, (path, refused.text)
            error = refused.json()["error"]
            assert error["code"] == "consent_required" and statement in error["message"], path
            assert "consent=true beside prompt_wav" in error["message"]
        files = {"prompt_wav": ("p.wav", prompt_wav_bytes, "audio/wav")}
        form = user.post("/v1/tts", data={"text": API_TEXT}, files=files)  # multipart: the same rule
        assert form.status_code == 400 and form.json()["error"]["code"] == "consent_required"
        confirmed = user.post("/v1/tts", json={**paths["/v1/tts"], "consent": True})
        assert confirmed.status_code == 200, confirmed.text
        output_id = confirmed.headers["x-cosyserve-output-id"]
        manifest = server.service.outputs.get(output_id).manifest
        kept = manifest["parameters"]["consent"]
        assert kept["statement"] == statement and kept["by"] == "alice-app" and kept["at"] > 0
        for path in ("/v1/jobs", "/v1/batches", "/v1/dub"):
            accepted = user.post(path, json={**paths[path], "consent": True})
            assert accepted.status_code == 202, (path, accepted.text)
            user.delete(f"{path}/{accepted.json()['id']}")  # cancelled: only the admission is tested
        assert admin.post("/v1/tts", json=paths["/v1/tts"]).status_code == 200  # admins may, as enrolling
        assert (
            user.post("/v1/tts", json={"text": API_TEXT, "voice": "alice"}).status_code == 200
        )  # a saved voice


def test_admins_see_whose_voices_jobs_and_batches_they_list(server, prompt_wav_bytes) -> None:
    """Two users' voices of one name, and their jobs and batches, used to be told apart by nothing in an
    admin's lists but who confirmed consent; now each carries its `owner` (a user sees its own only)."""
    files = {"audio": ("a.wav", prompt_wav_bytes, "audio/wav")}
    with (
        as_key(server, server.user_key) as user,
        as_key(server, server.other_key) as other,
        as_key(server, server.admin_key) as admin,
    ):
        owners = {user: user.get("/v1/me").json()["owner"], other: other.get("/v1/me").json()["owner"]}
        twins = {}
        for client, owner in owners.items():
            made = client.post("/v1/voices", data={"name": "twin", "consent": "true"}, files=files)
            assert made.status_code == 201 and made.json()["owner"] == owner, made.text
            twins[made.json()["id"]] = owner
        listed = {v["id"]: v["owner"] for v in admin.get("/v1/voices").json()["data"] if v["name"] == "twin"}
        assert listed == twins
        alice = next(v for v in user.get("/v1/voices").json()["data"] if v["name"] == "alice")
        assert alice["owner"] is None  # a shared voice of the admin's: its owner is not the user's to see
        job = user.post("/v1/jobs", json={"text": API_TEXT, "voice": "alice"}).json()
        batch = other.post("/v1/batches", json={"voice": "alice", "items": [API_TEXT]}).json()
        assert job["owner"] == owners[user] and batch["owner"] == owners[other]
        jobs = {j["id"]: j["owner"] for j in admin.get("/v1/jobs").json()["data"]}
        batches = {b["id"]: b["owner"] for b in admin.get("/v1/batches").json()["data"]}
        assert jobs[job["id"]] == owners[user] and batches[batch["id"]] == owners[other]


def walk_pages(client: httpx.Client, path: str) -> list[str]:
    """Every id of a list, one per page, until a page says nothing more follows."""
    ids: list[str] = []
    while True:
        page = client.get(path, params={"limit": 1, "offset": len(ids)}).json()
        ids += [entry["id"] for entry in page["data"]]
        if not page["has_more"]:
            return ids
        assert len(page["data"]) == 1 and len(ids) < 50, page


def test_a_page_says_whether_more_follow_and_each_key_pages_its_own(server, prompt_wav_bytes) -> None:
    """Lists had no way to say the last page was last: a client paged until an empty page. Every list
    says `has_more`; two users paging at once each get exactly their own, and the admin everyone's."""
    made: dict[str, dict[str, set[str]]] = {}
    for name in ("pager-a", "pager-b"):
        key = server.service.keys.create(name, "user")[1]
        with as_key(server, key) as client:
            mine = made[name] = {"jobs": set(), "outputs": set(), "voices": set(), "batches": set()}
            files = {"audio": ("v.wav", prompt_wav_bytes, "audio/wav")}
            for n in range(2):
                voice = client.post("/v1/voices", data={"name": f"v{n}", "consent": "true"}, files=files)
                mine["voices"].add(voice.json()["id"])
                spoken = client.post("/v1/tts", json={"text": API_TEXT, "voice": "alice", "seed": API_SEED})
                mine["outputs"].add(spoken.headers["x-cosyserve-output-id"])
                job = client.post("/v1/jobs", json={"text": API_TEXT, "voice": "alice"}).json()
                mine["jobs"].add(job["id"])
                mine["outputs"].add(wait_for_job(client, job["id"])["output_id"])
            batch = client.post("/v1/batches", json={"voice": "alice", "items": ["一。"]}).json()["id"]
            wait_for_job(client, batch)
            items = client.get(f"/v1/batches/{batch}").json()["items"]
            mine["batches"].add(batch)
            mine["outputs"] |= {item["output_id"] for item in items}
            mine["jobs"] |= mine["batches"]  # a batch is a job too
            mine["key"] = key  # type: ignore[assignment]
    for name, mine in made.items():
        with as_key(server, mine.pop("key")) as client:  # type: ignore[arg-type]
            for kind, ids in mine.items():
                listed = walk_pages(client, f"/v1/{kind}")
                if kind == "voices":  # the admin's shared voice is listed to every user
                    listed = [i for i in listed if i in ids]
                assert sorted(listed) == sorted(ids), (name, kind)
    with as_key(server, server.admin_key) as admin:
        everyone = set(walk_pages(admin, "/v1/jobs"))
        assert made["pager-a"]["jobs"] | made["pager-b"]["jobs"] <= everyone
        last = admin.get("/v1/outputs", params={"limit": 1000}).json()
        assert last["has_more"] is False and len(last["data"]) < 1000


def test_an_enrolment_that_waited_while_its_key_was_revoked_saves_no_voice(server, prompt_wav_bytes) -> None:
    """An enrolment waiting in the queue saved its voice two seconds after its key was revoked (a leaked
    key stored a recording); one of an admin key made a user key meanwhile saved a shared voice."""
    from cosyserve.errors import KeyChanged, KeyRevoked
    from cosyserve.service.requests import EnrolmentRequest

    keys, backend = server.service.keys, server.service.backend
    leaked, _ = keys.create("leaked", "user")
    demoted, _ = keys.create("demoted", "admin")
    keys.revoke(leaked.id)  # as if while it waited: the API let it in before
    keys.update(demoted.id, role="user")
    late = EnrolmentRequest(
        "late", prompt_wav_bytes, "希望你以后能够做的比我还好呦。", owner=f"key:{leaked.id}"
    )
    with pytest.raises(KeyRevoked, match="revoked before this work started"):
        backend.submit_enrolment(late).result(timeout=60)
    shared = EnrolmentRequest("for-all", prompt_wav_bytes, owner=f"key:{demoted.id}", shared=True)
    with pytest.raises(KeyChanged, match="became a user key before this enrolment ran: no voice was saved"):
        backend.submit_enrolment(shared).result(timeout=60)
    assert not {"late", "for-all"} & {voice.name for voice in server.service.voices.list()}
    own = EnrolmentRequest("own", prompt_wav_bytes, owner=f"key:{demoted.id}")  # its own: still fine
    assert backend.submit_enrolment(own).result(timeout=60).owner == f"key:{demoted.id}"


def test_a_rotated_key_keeps_its_voices_outputs_and_usage_and_the_old_secret_stops(
    server, prompt_wav_bytes
) -> None:
    """Replacing a leaked key meant a new key that owned nothing: its voices (and their consent), outputs
    and jobs stayed with the revoked one. A rotation gives the same key a new secret."""
    record, old = server.service.keys.create("rotating", "user")
    files = {"audio": ("r.wav", prompt_wav_bytes, "audio/wav")}
    with as_key(server, old) as user:
        voice = user.post("/v1/voices", data={"name": "mine", "consent": "true"}, files=files).json()
        spoken = user.post("/v1/tts", json={"text": API_TEXT, "voice": "mine", "seed": API_SEED})
        used = user.get("/v1/me").json()["quota"]["used_s"]
    with as_key(server, server.admin_key) as admin, as_key(server, server.other_key) as bob:
        rotated = admin.post(f"/admin/keys/{record.id}/rotate")
        assert rotated.status_code == 200, rotated.text
        new = rotated.json()["key"]
        assert rotated.json()["id"] == record.id and new.startswith("cs_") and new != old
        assert rotated.json()["prefix"] != record.prefix and rotated.json()["active"] is True
        assert bob.get("/v1/voices").status_code == 200  # nobody else is touched
        assert bob.post(f"/admin/keys/{record.id}/rotate").status_code == 403
    with as_key(server, old) as stale:
        assert stale.get("/v1/me").status_code == 401
    with as_key(server, new) as user:
        assert [v["id"] for v in user.get("/v1/voices").json()["data"] if v["name"] == "mine"] == [
            voice["id"]
        ]
        assert user.get(f"/v1/outputs/{spoken.headers['x-cosyserve-output-id']}").status_code == 200
        assert user.get("/v1/me").json()["quota"]["used_s"] == pytest.approx(used)
    server.service.keys.revoke(record.id)
    with as_key(server, server.admin_key) as admin:
        refused = admin.post(f"/admin/keys/{record.id}/rotate")
        assert (
            refused.status_code == 400
            and "is revoked: create a new key" in refused.json()["error"]["message"]
        )
        assert admin.post("/admin/keys/999999999/rotate").status_code == 404


def test_admins_create_keys_through_the_api_and_a_revoked_key_cannot_change(server) -> None:
    """The README named the API beside the UI for creating keys, but only the CLI and the UI could; a
    PATCH of a revoked key answered 200 and logged a change that could never apply."""
    with as_key(server, server.admin_key) as admin, as_key(server, server.other_key) as bob:
        made = admin.post("/admin/keys", json={"name": "new-app", "daily_audio_seconds_quota": 30})
        assert made.status_code == 201, made.text
        body = made.json()
        assert body["name"] == "new-app" and body["role"] == "user" and body["key"].startswith("cs_")
        assert body["daily_audio_seconds_quota"] == 30 and "hash" not in body
        assert bob.post("/admin/keys", json={"name": "mine"}).status_code == 403
        assert admin.post("/admin/keys", json={"name": ""}).status_code == 422
        assert admin.post("/admin/keys", json={"name": "x", "role": "root"}).status_code == 422
        with as_key(server, body["key"]) as new:
            assert new.get("/v1/me").json()["role"] == "user"
        assert admin.post(f"/admin/keys/{body['id']}/revoke").status_code == 200
        changed = admin.patch(f"/admin/keys/{body['id']}", json={"daily_audio_seconds_quota": 60})
        assert changed.status_code == 400 and "is revoked" in changed.json()["error"]["message"]
