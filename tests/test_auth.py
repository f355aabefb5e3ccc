"""API keys, rate limits, quotas, password hashes, signed URLs and the keys CLI (UI sessions:
test_ui_sessions.py)."""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import json
import threading
from pathlib import Path
from urllib.parse import parse_qs

import pytest
import sqlalchemy as sa

from cosyserve.commands.keys import add_keys_parser
from cosyserve.errors import InputError
from cosyserve.service.access import signing
from cosyserve.service.access.limits import QuotaTracker, RateLimiter
from cosyserve.service.access.sessions import PasswordHasher, check_password
from cosyserve.service.stores.keys import ApiKey, KeyNotFound, KeyStore

SECRET = "s" * 32
T0 = 1_735_732_800.0  # 2025-01-01 12:00:00 UTC


class FakeClock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def memory_engine() -> sa.Engine:
    return sa.create_engine(
        "sqlite://", poolclass=sa.pool.StaticPool, connect_args={"check_same_thread": False}
    )


@pytest.fixture
def store() -> KeyStore:
    return KeyStore(memory_engine(), sa.MetaData(), clock=FakeClock())


# -- API keys ----------------------------------------------------------------------------------------


def test_create_authenticate_revoke(store: KeyStore) -> None:
    record, plaintext = store.create("frontend", "user", rate_limit=10, quota=600)
    assert plaintext.startswith("cs_") and len(plaintext) == 46
    assert record.prefix == plaintext[:11] and record.role == "user" and record.active
    assert record.rate_limit_per_minute == 10 and record.daily_audio_seconds_quota == 600
    found = store.authenticate(plaintext)
    assert found is not None and found.id == record.id and found.last_used_at == T0
    revoked = store.revoke(record.prefix)
    assert revoked.revoked_at == T0 and not revoked.active
    assert store.authenticate(plaintext) is None
    assert store.revoke(str(record.id)).revoked_at == T0  # idempotent


def test_wrong_and_malformed_keys_are_refused(store: KeyStore) -> None:
    _, plaintext = store.create("a")
    tampered = plaintext[:-1] + ("A" if plaintext[-1] != "A" else "B")  # right prefix, wrong key
    for attempt in (tampered, "", None, "cs_short", plaintext + "x", "Bearer " + plaintext, "cs_" + "A" * 43):
        assert store.authenticate(attempt) is None


def test_only_hashes_are_stored(store: KeyStore) -> None:
    _, plaintext = store.create("secretive", "admin")
    with store.engine.connect() as conn:
        rows = [tuple(map(str, row)) for row in conn.execute(sa.select(store.table))]
    dump = " ".join(" ".join(row) for row in rows)
    assert plaintext not in dump and plaintext[11:] not in dump
    assert hashlib.sha256(plaintext.encode()).hexdigest() in dump


def test_list_and_revoke_errors(store: KeyStore) -> None:
    first, _ = store.create("one", "admin")
    store._clock.now += 1  # (keys list in the order they were made)
    second, _ = store.create("two")
    store.revoke(second.id)
    assert [k.name for k in store.list()] == ["one", "two"]
    assert [k.name for k in store.list(include_revoked=False)] == ["one"]
    assert first.is_admin and "hash" not in first.public()
    with pytest.raises(KeyNotFound):
        store.revoke("999")
    with pytest.raises(KeyNotFound):
        store.revoke("cs_nothere0")
    with pytest.raises(KeyNotFound):
        store.revoke("drop table")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"name": ""}, "name"), ({"name": "x", "role": "root"}, "role"),
     ({"name": "x", "rate_limit": -1}, "rate"), ({"name": "x", "quota": 0}, "quota")],
)  # fmt: skip
def test_create_validates(store: KeyStore, kwargs: dict, message: str) -> None:
    with pytest.raises(InputError, match=message):
        store.create(**kwargs)


def test_last_used_is_written_at_most_once_a_minute() -> None:
    clock = FakeClock()
    store = KeyStore(memory_engine(), sa.MetaData(), clock=clock)
    _, plaintext = store.create("k")
    assert store.authenticate(plaintext).last_used_at == T0
    clock.now += 30
    assert store.authenticate(plaintext).last_used_at == T0
    clock.now += 31
    assert store.authenticate(plaintext).last_used_at == T0 + 61


def test_stores_share_one_metadata_and_database(tmp_path: Path) -> None:
    engine, metadata = sa.create_engine(f"sqlite:///{tmp_path / 'db.sqlite'}"), sa.MetaData()
    keys = KeyStore(engine, metadata)
    QuotaTracker(engine, metadata)
    record, plaintext = keys.create("k")
    again = KeyStore(engine, metadata)  # same tables, defined once
    assert again.authenticate(plaintext).id == record.id
    assert {"api_keys", "audio_usage"} <= set(sa.inspect(engine).get_table_names())


# -- rate limits and quotas ----------------------------------------------------------------------------


def key_with(rate: int | None = None, quota: float | None = None, key_id: int = 1) -> ApiKey:
    return ApiKey(key_id, "k", "cs_abcdefgh", "user", T0, None, rate, quota, None)


def test_rate_limiter_token_bucket() -> None:
    clock = FakeClock(0.0)
    limiter = RateLimiter(default_per_minute=60, clock=clock)
    key = key_with(rate=6)  # one token per 10 s, burst of 6
    assert [limiter.acquire(key) for _ in range(6)] == [0.0] * 6
    assert limiter.acquire(key) == pytest.approx(10.0)
    clock.now = 5.0
    assert limiter.acquire(key) == pytest.approx(5.0)  # refused calls take nothing
    clock.now = 10.0
    assert limiter.acquire(key) == 0.0
    assert limiter.acquire(key_with(rate=6, key_id=2)) == 0.0  # separate buckets
    assert limiter.acquire("ip:127.0.0.1") == 0.0  # strings get the default
    assert limiter.acquire(key_with(rate=0)) == 0.0  # 0: unlimited
    assert RateLimiter(default_per_minute=None).acquire("anyone") == 0.0
    reads = [limiter.acquire(key, read=True) for _ in range(61)]  # a bucket of its own, 10x the size
    assert reads[:60] == [0.0] * 60 and reads[60] == pytest.approx(1.0)


def test_a_raised_rate_limit_takes_effect_at_once() -> None:
    """The bucket kept the old limit's count: raised from 2 to 60 a minute, a key got 429 after a few."""
    clock = FakeClock(0.0)
    limiter = RateLimiter(default_per_minute=60, clock=clock)
    assert [limiter.acquire(key_with(rate=2)) for _ in range(2)] == [0.0, 0.0]
    assert limiter.acquire(key_with(rate=2)) > 0  # used up
    assert [limiter.acquire(key_with(rate=60)) for _ in range(58)] == [0.0] * 58  # 60 less the 2 used
    assert limiter.acquire(key_with(rate=60)) > 0
    assert limiter.acquire(key_with(rate=10)) > 0  # lowered below what was used: nothing left this minute


def test_limits_out_of_range_are_refused_not_stored(store: KeyStore) -> None:
    """A huge rate limit was a 500 (SQLite's INTEGER overflowed), an infinite quota read as "default"."""
    for quota in (float("inf"), float("nan"), 0, -1, True, 1e12):
        with pytest.raises(InputError, match="quota must be"):
            store.create("k", quota=quota)  # type: ignore[arg-type]
    for rate in (10**20, -1, True):
        with pytest.raises(InputError, match="rate limit must be"):
            store.create("k", rate_limit=rate)
    key, _ = store.create("k", quota=600, rate_limit=30)
    with pytest.raises(InputError, match="quota must be"):
        store.update(key.id, quota=float("inf"))
    assert store.update(key.id, quota=None, rate_limit=0).rate_limit_per_minute == 0


def test_rate_limiter_is_thread_safe() -> None:
    limiter = RateLimiter(default_per_minute=100, clock=lambda: 0.0)
    allowed = []

    def hammer() -> None:
        allowed.extend(limiter.acquire("shared") == 0.0 for _ in range(50))

    threads = [threading.Thread(target=hammer) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(allowed) == 100


def test_quota_persists_across_restarts_and_resets_at_utc_midnight(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'usage.db'}"
    clock = FakeClock()
    tracker = QuotaTracker(sa.create_engine(url), sa.MetaData(), clock=clock)
    key = key_with(quota=100.0)
    assert tracker.check(key, 60).allowed
    assert tracker.add(key, 60.0) == 60.0
    assert tracker.add(key.id, 30.5) == 90.5
    status = tracker.check(key, 20)
    assert not status.allowed and status.used_s == 90.5 and status.remaining_s == pytest.approx(9.5)
    assert status.resets_at == T0 + 12 * 3600  # next UTC midnight

    reopened = QuotaTracker(sa.create_engine(url), sa.MetaData(), clock=clock)  # a restarted server
    assert reopened.used(key) == 90.5
    assert not reopened.check(key, 20).allowed
    clock.now += 12 * 3600  # the next UTC day
    assert reopened.used(key) == 0.0 and reopened.check(key, 20).allowed


def test_quota_defaults_and_unlimited() -> None:
    tracker = QuotaTracker(memory_engine(), sa.MetaData(), default_daily_seconds=10.0, clock=FakeClock())
    tracker.add(1, 8.0)
    assert not tracker.check(key_with(), 5).allowed  # the server default applies
    assert tracker.check(key_with(quota=50), 5).allowed  # the key's own quota wins
    unlimited = QuotaTracker(tracker.engine, sa.MetaData(), clock=FakeClock())
    status = unlimited.check(key_with(), 1e9)
    assert status.allowed and status.limit_s is None
    with pytest.raises(InputError):
        tracker.add(1, -1)


# -- passwords and sessions ----------------------------------------------------------------------------


def test_password_hasher() -> None:
    hasher = PasswordHasher(n=2**10)  # cheap for the test; the default is 2**14
    encoded = hasher.hash("correct horse")
    assert encoded.startswith("scrypt$1024$8$1$") and "correct" not in encoded
    assert hasher.verify("correct horse", encoded)
    assert not hasher.verify("correct horsE", encoded)
    assert hasher.hash("correct horse") != encoded  # salted
    # Change a middle character: the last one of unpadded base64 partly holds padding bits.
    flipped = encoded[:-5] + ("A" if encoded[-5] != "A" else "B") + encoded[-4:]
    for broken in ("", "scrypt$", "scrypt$x$8$1$aa$bb", "md5$abc", encoded[:-30], flipped):
        assert not hasher.verify("correct horse", broken)


def test_pbkdf2_hashes_from_other_tools_are_accepted() -> None:
    derived = hashlib.pbkdf2_hmac("sha256", b"pw", b"salty", 1000)
    encoded = f"pbkdf2_sha256$1000$salty${base64.b64encode(derived).decode()}"
    assert PasswordHasher().verify("pw", encoded) and not PasswordHasher().verify("px", encoded)
    assert check_password(encoded, "pw")


def test_check_password_plain_or_hashed() -> None:
    assert check_password("plain", "plain") and not check_password("plain", "plain ")
    hashed = PasswordHasher(n=2**10).hash("pw")
    assert check_password(hashed, "pw") and not check_password(hashed, hashed)


# -- signed URLs ---------------------------------------------------------------------------------------


def test_signed_urls_verify_and_resist_tampering() -> None:
    path = "/v1/outputs/output_20250101_120000"
    query = parse_qs(signing.sign(path, int(T0) + 60, SECRET))
    exp, sig = query["exp"][0], query["sig"][0]
    assert signing.verify(path, exp, sig, SECRET, now=T0)
    assert not signing.verify(path, exp, sig, SECRET, now=T0 + 60)  # expired
    assert not signing.verify(path + "_1", exp, sig, SECRET, now=T0)  # another file
    assert not signing.verify(path, str(int(exp) + 3600), sig, SECRET, now=T0)  # extended
    assert not signing.verify(path, exp, sig[:-1] + ("A" if sig[-1] != "A" else "B"), SECRET, now=T0)
    assert not signing.verify(path, exp, sig, "x" * 32, now=T0)  # another secret
    for bad_exp, bad_sig in ((None, sig), ("abc", sig), ("-1", sig), (exp, None), (exp, ""), (exp, "é")):
        assert not signing.verify(path, bad_exp, bad_sig, SECRET, now=T0)
    # A URL signature is not a session token for the same value.
    assert signing.verify_token(f"{path}.{exp}.{sig}", SECRET, now=T0) is None


def test_signed_url_helper() -> None:
    url = signing.signed_url("/v1/outputs/x", 900, SECRET, now=T0)
    path, query = url.split("?")
    params = parse_qs(query)
    assert params["exp"] == [str(int(T0) + 900)]
    assert signing.verify(path, params["exp"][0], params["sig"][0], SECRET, now=T0 + 899)


# -- keys CLI ------------------------------------------------------------------------------------------


def run_cli(store: KeyStore, *argv: str) -> str:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    add_keys_parser(sub, lambda args: store)
    args = parser.parse_args(argv)
    out = io.StringIO()
    from cosyserve.commands.keys import run_keys_command

    assert run_keys_command(args, store, out=out) == 0
    return out.getvalue()


def test_keys_cli_create_list_revoke(store: KeyStore, capsys: pytest.CaptureFixture[str]) -> None:
    ticks = iter(range(int(T0), int(T0) + 10_000))
    store._clock = lambda: float(next(ticks))  # keys made one after another (they list in that order)
    created = run_cli(store, "keys", "create", "web", "--role", "admin", "--rate-limit", "30")
    plaintext = created.strip().splitlines()[-1]
    assert plaintext.startswith("cs_") and "shown only now" in created
    assert store.authenticate(plaintext).is_admin
    listing = run_cli(store, "keys", "list")
    assert "web" in listing and plaintext[:11] in listing and plaintext not in listing and "admin" in listing
    assert run_cli(store, "keys", "create", "bot", "--quiet").strip().startswith("cs_")
    assert run_cli(store, "keys", "revoke", plaintext[:11]).strip().endswith(") revoked")
    web = store.authenticate(plaintext) or next(k for k in store.list() if k.name == "web")
    assert "was already revoked" in run_cli(store, "keys", "revoke", str(web.id))  # not "revoked" once more
    rows = json.loads(run_cli(store, "keys", "list", "--json"))
    assert [r["name"] for r in rows] == ["web", "bot"] and rows[0]["revoked_at"] is not None
    twin = store.create("twin")[0], store.create("twin")[0]
    with pytest.raises(KeyNotFound, match=rf"2 active keys are named 'twin': {twin[0].id} \(cs_"):
        run_cli(store, "keys", "revoke", "twin")  # which one? the error names both
    bot = next(k for k in store.list() if k.name == "bot")
    assert run_cli(store, "keys", "revoke", "bot").startswith(f"key {bot.id} (bot, cs_")  # by its name
    with pytest.raises(KeyNotFound, match="no active key's name"):
        run_cli(store, "keys", "revoke", "bot")
    assert "web" not in run_cli(store, "keys", "list", "--active")
    old = run_cli(store, "keys", "create", "robot", "--quiet").strip()
    robot = store.authenticate(old)
    said = run_cli(store, "keys", "rotate", "robot")  # by name, id or prefix, as revoke takes them
    new = said.strip().splitlines()[-1]
    assert f"key {robot.id} (robot) has a new secret" in said and new.startswith("cs_")
    assert store.authenticate(old) is None and store.authenticate(new).id == robot.id
    assert run_cli(store, "keys", "rotate", str(robot.id), "--quiet").strip().startswith("cs_")
    # The `func` the CLI dispatches to opens the store through `get_store`.
    parser = argparse.ArgumentParser()
    add_keys_parser(parser.add_subparsers(dest="command"), lambda args: store)
    args = parser.parse_args(["keys", "list"])
    assert args.func(args) == 0 and "bot" in capsys.readouterr().out


def test_a_damaged_key_or_voice_row_does_not_break_its_listing(tmp_path: Path) -> None:
    """A key row with a text where a number goes failed `keys list` and GET /admin/keys; a voice row with
    damaged JSON made its owner's GET /v1/voices a 500."""
    import sqlalchemy as sa

    from cosyserve.service.stores.db import make_engine
    from cosyserve.service.stores.keys import KeyStore
    from cosyserve.service.stores.voice_fields import stored_defaults, stored_json

    engine = make_engine(f"sqlite:///{tmp_path / 'cosyserve.db'}")
    keys = KeyStore(engine, sa.MetaData())
    key, _ = keys.create("alice", role="user")
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE api_keys SET rate_limit_per_minute = 'lots', created_at = 'x'"))
    (listed,) = keys.list()
    assert listed.id == key.id and listed.rate_limit_per_minute is None and listed.created_at == 0.0
    row = {"id": "v1", "defaults": "{bad", "report": json.dumps({"duration_s": 3.0})}
    assert stored_defaults(row).instruct is None and stored_json(row, "report", {}) == {"duration_s": 3.0}
    newer = {"id": "v2", "defaults": json.dumps({"speed": 1.25, "from_a_newer_version": 1})}
    assert stored_defaults(newer).speed == 1.25


def test_a_key_never_gets_the_id_of_a_key_made_before_it(tmp_path: Path) -> None:
    """Owners are `key:<id>` in outputs' files and the bucket: a database restored from an older backup
    (or a deleted row) gave the next key the id of a key made after the backup, and with it that key's
    outputs. Ids are random now, not counted on from the highest one left."""
    import shutil

    path = tmp_path / "keys.db"
    store = KeyStore(sa.create_engine(f"sqlite:///{path}"), sa.MetaData())
    store.create("alice")
    store.engine.dispose()
    shutil.copy(path, tmp_path / "backup.db")
    carol, _ = store.create("carol")  # made after the backup: her outputs name key:<carol.id>
    store.engine.dispose()
    shutil.copy(tmp_path / "backup.db", path)  # the backup restored
    restored = KeyStore(sa.create_engine(f"sqlite:///{path}"), sa.MetaData())
    dave, _ = restored.create("dave")
    assert dave.id != carol.id and 1 <= dave.id <= 2**31 - 1
    assert [key.name for key in restored.list()] == ["alice", "dave"]  # listed as they were made
