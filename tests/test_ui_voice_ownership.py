"""Voices in the web UI as a team uses one server: two user keys and an admin, each through the UI's own
Gradio endpoints (with `gradio_client`, as a second user's script or browser would call them) and the page
config every visitor gets. The rule is the API's (`service.access.voice_rules`): a user sees its own and
the shared voices, only owners and admins hear a recording or read its transcript, users manage their own
voices, admins everything.
"""

from __future__ import annotations

import httpx
import pytest
from gradio_client import Client, handle_file

from conftest import PROMPT_TRANSCRIPT, LiveServer, sharing

SHARED_TRANSCRIPT = "这是管理员共享音色的文本。"
YOURS = {"yours", "我的"}  # the page language is the UI's default here


@pytest.fixture(scope="module")
def team(api_synthesizer, demo_model_path, tmp_path_factory, shared_dir):
    """A server with the UI, an admin key and two user keys; A has a private voice "carol", the admin a
    shared voice "alice"."""
    from cosyserve.api.app import create_app
    from cosyserve.service.assembly import Service
    from cosyserve.service.settings import Settings
    from cosyserve.ui.app import mount_ui

    settings = Settings(
        model=str(demo_model_path),
        device="cpu",
        data_dir=tmp_path_factory.mktemp("ui-team"),
        concurrency=1,
        queue_size=4,
        signing_secret="test-signing-secret-0123456789abcdef",
    )
    service = Service(settings, synthesizer_factory=sharing(api_synthesizer))
    keys = {
        name: service.keys.create(name, role=role)[1]
        for name, role in [("admin", "admin"), ("a", "user"), ("b", "user")]
    }
    app = create_app(service)
    mount_ui(app, service)
    server = LiveServer(app, service).start()
    server.wait_ready()
    prompt = (shared_dir / "audio" / "prompt_zh_24k.wav").read_bytes()
    enrolled = {}
    for who, name, transcript in [("admin", "alice", SHARED_TRANSCRIPT), ("a", "carol", PROMPT_TRANSCRIPT)]:
        response = httpx.post(
            f"{server.url}/v1/voices",
            headers={"X-API-Key": keys[who]},
            data={"name": name, "transcript": transcript, "consent": "true"},
            files={"audio": ("p.wav", prompt, "audio/wav")},
            timeout=120,
        )
        assert response.status_code == 201, response.text
        enrolled[name] = response.json()["id"]
    server.keys, server.voice_ids, server.prompt = keys, enrolled, prompt
    yield server
    server.stop()


def ui_client(server, who: str) -> Client:
    """A UI session of `who`, opened as the page opens it (its load event fills the voice lists); the
    page's language is UI state, not an input of the named events."""
    client = Client(server.url, headers={"X-API-Key": server.keys[who]}, verbose=False, download_files=False)
    client.predict(None, api_name="/page_voices")
    return client


def table_rows(result) -> dict[str, list]:
    """name -> row of the voices table in a refresh result (the table comes first)."""
    table = result[0] if isinstance(result, tuple | list) else result
    table = table.get("value", table)  # (an update of the table carries the new value inside)
    return {row[0]: row for row in table["data"]}


def test_b_lists_only_its_own_and_shared_voices(team):
    b = ui_client(team, "b")
    for endpoint, args in [("/page_voices", [None]), ("/voices_refresh", [None])]:
        rows = table_rows(b.predict(*args, api_name=endpoint))
        assert "carol" not in rows, endpoint
        assert rows["alice"][1] == "—" and SHARED_TRANSCRIPT not in str(rows), endpoint  # no transcript
    a_rows = table_rows(ui_client(team, "a").predict(None, api_name="/voices_refresh"))
    assert a_rows["carol"][1] == PROMPT_TRANSCRIPT and a_rows["carol"][2] in YOURS
    admin_rows = table_rows(ui_client(team, "admin").predict(None, api_name="/voices_refresh"))
    assert admin_rows["carol"][1] == PROMPT_TRANSCRIPT and admin_rows["alice"][1] == SHARED_TRANSCRIPT
    assert admin_rows["carol"][2] in ("private (a)", "私有（a）")  # the owner by its key's name, not key:2


def test_an_admin_s_voice_lists_say_whose_each_voice_is(team):
    """Two users may each have a "narrator": the admin's voice lists named them alike."""
    from cosyserve.service.access.principals import Principal
    from cosyserve.ui.bridge import UiBridge
    from cosyserve.ui.studio import voice_choices

    bridge = UiBridge(team.service)
    keys = {key.name: key for key in team.service.keys.list()}
    admin = Principal("key", "admin", key=keys["admin"], name="admin")
    user = Principal("key", "user", key=keys["a"], name="a")
    labels = dict((value, label) for label, value in voice_choices(bridge, "en", admin))
    assert labels[team.voice_ids["carol"]] == "carol · a" and labels[team.voice_ids["alice"]] == "alice"
    labels = dict((value, label) for label, value in voice_choices(bridge, "en", user))
    assert labels[team.voice_ids["carol"]] == "carol"  # a user's own list names nobody


def test_b_can_neither_hear_nor_use_nor_change_as_voice(team):
    b = ui_client(team, "b")
    carol, alice = team.voice_ids["carol"], team.voice_ids["alice"]
    for endpoint, args in [
        ("/voice_preview", [carol, ""]),  # the recording itself
        ("/voice_preview", [carol, "你好"]),
        ("/zero_shot_voice", [carol]),  # picking it in a synthesis tab
        ("/voice_use", [carol]),
        ("/voice_rename", [carol, "mine-now"]),
        ("/voice_delete", [carol]),
        ("/voice_preview", [alice, ""]),  # a shared voice's recording: its owner's and admins' only
        ("/voice_rename", [alice, "renamed"]),  # shared with B, not B's
    ]:
        with pytest.raises(Exception) as refused:
            b.predict(*args, api_name=endpoint)
        assert "mine-now" not in str(refused.value), endpoint
    note = b.predict(alice, api_name="/zero_shot_voice")[0]
    assert "alice" in note and SHARED_TRANSCRIPT not in note  # usable, its words stay private
    service = team.service
    assert {v.name for v in service.voices.list()} >= {"carol", "alice"}  # nothing was changed
    # the bridge itself refuses too (not only Gradio's check that a value is among the offered choices)
    from cosyserve.service.access.principals import Forbidden
    from cosyserve.service.stores.voices import VoiceNotFound
    from cosyserve.ui.bridge import UiBridge

    bridge = UiBridge(service)
    as_b = bridge.principal({"X-API-Key": team.keys["b"]}, {})
    with pytest.raises(VoiceNotFound):
        bridge.voice_recording(as_b, carol)
    with pytest.raises(VoiceNotFound):
        bridge.rename_voice(as_b, "carol", "x")
    with pytest.raises(Forbidden):
        bridge.voice_recording(as_b, alice)
    with pytest.raises(Forbidden):
        bridge.delete_voice(as_b, alice)


def test_owner_and_admin_hear_the_recording(team):
    carol = team.voice_ids["carol"]
    for who in ("a", "admin"):
        audio, _status = ui_client(team, who).predict(carol, "", api_name="/voice_preview")
        path = audio["path"] if isinstance(audio, dict) else audio
        response = httpx.get(
            f"{team.url}/gradio_api/file={path}", headers={"X-API-Key": team.keys[who]}, timeout=30
        )
        assert response.status_code == 200 and response.content == team.prompt, who
        # Another signed-in user holding the copy's URL gets nothing (any signed-in user did: a team's run)
        other = httpx.get(
            f"{team.url}/gradio_api/file={path}", headers={"X-API-Key": team.keys["b"]}, timeout=30
        )
        assert other.status_code == 404 and team.prompt not in other.content, who
        # nor by Gradio's older spelling of the route, `/file/<path>` (it passed the check: a team's run)
        older = httpx.get(
            f"{team.url}/gradio_api/file/{path.lstrip('/')}",
            headers={"X-API-Key": team.keys["b"]},
            timeout=30,
        )
        assert older.status_code == 404 and team.prompt not in older.content, who


def test_a_result_the_page_plays_is_its_makers_alone(team):
    audio, *_ = ui_client(team, "a").predict(team.voice_ids["carol"], "你好。", api_name="/voice_preview")
    path = audio["path"] if isinstance(audio, dict) else audio
    fetched = {
        who: httpx.get(
            f"{team.url}/gradio_api/file={path}", headers={"X-API-Key": team.keys[who]}, timeout=30
        )
        for who in ("a", "b", "admin")
    }
    assert fetched["a"].status_code == fetched["admin"].status_code == 200
    assert fetched["a"].content[:4] == b"RIFF" and fetched["b"].status_code == 404


def test_a_user_key_manages_its_own_voices_in_the_ui(team, shared_dir):
    b = ui_client(team, "b")
    prompt = handle_file(str(shared_dir / "audio" / "prompt_zh_24k.wav"))
    # the same name as A's voice: names are per owner, and nothing tells B that A has one
    enrol = {"voice_name": "carol", "path": prompt, "said": PROMPT_TRANSCRIPT, "api_name": "/voice_enrol"}
    with pytest.raises(Exception, match=r"consent|同意确认"):  # a user key confirms the consent statement
        b.predict(**enrol)
    status, *_ = b.predict(consent=True, **enrol)
    assert "carol" in status
    a_owner = team.service.voices.get(team.voice_ids["carol"]).owner
    own = next(v for v in team.service.voices.list() if v.name == "carol" and v.owner != a_owner)
    assert own.shared is False and own.owner is not None
    assert (
        own.consent["by"] == "b"
        and own.consent["statement"] == team.service.settings.auth.voice_consent_statement
    )
    rows = table_rows(b.predict(None, api_name="/voices_refresh"))
    assert rows["carol"][2] in YOURS and rows["carol"][1] == PROMPT_TRANSCRIPT
    b.predict(None, api_name="/voices_refresh")  # the picker now offers it
    renamed = b.predict(own.id, "dora", api_name="/voice_rename")
    assert "dora" in renamed[0]
    a_rows = table_rows(ui_client(team, "a").predict(None, api_name="/voices_refresh"))
    assert "dora" not in a_rows and a_rows["carol"][2] in YOURS  # A's own carol, untouched
    deleted = b.predict(own.id, api_name="/voice_delete")
    assert "dora" in deleted[0]
    assert all(v.id != own.id for v in team.service.voices.list())


def test_rename_and_delete_show_only_for_a_voice_one_may_change(team):
    """Picking a voice in the library: a shared voice that is not the user's own hides Rename and Delete
    (they could only be refused); the owner and admins keep them."""
    from types import SimpleNamespace

    from cosyserve.ui.bridge import UiBridge
    from cosyserve.ui.library_tab import _LibraryActions

    actions = _LibraryActions(SimpleNamespace(bridge=UiBridge(team.service)), [])
    carol, alice = team.voice_ids["carol"], team.voice_ids["alice"]

    def shown(who: str, voice_id: str) -> list[bool]:
        request = SimpleNamespace(headers={"X-API-Key": team.keys[who]}, cookies={})
        updates = actions.manageable(voice_id, request)
        return [update["visible"] for update in updates]

    assert shown("b", alice) == [False, False, False, False]  # shared with b, not b's
    assert shown("a", carol) == [True, False, True, True]  # its own (the delete confirmation stays hidden)
    assert shown("a", alice) == [False, False, False, False]
    assert shown("admin", alice) == [True, False, True, True]
    assert shown("admin", carol) == [True, False, True, True]
    assert shown("b", carol) == [True, False, True, True]  # not b's to see: pressing says "no voice"


def test_your_batches_are_your_own(team):
    """The Batch tab's "Your batches" and the batch it opens, for a, b and the admin at once: each lists
    only its own (the admin too: everyone's are the API's), and a's batch id opened by b is not found."""
    from types import SimpleNamespace

    import gradio as gr

    from cosyserve.ui.batch_tab import _BatchActions
    from cosyserve.ui.bridge import BatchBridge, UiBridge

    made = {}
    for who in ("a", "b"):
        response = httpx.post(
            f"{team.url}/v1/batches",
            headers={"X-API-Key": team.keys[who]},
            json={"voice": team.voice_ids["alice"], "items": [f"{who}的一句。"]},
            timeout=60,
        )
        assert response.status_code == 202, response.text
        made[who] = response.json()["id"]
    bridge = UiBridge(team.service)
    actions = _BatchActions(
        SimpleNamespace(bridge=bridge, cache_dir="/nonexistent"), BatchBridge(bridge), None
    )

    def as_(who: str) -> SimpleNamespace:
        return SimpleNamespace(headers={"X-API-Key": team.keys[who]}, cookies={})

    for who in ("a", "b", "admin"):
        *_, listed = actions.reopen("en", None, as_(who))
        ids = [value for _, value in listed["choices"]]
        assert ids == ([made[who]] if who in made else []), (who, ids)
    current, progress, *_ = actions.open("en", made["a"], as_("a"))
    assert current == made["a"] and made["a"] in progress
    with pytest.raises(gr.Error, match="no batch"):
        actions.open("en", made["a"], as_("b"))
    with pytest.raises(gr.Error, match="no batch"):
        actions.reopen("en", made["a"], as_("b"))


def test_the_page_config_names_no_voice(team):
    """The config every visitor's page loads (also after a restart, when voices already exist as the page
    is built) lists no voice and no transcript: each caller's voices come with its own load event.
    (The file's last test: its second app stops the shared service as its client closes.)"""
    from fastapi.testclient import TestClient

    from cosyserve.api.app import create_app
    from cosyserve.ui.app import mount_ui

    live = httpx.get(f"{team.url}/config", headers={"X-API-Key": team.keys["b"]}, timeout=30)
    app = create_app(team.service)
    mount_ui(app, team.service)  # built now, with voices in the library: as after a restart
    with TestClient(app) as client:
        rebuilt = client.get("/config", headers={"X-API-Key": team.keys["b"]})
    for response in (live, rebuilt):
        assert response.status_code == 200
        body = response.text
        for secret in ("carol", "alice", PROMPT_TRANSCRIPT, SHARED_TRANSCRIPT, *team.voice_ids.values()):
            assert secret not in body
