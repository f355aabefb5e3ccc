"""Several nodes, one database and one bucket, no shared disk: voices, jobs, keys and outputs reach
every node (SQLite file and a throwaway PostgreSQL for the database, moto's S3 server for the bucket)."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
import torch

from cosyserve.errors import InputError, JobStateError
from cosyserve.frontend.prompt_features import PromptFeatures
from cosyserve.service.access.limits import QuotaTracker
from cosyserve.service.stores.batches import BatchStore
from cosyserve.service.stores.db import make_engine
from cosyserve.service.stores.jobs import JobStore
from cosyserve.service.stores.keys import KeyStore
from cosyserve.service.stores.outputs import BUCKET_COPY, OutputNotFound, OutputStore
from cosyserve.service.stores.voices import (
    VoiceDefaults,
    VoiceFilesMissing,
    VoiceLibrary,
    VoiceNotFound,
    VoiceScope,
    voice_files_table,
    voices_table,
)

AUDIO = b"RIFF" + bytes(range(256)) * 40


# ---- databases ----------------------------------------------------------------------------------------


@pytest.fixture
def engines(database_url: str) -> Iterator[tuple[sa.Engine, sa.Engine]]:
    """Two engines on the same database: node A's and node B's connection pools."""
    pair = (make_engine(database_url), make_engine(database_url))
    yield pair
    for engine in pair:
        engine.dispose()


class FakeAnalyser:
    """Small deterministic PromptFeatures (a function of the audio and a salt), counting its calls."""

    def __init__(self, salt: int = 0) -> None:
        self.salt, self.calls = salt, 0

    def __call__(self, audio: bytes) -> PromptFeatures:
        self.calls += 1
        generator = torch.Generator().manual_seed(len(audio) + self.salt)
        feat = torch.randn(1, 4, 80, generator=generator)
        return PromptFeatures(
            speech_feat=feat,
            speech_feat_len=torch.tensor([4], dtype=torch.int32),
            speech_token=torch.randint(0, 6561, (1, 2), generator=generator, dtype=torch.int32),
            embedding=torch.randn(1, 192, generator=generator),
        )


def same_features(a: PromptFeatures, b: PromptFeatures) -> bool:
    return all(
        torch.equal(getattr(a, name), getattr(b, name))
        for name in ("speech_feat", "speech_token", "embedding")
    )


def library(root: Path, engine: sa.Engine, checksum: str = "model-1") -> VoiceLibrary:
    return VoiceLibrary(root, engine, sa.MetaData(), model_checksum=checksum)  # own metadata: own process


# ---- voices ---------------------------------------------------------------------------------------------


def test_a_voice_enrolled_on_one_node_is_used_updated_and_deleted_from_another(
    engines: tuple[sa.Engine, sa.Engine], tmp_path: Path
) -> None:
    node_a, node_b = library(tmp_path / "a", engines[0]), library(tmp_path / "b", engines[1])
    analyse = FakeAnalyser()
    enrolled = node_a.add("alice", AUDIO, analyse, transcript="hello", defaults=VoiceDefaults(seed=3))
    features_a = node_a.features(enrolled)

    seen = node_b.get("alice")
    assert seen.public() == enrolled.public() and [v.id for v in node_b.list()] == [enrolled.id]
    assert not seen.audio_path.exists()  # nothing on B's disk until it is needed
    assert node_b.audio_file(seen).read_bytes() == AUDIO
    assert node_b.audio_file(seen).parent == tmp_path / "b" / enrolled.id
    assert same_features(node_b.features(seen, analyse), features_a) and analyse.calls == 1
    assert node_b.ensure_local(seen).features_path.is_file()

    seen.audio_path.write_bytes(b"damaged")  # a local copy that differs from the database is replaced
    assert node_b.audio_file(seen).read_bytes() == AUDIO
    assert not [p for p in seen.audio_path.parent.iterdir() if p.name.startswith(".")]  # no temp files left

    with pytest.raises(VoiceNotFound):
        node_b.get("al\x00ice")  # PostgreSQL refuses NUL in text: not found, not a database error
    with pytest.raises(InputError, match="NUL"):
        node_b.update("alice", transcript="a\x00b")
    node_a.update("alice", name="alice2", lexicon={"x": "EH1 K S"})
    assert node_b.get(enrolled.id).name == "alice2" and node_b.get("alice2").lexicon == {"x": "EH1 K S"}
    with pytest.raises(InputError, match="already have a voice named"):
        node_b.add("alice2", AUDIO, analyse)

    node_a.delete("alice2")
    assert not (tmp_path / "a" / enrolled.id).exists()
    with pytest.raises(VoiceNotFound):
        node_b.get("alice2")
    with pytest.raises(VoiceNotFound):
        node_b.audio_file(seen)  # the stale Voice: its files went with it
    assert not (tmp_path / "b" / enrolled.id).exists()  # B dropped its copy lazily
    with engines[1].connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(node_b.files)).scalar_one() == 0


def test_reanalysis_for_another_model_reaches_the_other_nodes(
    engines: tuple[sa.Engine, sa.Engine], tmp_path: Path
) -> None:
    node_a = library(tmp_path / "a", engines[0], "model-1")
    voice = node_a.add("bob", AUDIO, FakeAnalyser())
    node_b = library(tmp_path / "b", engines[1], "model-1")
    old = node_b.features(node_b.get("bob"))  # B has model-1's features on disk now

    node_c = library(tmp_path / "c", engines[1], "model-2")  # a node running another model
    reanalyse = FakeAnalyser(salt=7)
    new = node_c.features(node_c.get("bob"), reanalyse)
    assert reanalyse.calls == 1 and not same_features(old, new)
    assert node_c.features(node_c.get("bob"), reanalyse) is new and reanalyse.calls == 1  # kept
    assert node_a.get("bob").model_checksum == "model-2"

    fresh_b = library(tmp_path / "b", engines[1], "model-3")  # no analyser: whatever the database holds
    assert same_features(fresh_b.features(fresh_b.get("bob")), new)  # B's stale file was replaced
    assert node_a.features(voice) is not None  # A's cache, for its own model, is still served


def test_voices_from_before_shared_files_stay_local_until_shared(
    engines: tuple[sa.Engine, sa.Engine], tmp_path: Path
) -> None:
    node_a, node_b = library(tmp_path / "a", engines[0]), library(tmp_path / "b", engines[1])
    voice = node_a.add("carol", AUDIO, FakeAnalyser())
    with engines[0].begin() as conn:  # what a database from before this change holds: rows, no blobs
        conn.execute(node_a.files.delete())
    assert node_a.audio_file(voice).read_bytes() == AUDIO  # the node with the files still works
    with pytest.raises(VoiceFilesMissing, match="enrolled before"):
        node_b.audio_file(node_b.get("carol"))
    assert node_a.share_local_files() == 1 and node_a.share_local_files() == 0
    assert node_b.audio_file(node_b.get("carol")).read_bytes() == AUDIO


def test_an_old_sqlite_database_without_the_files_table_opens(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'old.db'}")
    old = sa.MetaData()
    voices_table(old).create(engine)
    folder = tmp_path / "voices" / ("0" * 32)
    folder.mkdir(parents=True)
    (folder / "prompt.wav").write_bytes(AUDIO)
    with engine.begin() as conn:
        conn.execute(
            voices_table(old)
            .insert()
            .values(id="0" * 32, name="old", created_at=1.0, model_checksum="m", audio_file="prompt.wav")
        )
    voices = library(tmp_path / "voices", engine, "m")
    assert sa.inspect(engine).has_table(voice_files_table(sa.MetaData()).name)
    assert voices.audio_file(voices.get("old")).read_bytes() == AUDIO
    engine.dispose()


def test_voices_from_before_owners_become_shared(tmp_path: Path, database_url: str) -> None:
    """A voices table made before voices had owners gains the column; its voices are shared by all."""
    engine = make_engine(database_url)
    before = sa.Table(  # the voices table as it was made before owners
        "voices",
        sa.MetaData(),
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(64), nullable=False, unique=True),
        sa.Column("transcript", sa.Text, nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("model_checksum", sa.String(64), nullable=False),
        sa.Column("audio_file", sa.String(255), nullable=False),
        *(sa.Column(name, sa.Text, nullable=False) for name in ("defaults", "lexicon", "report")),
    )
    before.create(engine)
    with engine.begin() as conn:
        conn.execute(
            before.insert().values(
                id="1" * 32,
                name="legacy",
                created_at=1.0,
                model_checksum="m",
                audio_file="prompt.wav",
                defaults="{}",
                lexicon="{}",
                report="{}",
            )
        )
    voices = library(tmp_path / "voices", engine, "m")
    assert "owner" in {c["name"] for c in sa.inspect(engine).get_columns("voices")}
    user_scope = VoiceScope(owner="key:some-user", everything=False)
    assert voices.get("legacy", user_scope).owner is None
    own = voices.add("mine", AUDIO, FakeAnalyser(), owner="key:some-user")
    assert [v.name for v in voices.list(VoiceScope(owner="key:another", everything=False))] == ["legacy"]
    assert {v.name for v in voices.list(user_scope)} == {"legacy", "mine"} and own.owner == "key:some-user"
    with pytest.raises(VoiceNotFound):
        voices.get("mine", VoiceScope(owner="key:another", everything=False))
    library(tmp_path / "voices2", engine, "m")  # a second process opening it adds nothing twice
    # the old server-wide UNIQUE(name) is gone: names are unique per owner (legacy voices have none)
    theirs = voices.add("mine", AUDIO, FakeAnalyser(), owner="key:another")
    assert theirs.id != own.id and voices.get("mine", user_scope).id == own.id
    with pytest.raises(InputError, match="already have a voice named"):
        voices.add("mine", AUDIO, FakeAnalyser(), owner="key:another")
    with pytest.raises(InputError, match="already have a voice named"):
        voices.add("legacy", AUDIO, FakeAnalyser())
    with pytest.raises(InputError, match="by its id"):
        voices.get("mine")  # an admin asking by name: two owners have one
    assert voices.features(own) is not None  # its files survived the table's rebuild
    engine.dispose()


def test_orphaned_local_copies_are_pruned(engines: tuple[sa.Engine, sa.Engine], tmp_path: Path) -> None:
    node_a, node_b = library(tmp_path / "a", engines[0]), library(tmp_path / "b", engines[1])
    keep = node_a.add("keep", AUDIO, FakeAnalyser())
    gone = node_a.add("gone", AUDIO + b"x", FakeAnalyser())
    for voice in (keep, gone):
        node_b.ensure_local(node_b.get(voice.id))
    node_a.delete(gone.id)
    assert node_b.prune_local(grace_s=3600) == []  # young folders may be enrolments in progress
    assert node_b.prune_local(grace_s=0) == [gone.id]
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == [keep.id]


# ---- jobs and keys on PostgreSQL ------------------------------------------------------------------------


@pytest.fixture
def pg_engines(postgres_url: str) -> Iterator[tuple[sa.Engine, sa.Engine]]:
    pair = (make_engine(postgres_url), make_engine(postgres_url))
    yield pair
    for engine in pair:
        engine.dispose()
    engine = make_engine(postgres_url)
    tables = sa.MetaData()
    tables.reflect(engine)
    tables.drop_all(engine)
    engine.dispose()


def test_postgresql_engine_settings(postgres_url: str) -> None:
    engine = make_engine(postgres_url.replace("postgresql+psycopg://", "postgres://"))
    assert engine.dialect.name == "postgresql" and engine.dialect.driver == "psycopg"
    assert engine.pool.size() >= 5 and engine.pool._pre_ping  # no SQLite pool or pragmas
    with engine.connect() as conn:
        assert conn.execute(sa.text("select 1")).scalar_one() == 1
    engine.dispose()


def test_nodes_starting_at_once_create_the_tables_once(
    pg_engines: tuple[sa.Engine, sa.Engine], tmp_path: Path
) -> None:
    url = pg_engines[0].url.render_as_string(hide_password=False)
    engines = [make_engine(url) for _ in range(6)]  # six nodes, on a database without tables yet
    barrier, errors = threading.Barrier(len(engines)), []

    def start(i: int) -> None:
        barrier.wait()
        try:
            library(tmp_path / str(i), engines[i])
        except Exception as exc:  # "relation already exists" without create_tables' lock
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(i,)) for i in range(len(engines))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for engine in engines:
        engine.dispose()
    assert errors == []


def test_job_store_on_postgresql(pg_engines: tuple[sa.Engine, sa.Engine]) -> None:
    api, worker = JobStore(pg_engines[0]), JobStore(pg_engines[1])
    job = api.create({"text": "你好", "seed": 3, "nested": {"a": [1, 2]}}, owner="key:1")
    assert worker.get(job.id).params == {"text": "你好", "seed": 3, "nested": {"a": [1, 2]}}
    assert job.created_at.tzinfo is not None

    claimed = [worker.claim(job.id, f"w{i}", lease_s=30) for i in range(2)]
    assert claimed[0] is not None and claimed[0].attempt == 1 and claimed[1] is None  # one claim wins
    assert worker.renew(job.id, 1, lease_s=30) and worker.set_progress(job.id, 0.5, attempt=1)
    assert api.get(job.id).progress == 0.5 and api.get(job.id).worker == "w0"
    done = worker.finish_done(job.id, output_id="output_20250101_120000_123456000001", seed=2**40, attempt=1)
    assert done.state == "done" and done.seed == 2**40 and done.lease_until is None
    with pytest.raises(JobStateError, match="cannot become"):
        api.finish_failed(job.id, "x", "late")

    second = api.create({}, owner="key:2")
    api.mark_running(second.id)
    api.finish_cancelled(second.id)
    third = api.create({}, owner="key:1")
    assert [j.id for j in api.list(owner="key:1")] == [third.id, job.id]
    assert [j.id for j in api.list(limit=1, offset=1)] == [second.id]
    assert api.count(state="cancelled") == 1 and api.count(owner="key:1") == 2
    running = api.create({}, owner="key:1", prompt_wav=b"RIFF-recording", reserved_s=12.5)
    assert worker.claim(running.id, "w0", lease_s=30).attempt == 1
    worker.charge(running.id, 2.5)
    assert api.reserved_s("key:1") == pytest.approx(10.0)
    requeued, failed = worker.requeue_interrupted(max_attempts=3)  # the next start of a single server
    assert [j.id for j in requeued] == [third.id, running.id] and failed == []
    assert api.get(running.id).state == "queued" and api.prompt_wav(running.id) == b"RIFF-recording"
    api.finish_failed(third.id, "x", "late")
    assert api.purge_finished_before(api.get(third.id).finished_at) == 2


def test_batch_items_on_postgresql(pg_engines: tuple[sa.Engine, sa.Engine]) -> None:
    jobs, batches = JobStore(pg_engines[0]), BatchStore(pg_engines[1])
    batch = jobs.create({"voice": "alice"}, kind="batch", owner="key:1")
    items = [{"name": "one", "params": {"text": "一。"}}, {"name": "two", "params": {"text": "二。"}}]
    batches.add(
        batch.id,
        [*items, {"name": "bad", "params": {}, "error_code": "invalid_input", "error_message": "no"}],
    )
    assert batches.counts(batch.id).total == 3 and batches.counts(batch.id).failed == 1
    assert not batches.start(batch.id, 1, attempt=1)  # the batch is not running as attempt 1
    attempt = jobs.claim(batch.id, "w0", lease_s=30).attempt
    assert batches.start(batch.id, 1, attempt) and not batches.start(batch.id, 1, attempt + 1)
    assert batches.finish(
        batch.id, 1, attempt, output_id="o1", duration_s=1.5, run_s=0.5, result={"speed": 1.1}
    )
    assert batches.next_unfinished(batch.id).position == 2
    assert batches.counts(batch.id).mean_run_s == pytest.approx(0.5)
    assert batches.cancel_rest(batch.id, "cancelled", "stop") == 1
    assert [i.state for i in batches.items(batch.id)] == ["done", "cancelled", "failed"]


def test_keys_and_quotas_on_postgresql(pg_engines: tuple[sa.Engine, sa.Engine]) -> None:
    keys_a, keys_b = KeyStore(pg_engines[0], sa.MetaData()), KeyStore(pg_engines[1], sa.MetaData())
    key, plaintext = keys_a.create("ci", role="admin", rate_limit=5, quota=100.0)
    assert keys_b.authenticate(plaintext).id == key.id and keys_b.authenticate(plaintext + "x") is None
    assert [k.id for k in keys_b.list()] == [key.id]
    keys_b.revoke(key.id)
    assert keys_a.authenticate(plaintext) is None and keys_a.list(include_revoked=False) == []

    quota_a = QuotaTracker(pg_engines[0], sa.MetaData())
    quota_b = QuotaTracker(pg_engines[1], sa.MetaData())
    threads = [
        threading.Thread(target=lambda q=q: [q.add(key, 1.5) for _ in range(10)]) for q in (quota_a, quota_b)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert quota_a.used(key) == pytest.approx(30.0)  # racing first inserts on two nodes lose nothing
    status = quota_b.check(key, needed_s=80.0)
    assert not status.allowed and status.limit_s == 100.0


# ---- outputs through the bucket -------------------------------------------------------------------------

moto_server = pytest.importorskip("moto.server")
BUCKET = "shared-outputs"
T0 = 1_735_732_800.0  # 2025-01-01 12:00:00 UTC


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()
    server._server.server_close()


_prefixes = iter(range(10_000))


@pytest.fixture
def make_node(endpoint: str, tmp_path: Path) -> Iterator:
    """`make_node(name, **store options)`: an OutputStore on its own dir, all on one bucket + prefix."""
    from cosyserve.service.stores.s3sync import S3Sync

    prefix = f"run-{next(_prefixes)}"
    syncs: list[S3Sync] = []

    def make(name: str, clock: Clock | None = None, **kwargs: object) -> OutputStore:
        sync = S3Sync(endpoint, BUCKET, prefix, "us-east-1", "test", "test", path_style=True, backoff_s=0.01)
        sync.ensure_bucket()
        syncs.append(sync)
        return OutputStore(tmp_path / name, clock=clock or Clock(), sync=sync, **kwargs)

    yield make
    for sync in syncs:
        sync.close()


def test_an_output_saved_on_one_node_is_listed_and_served_by_another(make_node) -> None:
    clock = Clock()
    worker, api = make_node("worker", clock), make_node("api", clock)
    saved = worker.save(AUDIO, "wav", {"owner": "key:1", "text": "hi"}, upload_now=True)
    listed = api.list()
    assert [o.id for o in listed] == [saved.id] and listed[0].remote_only
    assert listed[0].manifest == saved.manifest and not listed[0].path.exists()
    assert api.list(owner="key:2") == []

    got = api.get(saved.id)
    assert got.path.read_bytes() == AUDIO and got.path.parent == api.root and not got.remote_only
    assert {k: v for k, v in got.manifest.items() if k != BUCKET_COPY} == saved.manifest
    assert got.manifest[BUCKET_COPY]["key"].endswith(f"/{saved.id}.json")
    assert hashlib.sha256(got.path.read_bytes()).hexdigest() == saved.manifest["sha256"]
    assert sorted(p.name for p in api.root.iterdir()) == sorted([saved.path.name, saved.sidecar_path.name])
    assert [o.id for o in api.list()] == [saved.id] and not api.list()[0].remote_only


def test_listing_merges_nodes_newest_first_with_paging(make_node) -> None:
    clock = Clock()
    worker = make_node("worker", clock, node_tag=111111)
    api = make_node("api", clock, remote_reads=True, node_tag=222222)
    ids = []
    for day, owner in [(0, "a"), (1, "b"), (40, "a"), (41, "a")]:  # across a month boundary
        clock.now = T0 + day * 86400
        store = api if day == 40 else worker
        ids.append(store.save(AUDIO, "wav", {"owner": owner}, upload_now=True).id)
    newest_first = ids[::-1]
    assert [o.id for o in api.list()] == newest_first
    assert [o.id for o in api.list(limit=2, offset=1)] == newest_first[1:3]
    assert [o.id for o in api.list(owner="a")] == [ids[3], ids[2], ids[0]]
    assert [o.id for o in worker.list(limit=1)] == [ids[3]]
    assert {o.split("_")[-1][:6] for o in ids} == {"111111", "222222"}  # node tags: no shared names


def test_missing_or_damaged_remote_outputs_are_not_found(make_node) -> None:
    worker, api = make_node("worker"), make_node("api")
    with pytest.raises(OutputNotFound):
        api.get("output_20990101_000000")
    saved = worker.save(AUDIO, "wav", {}, upload_now=True)
    worker.sync.client.delete_object(Bucket=BUCKET, Key=worker.sync.key(saved.path.name))
    with pytest.raises(OutputNotFound):
        api.get(saved.id)  # sidecar without audio
    worker.sync.client.put_object(Bucket=BUCKET, Key=worker.sync.key(saved.path.name), Body=b"other bytes")
    with pytest.raises(OutputNotFound):
        api.get(saved.id)  # audio that does not match the sidecar's sha256
    assert not any(api.root.iterdir())


def test_a_delete_on_one_node_removes_the_output_everywhere(make_node) -> None:
    worker, api, other = make_node("worker"), make_node("api"), make_node("other")
    saved = worker.save(AUDIO, "wav", {}, upload_now=True)
    other.get(saved.id)  # a downloaded copy on a third node
    api.delete(saved.id)  # never on this node's disk: found in the bucket
    assert api.sync.flush(timeout=20)
    assert api.sync.list_keys("output_") == []
    other.remote_list_ttl_s = 0.0
    with pytest.raises(OutputNotFound):
        other.get(saved.id)  # its copy is checked against the bucket and removed
    assert [p.suffix for p in other.root.iterdir()] == [".gone"]  # only the tombstone holding its id
    assert worker.get(saved.id).path.exists()  # the node's own output stays until its retention
    with pytest.raises(OutputNotFound):
        api.delete(saved.id)


def test_retention_removes_downloaded_copies_but_never_the_bucket(make_node) -> None:
    clock = Clock()
    worker, api = make_node("worker", clock), make_node("api", clock, retention_days=1)
    saved = worker.save(AUDIO, "wav", {}, upload_now=True)
    api.get(saved.id)
    clock.now += 2 * 86400
    assert [o.id for o in api.enforce_retention().removed] == [saved.id]
    assert api.sync.list_keys("output_") == sorted([saved.path.name, saved.sidecar_path.name])
    assert api.get(saved.id).path.read_bytes() == AUDIO  # downloaded again on demand


def test_bad_ids_never_reach_the_bucket(tmp_path: Path) -> None:
    class NoBucket:
        bucket = "never"

        def __getattr__(self, name: str) -> object:
            raise AssertionError(f"the bucket was asked ({name}) for a malformed id")

    store = OutputStore(tmp_path / "o", sync=NoBucket(), remote_reads=True)  # type: ignore[arg-type]
    for bad in ["../x", "output_20250101_120000/../../etc", "output_20250101_120000.json", ""]:
        with pytest.raises(InputError, match="not an output id"):
            store.get(bad)
        with pytest.raises(InputError, match="not an output id"):
            store.delete(bad)


def test_an_unreachable_bucket_leaves_local_outputs_listed(tmp_path: Path) -> None:
    from cosyserve.service.stores.s3sync import S3Sync, SyncError

    sync = S3Sync("http://127.0.0.1:9", "nowhere", "", "us-east-1", "x", "y", path_style=True, max_attempts=1,
                  botocore_attempts=1, connect_timeout_s=1)  # fmt: skip
    store = OutputStore(tmp_path / "o", sync=sync, remote_reads=True)
    saved = store.save(AUDIO, "wav", {})
    assert [o.id for o in store.list()] == [saved.id]
    assert store.get(saved.id).path.exists()
    with pytest.raises(SyncError, match="reads resume"):  # failing fast after the first failure
        store.get("output_20250101_120000_1")
    sync.close(timeout=1)


def test_two_nodes_cannot_revoke_the_last_two_admins_at_once(pg_engines: tuple[sa.Engine, sa.Engine]) -> None:
    """On PostgreSQL the admin rows are locked first: the second revoke waits, then sees the first."""
    from cosyserve.errors import InputError

    node_a, node_b = KeyStore(pg_engines[0], sa.MetaData()), KeyStore(pg_engines[1], sa.MetaData())
    first, _ = node_a.create("root-a", role="admin")
    second, _ = node_a.create("root-b", role="admin")
    for key in node_a.list(include_revoked=False):  # only these two are admins in use
        if key.role == "admin" and key.id not in (first.id, second.id):
            node_a.revoke(key.id)
    start, outcomes = threading.Barrier(2), []

    def revoke(store: KeyStore, key_id: int) -> None:
        start.wait()
        try:
            store.revoke(key_id, keep_an_admin=True)
            outcomes.append("revoked")
        except InputError:
            outcomes.append("refused")

    threads = [threading.Thread(target=revoke, args=(node_a, first.id)),
               threading.Thread(target=revoke, args=(node_b, second.id))]  # fmt: skip
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["refused", "revoked"]


def test_two_single_servers_on_one_postgresql_database_are_refused(postgres_url: str, tmp_path) -> None:
    from cosyserve.commands.data_dir_lock import hold_single_server
    from cosyserve.errors import InputError

    first = hold_single_server(tmp_path / "a", postgres_url)
    with pytest.raises(InputError, match="serves this PostgreSQL database"):
        hold_single_server(tmp_path / "b", postgres_url)
    first.close()  # its session ended: the lock went with it
    hold_single_server(tmp_path / "b", postgres_url).close()
