"""Server-side UI sessions: the store (hashed tokens, idle and absolute expiry) and the gate's checks of a
session against its credential at every request (revoked, deleted or re-roled keys, a changed UI login,
old signed tokens)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from cosyserve.errors import SettingsError
from cosyserve.service.access import signing
from cosyserve.service.access.gate import Access
from cosyserve.service.access.principals import AuthRequired
from cosyserve.service.settings import Settings
from cosyserve.service.stores.keys import KeyStore
from cosyserve.service.stores.ui_sessions import UiSessionStore, hash_token
from test_auth import T0, FakeClock, memory_engine

SECRET = "test-signing-secret-0123456789abcdef"
IDLE_S, MAX_S = 3600.0, 86400.0


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(clock: FakeClock) -> UiSessionStore:
    return UiSessionStore(memory_engine(), sa.MetaData(), idle_s=IDLE_S, max_age_s=MAX_S, clock=clock)


def stored_rows(store: UiSessionStore) -> list[dict]:
    with store.engine.connect() as conn:
        return [dict(row._mapping) for row in conn.execute(sa.select(store.table))]


# -- the store ---------------------------------------------------------------------------------------------


def test_tokens_are_random_and_only_their_hashes_are_stored(store: UiSessionStore) -> None:
    first, second = store.create("user", "admin"), store.create("user", "admin")
    assert first != second and len(first) == 43
    rows = stored_rows(store)
    assert {row["token_hash"] for row in rows} == {hash_token(first), hash_token(second)}
    assert not any(first in str(value) or second in str(value) for row in rows for value in row.values())
    session = store.resolve(first)
    assert (session.kind, session.subject, session.expires_at) == ("user", "admin", T0 + MAX_S)


def test_unknown_and_malformed_tokens_resolve_to_nothing(store: UiSessionStore) -> None:
    token = store.create("key", "7", "cs_abcdefgh")
    for attempt in (None, "", "x", token + "x", token[:-1] + ("A" if token[-1] != "A" else "B"), " " + token):
        assert store.resolve(attempt) is None, attempt
    assert store.resolve(token).subject == "7"


def test_idle_sessions_end_and_use_keeps_them_alive(store: UiSessionStore, clock: FakeClock) -> None:
    used, idle = store.create("user", "admin"), store.create("user", "admin")
    for _ in range(3):  # each use moves the idle deadline
        clock.now += IDLE_S * 0.8
        assert store.resolve(used) is not None
    assert store.resolve(idle) is None  # 2.4 idle periods without a request
    assert len(stored_rows(store)) == 1  # and it was deleted


def test_the_pages_own_polling_keeps_no_session_alive(store: UiSessionStore, clock: FakeClock) -> None:
    """An open, untouched tab stayed signed in for ever: its status timer and session check refreshed
    the idle deadline every few seconds (a team's run). Those resolve without touching it."""
    polled = store.create("user", "admin")
    for _ in range(2):
        clock.now += IDLE_S * 0.4
        assert store.resolve(polled, touch=False) is not None
    clock.now += IDLE_S * 0.4
    assert store.resolve(polled, touch=False) is None  # 1.2 idle periods after its last real use


async def _passive(path: str, body: dict | None = None) -> bool:
    import json

    from starlette.requests import Request

    from cosyserve.ui.login import passive

    data = json.dumps(body or {}).encode()

    async def receive() -> dict:
        return {"type": "http.request", "body": data, "more_body": False}

    fns = {3: type("Fn", (), {"api_name": "status_tick"})(), 4: type("Fn", (), {"api_name": "show"})()}
    blocks = type("Blocks", (), {"fns": fns})()
    app = type("App", (), {"get_blocks": lambda self: blocks})()
    scope = {"type": "http", "method": "POST", "path": path, "headers": [], "query_string": b"", "app": app}
    return await passive(Request(scope, receive))


def test_which_gradio_requests_are_the_pages_own() -> None:
    import asyncio

    cases = [
        ("/gradio_api/heartbeat/abc", None, True),
        ("/gradio_api/queue/data", None, True),
        ("/gradio_api/run/predict", {"fn_index": 3}, True),  # the status timer (queue=False)
        ("/gradio_api/queue/join", {"fn_index": 3}, True),
        ("/gradio_api/queue/join", {"fn_index": 4}, False),  # a user's click
        ("/gradio_api/run/batch_tick", None, True),
        ("/gradio_api/run/generate", None, False),
        ("/gradio_api/upload", None, False),
    ]
    for path, body, expected in cases:
        assert asyncio.run(_passive(path, body)) is expected, path


def test_sessions_end_at_their_absolute_expiry_however_used(store: UiSessionStore, clock: FakeClock) -> None:
    token = store.create("user", "admin")
    while clock.now + IDLE_S / 2 < T0 + MAX_S:
        clock.now += IDLE_S / 2
        assert store.resolve(token) is not None
    clock.now = T0 + MAX_S
    assert store.resolve(token) is None


def test_delete_and_delete_subject(store: UiSessionStore, clock: FakeClock) -> None:
    mine, other, user = store.create("key", "1"), store.create("key", "1"), store.create("user", "1")
    assert store.delete(mine) and not store.delete(mine) and not store.delete(None)
    assert store.resolve(mine) is None and store.resolve(other) is not None
    assert store.delete_subject("key", "1") == 1
    assert store.resolve(other) is None and store.resolve(user) is not None  # another kind, same subject
    clock.now += MAX_S
    store.create("user", "admin")  # a login sweeps out ended sessions
    assert store.count() == 1 and len(stored_rows(store)) == 1


def test_one_subject_keeps_a_bounded_number_of_sessions(store: UiSessionStore, clock: FakeClock) -> None:
    from cosyserve.service.stores.ui_sessions import MAX_SESSIONS_PER_SUBJECT

    tokens = []
    for _ in range(MAX_SESSIONS_PER_SUBJECT):
        tokens.append(store.create("key", "1"))
        clock.now += 1
    other = store.create("key", "2")
    assert store.resolve(tokens[0]) is not None  # used now: the second one is the least recently used
    clock.now += 1
    newest = store.create("key", "1")
    assert store.resolve(tokens[1]) is None and store.resolve(tokens[0]) is not None
    assert store.resolve(newest) is not None and store.resolve(other) is not None
    assert store.count() == MAX_SESSIONS_PER_SUBJECT + 1


def test_the_store_refuses_what_it_can_not_keep(store: UiSessionStore) -> None:
    with pytest.raises(ValueError, match="kind"):
        store.create("admin", "x")
    with pytest.raises(ValueError, match="subject"):
        store.create("user", "")
    with pytest.raises(ValueError, match="positive"):
        UiSessionStore(memory_engine(), sa.MetaData(), idle_s=0, max_age_s=10)


# -- the gate ------------------------------------------------------------------------------------------------


class Gate:
    """An `Access` over an in-memory database, a fake clock and settings that can be changed."""

    def __init__(self, tmp_path: Path, clock: FakeClock, **auth) -> None:
        self.tmp_path, self.clock, self.engine = tmp_path, clock, memory_engine()
        self.keys = KeyStore(self.engine, sa.MetaData(), clock=clock)
        self.sessions = UiSessionStore(
            self.engine, sa.MetaData(), idle_s=IDLE_S, max_age_s=MAX_S, clock=clock
        )
        self.access = self.with_settings(**auth)

    def with_settings(self, **auth) -> Access:
        settings = Settings(data_dir=self.tmp_path, signing_secret=SECRET, **auth)
        return Access(settings, self.keys, self.engine, sessions=self.sessions)

    def set_key_column(self, key_id: int, **values) -> None:
        with self.engine.begin() as conn:
            conn.execute(self.keys.table.update().where(self.keys.table.c.id == key_id).values(**values))


@pytest.fixture
def gate(tmp_path: Path, clock: FakeClock) -> Gate:
    return Gate(tmp_path, clock, ui_username="admin", ui_password="correct horse")


def test_a_key_login_gives_a_session_that_is_not_the_key(gate: Gate) -> None:
    record, plaintext = gate.keys.create("alice", "user")
    key, token = gate.access.key_login(plaintext)
    assert key.id == record.id and plaintext not in token and token not in plaintext
    assert not any(plaintext in str(v) for row in stored_rows(gate.sessions) for v in row.values())
    principal = gate.access.identify(None, token)
    assert (principal.kind, principal.role, principal.name, principal.key.id) == (
        "key",
        "user",
        "alice",
        key.id,
    )
    assert principal.owner == f"key:{key.id}"  # the same owner as the key itself: the same history
    with pytest.raises(AuthRequired, match="not valid"):
        gate.access.key_login("cs_" + "x" * 43)


def test_a_header_key_wins_over_the_session(gate: Gate) -> None:
    _, alice = gate.keys.create("alice", "user")
    _, bob = gate.keys.create("bob", "user")
    _, token = gate.access.key_login(alice)
    assert gate.access.identify(bob, token).name == "bob"
    # a key that is not valid is refused, not replaced by the browser's sign-in (behind an HTTP-auth
    # proxy, a page on another site had the cookie act with a header it did not choose)
    assert gate.access.identify("cs_" + "x" * 43, token) is None


def test_a_role_change_ends_the_keys_sessions(gate: Gate) -> None:
    record, plaintext = gate.keys.create("alice", "admin")
    _, token = gate.access.key_login(plaintext)
    assert gate.access.identify(None, token).is_admin
    gate.set_key_column(record.id, role="user")  # demoted: the admin session must not live on
    assert gate.access.identify(None, token) is None
    _, token = gate.access.key_login(plaintext)
    principal = gate.access.identify(None, token)
    assert principal.role == "user" and not principal.is_admin
    gate.set_key_column(record.id, role="admin")
    assert gate.access.identify(None, token) is None


def test_revoking_the_key_ends_its_sessions(gate: Gate) -> None:
    record, plaintext = gate.keys.create("alice", "user")
    _, token = gate.access.key_login(plaintext)
    gate.keys.revoke(record.id)
    assert gate.access.identify(None, token) is None
    assert stored_rows(gate.sessions) == []  # deleted on the way


def test_a_deleted_keys_session_does_not_pass_to_a_key_with_its_id(gate: Gate) -> None:
    record, plaintext = gate.keys.create("alice", "admin")
    _, token = gate.access.key_login(plaintext)
    with gate.engine.begin() as conn:
        conn.execute(gate.keys.table.delete().where(gate.keys.table.c.id == record.id))
    later, _ = gate.keys.create("mallory", "user")
    if later.id != record.id:  # SQLite hands the freed id out again; make sure of it
        gate.set_key_column(later.id, id=record.id)
    assert gate.access.identify(None, token) is None


def test_password_sessions_end_when_the_ui_login_changes(gate: Gate) -> None:
    token = gate.access.login("admin", "correct horse")
    principal = gate.access.identify(None, token)
    assert (principal.kind, principal.role, principal.name) == ("session", "admin", "admin")
    with pytest.raises(AuthRequired):
        gate.access.login("admin", "wrong")
    same = gate.with_settings(ui_username="admin", ui_password="correct horse")  # a restart
    assert same.identify(None, token).name == "admin"
    renamed = gate.with_settings(ui_username="root", ui_password="correct horse")
    assert renamed.identify(None, token) is None
    token = gate.access.login("admin", "correct horse")
    new_password = gate.with_settings(ui_username="admin", ui_password="battery staple")
    assert new_password.identify(None, token) is None
    token = gate.access.login("admin", "correct horse")
    gate.keys.create("ops", "admin")  # auth stays on without the UI login
    assert gate.with_settings().identify(None, token) is None


def test_a_user_name_need_not_be_ascii(tmp_path: Path, clock: FakeClock) -> None:
    gate = Gate(tmp_path, clock, ui_username="管理员", ui_password="密码 correct horse")
    token = gate.access.login("管理员", "密码 correct horse")
    assert gate.access.identify(None, token).name == "管理员"
    assert (
        gate.with_settings(ui_username="管理", ui_password="密码 correct horse").identify(None, token) is None
    )


def test_logout_ends_the_session(gate: Gate) -> None:
    token = gate.access.login("admin", "correct horse")
    gate.access.logout(token)
    assert gate.access.identify(None, token) is None
    gate.access.logout(token)  # twice, or without a session: nothing to do
    gate.access.logout(None)


def test_old_signed_session_tokens_are_refused(gate: Gate) -> None:
    old = signing.sign_token("admin", int(time.time()) + 3600, SECRET)
    assert gate.access.identify(None, old) is None


def test_the_cookie_carries_the_lifetime_and_flags(gate: Gate) -> None:
    cookie = gate.access.session_cookie("t", secure=True)
    assert cookie["max_age"] == Settings().auth.ui_session_max_s == 30 * 86400
    assert cookie["httponly"] and cookie["secure"] and cookie["samesite"] == "lax" and cookie["path"] == "/"
    assert gate.access.session_cookie("t", secure=False)["secure"] is False


def test_a_weak_signing_secret_is_refused_at_start(tmp_path: Path, clock: FakeClock) -> None:
    gate = Gate(tmp_path, clock)
    with pytest.raises(SettingsError):
        Access(Settings(data_dir=tmp_path, signing_secret="short"), gate.keys, gate.engine)


def test_session_lifetimes_are_settings(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path, signing_secret=SECRET, ui_session_idle_s=600, ui_session_max_s=7200
    )
    access = Access(settings, KeyStore(memory_engine(), sa.MetaData()), memory_engine())
    assert (access.sessions.idle_s, access.sessions.max_age_s) == (600, 7200)
    with pytest.raises(SettingsError, match="ui_session_idle_s"):
        Settings(ui_session_idle_s=10)


def test_the_store_on_sqlite_and_postgresql(database_url: str, clock: FakeClock) -> None:
    from cosyserve.service.stores.db import make_engine
    from cosyserve.service.stores.ui_sessions import MAX_SESSIONS_PER_SUBJECT

    engine = make_engine(database_url)
    try:
        store = UiSessionStore(engine, sa.MetaData(), idle_s=IDLE_S, max_age_s=MAX_S, clock=clock)
        again = UiSessionStore(engine, sa.MetaData(), idle_s=IDLE_S, max_age_s=MAX_S, clock=clock)
        tokens = []
        for _ in range(MAX_SESSIONS_PER_SUBJECT + 1):
            tokens.append(store.create("user", "管理员", "b" * 32))
            clock.now += 1
        assert again.resolve(tokens[0]) is None  # one too many: the oldest went
        assert again.resolve(tokens[-1]).subject == "管理员"
        clock.now += IDLE_S
        assert store.resolve(tokens[-1]) is None
        assert store.delete_subject("user", "管理员") == MAX_SESSIONS_PER_SUBJECT - 1
    finally:
        engine.dispose()
