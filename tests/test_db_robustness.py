"""Bad input never reaches the database as an error: on SQLite and PostgreSQL alike, ids that can't exist
are simply not found, NUL characters and NaN are cleaned before writing, and over-long labels are cut to
their column (PostgreSQL refuses all of these with a DataError, which would surface as an HTTP 500)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
import torch

from cosyserve.errors import InputError, JobStateError
from cosyserve.frontend.prompt_features import PromptFeatures
from cosyserve.service.stores.db import make_engine
from cosyserve.service.stores.job_table import sanitize_params
from cosyserve.service.stores.jobs import JobStore
from cosyserve.service.stores.keys import KeyNotFound, KeyStore
from cosyserve.service.stores.outputs import OutputStore
from cosyserve.service.stores.voices import VoiceLibrary, VoiceNotFound

NOT_JOB_IDS = ["", "abc", "x\x00y", "\x00" * 32, "0" * 31 + "\x00", "0" * 33, "é" * 32, "\ud800", "a" * 500]


@pytest.fixture
def engine(database_url: str) -> Iterator[sa.Engine]:
    engine = make_engine(database_url)
    yield engine
    engine.dispose()


@pytest.fixture
def jobs(engine: sa.Engine) -> JobStore:
    return JobStore(engine)


# ---- jobs: lookups ------------------------------------------------------------------------------------


@pytest.mark.parametrize("job_id", NOT_JOB_IDS)
def test_ids_that_are_not_job_ids_are_not_found(jobs: JobStore, job_id: str) -> None:
    jobs.create({"text": "hi"})  # a table with a row in it
    assert jobs.get(job_id) is None
    assert jobs.claim(job_id, "worker-1", 30.0) is None
    assert jobs.set_progress(job_id, 0.5) is False
    assert jobs.renew(job_id, 1, 30.0) is False
    for finish in (
        lambda: jobs.mark_running(job_id),
        lambda: jobs.finish_failed(job_id, "boom", "it broke"),
        lambda: jobs.finish_cancelled(job_id),
        lambda: jobs.finish_done(job_id, output_id="output_20250101_120000"),
    ):
        with pytest.raises(JobStateError, match="no job"):
            finish()


def test_a_malformed_job_id_is_refused_at_creation(jobs: JobStore) -> None:
    with pytest.raises(InputError, match="not usable"):
        jobs.create({"text": "hi"}, job_id="my-job\x00")
    assert jobs.count() == 0


# ---- jobs: what gets written --------------------------------------------------------------------------


def test_nul_in_error_message_still_ends_the_job(jobs: JobStore) -> None:
    record = jobs.create({"text": "hi"})
    jobs.mark_running(record.id)
    failed = jobs.finish_failed(record.id, "bad\x00code", "the engine said \x00\x00 and stopped")
    assert failed.state == "failed" and failed.is_terminal
    assert "\x00" not in failed.error_message and "the engine said" in failed.error_message
    assert "\x00" not in failed.error_code
    other = jobs.create({"text": "hi"})
    ended = jobs.finish_with_exception(other.id, RuntimeError("NUL \x00 and a lone surrogate \udc80"))
    assert ended.state == "failed" and ended.error_message == "NUL \ufffd and a lone surrogate \ufffd"
    third = jobs.create({"text": "hi"})
    assert jobs.finish_cancelled(third.id, "bye\x00").error_message == "bye\ufffd"


def test_over_long_labels_are_cut_to_their_columns(jobs: JobStore) -> None:
    owner = "user:" + "o" * 300
    record = jobs.create({"text": "hi"}, owner=owner)
    assert len(record.owner) <= 128 and record.owner.startswith("user:ooo")
    claimed = jobs.claim(record.id, "w" * 1000, 30.0)
    assert claimed is not None and len(claimed.worker) <= 128
    failed = jobs.finish_failed(record.id, "c" * 500, "m" * 10_000, attempt=claimed.attempt)
    assert failed.state == "failed" and len(failed.error_code) <= 64 and failed.error_message == "m" * 10_000
    # the owner's filter finds what was stored under the cut name; a different long name does not
    assert [r.id for r in jobs.list(owner=owner)] == [record.id] and jobs.count(owner=owner) == 1
    assert jobs.list(owner=owner + "x") == [] and jobs.count(owner="user:" + "o" * 299 + "p") == 0


def test_nul_owner_is_stored_cleaned_and_found_again(jobs: JobStore) -> None:
    record = jobs.create({"text": "hi"}, owner="user:a\x00b")
    assert "\x00" not in record.owner
    assert [r.id for r in jobs.list(owner="user:a\x00b")] == [record.id]
    assert jobs.list(owner="\x00") == [] and jobs.count(owner="\x00", state="queued\x00") == 0
    assert jobs.list(state="\x00") == []


def test_params_and_results_lose_nul_and_non_finite_numbers(jobs: JobStore) -> None:
    params = {
        "text": "a\x00b",
        "voice": "\ud800x",
        "key\x00": [1.5, float("nan"), {"deep": float("inf")}, -float("inf")],
        "speed": float("nan"),
        "audio": b"\x00\x01",
        "ok": True,
    }
    record = jobs.create(params, owner="key:1")
    stored = jobs.get(record.id).params
    assert stored["text"] == "a\ufffdb" and stored["speed"] is None and stored["ok"] is True
    assert stored["voice"] == "\ufffdx"
    assert stored["key\ufffd"] == [1.5, None, {"deep": None}, None]
    assert stored["audio"] == "<2 bytes>"
    jobs.mark_running(record.id)
    done = jobs.finish_done(
        record.id,
        output_id="output_20250101_120000",
        duration_s=1.0,
        extra={"warnings": ["clipped\x00"], "rtf": float("nan"), "stages": {"llm": math.inf}},
    )
    assert done.result_extra == {"warnings": ["clipped\ufffd"], "rtf": None, "stages": {"llm": None}}


def test_sanitize_params_cleans_keys_values_and_numbers() -> None:
    assert sanitize_params({"a\x00": ("x\x00", float("-inf"), 2)}) == {"a\ufffd": ["x\ufffd", None, 2]}
    assert sanitize_params(float("nan")) is None and sanitize_params(3.25) == 3.25


# ---- API keys -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("key_id", [2**31, -(2**31) - 1, 10**30, -1, 0, 1.5, "12a", "\x00", "²", "9" * 5000])
def test_key_ids_out_of_range_are_not_found(engine: sa.Engine, key_id: object) -> None:
    keys = KeyStore(engine, sa.MetaData())
    keys.create("someone")
    with pytest.raises(KeyNotFound):
        keys.get(key_id)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "target",
    ["2147483648", "9" * 5000, "cs_\x00abcdefgh", "cs_abc\x00defgh", "cs_abc", "\x00", "²", "\ud800", ""],
)
def test_revoking_what_cannot_be_a_key_is_not_found(engine: sa.Engine, target: str) -> None:
    keys = KeyStore(engine, sa.MetaData())
    key, _ = keys.create("someone")
    with pytest.raises(KeyNotFound):
        keys.revoke(target)
    assert keys.get(key.id).active


def test_key_names_with_nul_are_refused(engine: sa.Engine) -> None:
    keys = KeyStore(engine, sa.MetaData())
    with pytest.raises(InputError, match="NUL"):
        keys.create("bad\x00name")
    with pytest.raises(InputError, match="surrogate"):
        keys.create("bad\udc80name")
    with pytest.raises(InputError, match="line breaks"):  # it broke `keys list`'s table
        keys.create("bad\nname")
    assert keys.list() == []
    assert keys.authenticate("cs_" + "\x00" * 43) is None


# ---- voices and outputs -------------------------------------------------------------------------------


def tiny_features(audio: bytes) -> PromptFeatures:
    return PromptFeatures(
        speech_feat=torch.zeros(1, 4, 80),
        speech_feat_len=torch.tensor([4], dtype=torch.int32),
        speech_token=torch.zeros(1, 2, dtype=torch.int32),
        embedding=torch.zeros(1, 192),
    )


@pytest.mark.parametrize("lookup", ["\x00", "a\x00b", "x" * 1000, "0" * 32, ""])
def test_voice_lookups_that_cannot_match_are_not_found(
    engine: sa.Engine, tmp_path: Path, lookup: str
) -> None:
    library = VoiceLibrary(tmp_path / "voices", engine, sa.MetaData(), model_checksum="m")
    with pytest.raises(VoiceNotFound):
        library.get(lookup)
    with pytest.raises(VoiceNotFound):
        library.delete(lookup)
    with pytest.raises(VoiceNotFound):
        library.update(lookup, name="fine")


def test_voice_text_that_cannot_be_stored_is_refused(engine: sa.Engine, tmp_path: Path) -> None:
    library = VoiceLibrary(tmp_path / "voices", engine, sa.MetaData(), model_checksum="m")
    voice = library.add("alice", b"RIFF" + bytes(64), tiny_features, lexicon={"x": "EH1 K S"})
    for transcript in ("hello\x00", "lone \ud800 surrogate"):
        with pytest.raises(InputError, match="NUL character or a lone surrogate"):
            library.update(voice.id, transcript=transcript)
    with pytest.raises(InputError, match="lone surrogate"):
        library.update(voice.id, lexicon={"word": "\udfff"})
    with pytest.raises(InputError, match="lone surrogate"):
        library.add("bob", b"RIFF" + bytes(64), tiny_features, lexicon={"\ud800": "x"})
    with pytest.raises(InputError, match="control characters"):  # refused, as in a transcript
        library.update(voice.id, lexicon={"nul\x00": "N AH1 L"})
    library.update(voice.id, lexicon={"null": "N AH1 L"}, transcript="fine")
    again = library.get("alice")
    assert again.lexicon == {"null": "N AH1 L"} and again.transcript == "fine"
    assert [v.name for v in library.list()] == ["alice"]


@pytest.mark.parametrize(
    "output_id", ["output_\x00", "../etc/passwd", "output_20250101_120000\x00", "x" * 500]
)
def test_output_ids_are_checked_before_any_lookup(tmp_path: Path, output_id: str) -> None:
    store = OutputStore(tmp_path / "outputs")
    with pytest.raises(InputError, match="not an output id"):
        store.get(output_id)
    with pytest.raises(InputError, match="not an output id"):
        store.delete(output_id)


# ---- over HTTP ----------------------------------------------------------------------------------------


def test_api_answers_404_for_job_ids_with_nul(start_api_server, database_url: str) -> None:
    server = start_api_server(wait_ready=False, database_url=database_url)
    try:
        with server.client() as client:
            for path in ("/v1/jobs/abc%00def", "/v1/jobs/%00", f"/v1/jobs/{'a' * 40}", "/v1/jobs/%00/result"):
                response = client.get(path)
                assert response.status_code == 404, (path, response.text)
                assert response.json()["error"]["code"], response.text
            assert client.delete("/v1/jobs/abc%00def").status_code == 404
            assert client.get("/v1/outputs/output_%00").status_code in (400, 404)
            assert client.get("/v1/voices/%00").status_code == 404
    finally:
        server.stop()


def test_the_sqlite_file_is_private_to_its_owner(tmp_path: Path) -> None:
    """It holds key hashes, voices and job texts: 0600, also when an earlier version made it 0644."""
    path = tmp_path / "cosyserve.db"
    engine = make_engine(f"sqlite:///{path}")
    JobStore(engine)
    assert path.stat().st_mode & 0o777 == 0o600
    engine.dispose()
    path.chmod(0o644)
    make_engine(f"sqlite:///{path}").dispose()
    assert path.stat().st_mode & 0o777 == 0o600


def test_a_database_from_before_the_output_indexes_gets_them(engine: sa.Engine, tmp_path: Path) -> None:
    """Deleting an output finds the jobs and batch items that name it by an index (it read every row); a
    database made by an earlier version, without the index, gets it when the store opens it."""
    from cosyserve.service.stores.batches import BatchStore
    from cosyserve.service.stores.output_refs import forget_output

    JobStore(engine)
    BatchStore(engine)
    with engine.begin() as conn:  # as an earlier version left it
        conn.execute(sa.text("DROP INDEX ix_jobs_output"))
        conn.execute(sa.text("DROP INDEX ix_batch_items_output"))
    jobs = JobStore(engine)
    BatchStore(engine)
    for table in ("jobs", "batch_items"):
        names = {index["name"] for index in sa.inspect(engine).get_indexes(table)}
        assert f"ix_{table}_output" in names, names
    job = jobs.create({"text": "hi"})
    jobs.mark_running(job.id)
    jobs.finish_done(job.id, output_id="out-1")
    assert forget_output(engine, "out-1") == 1 and jobs.get(job.id).output_id is None
    from cosyserve.service.stores import output_refs

    made = []
    for number in range(5):  # a retention pass's many outputs: cleared a chunk per transaction
        job = jobs.create({"text": "hi"})
        jobs.mark_running(job.id)
        jobs.finish_done(job.id, output_id=f"out-{number + 2}")
        made.append(job.id)
    output_refs.FORGET_CHUNK, chunk = 2, output_refs.FORGET_CHUNK
    try:
        assert output_refs.forget_outputs(engine, [f"out-{n + 2}" for n in range(5)]) == 5
    finally:
        output_refs.FORGET_CHUNK = chunk
    assert all(jobs.get(job_id).output_id is None for job_id in made)
    names = {index["name"] for index in sa.inspect(engine).get_indexes("jobs")}
    assert "ix_jobs_created" in names  # the admin's list of everyone's jobs, newest first
    if engine.dialect.name == "sqlite":
        with engine.connect() as conn:
            plan = conn.execute(sa.text("EXPLAIN QUERY PLAN SELECT id FROM jobs WHERE output_id = 'x'")).all()
        assert "ix_jobs_output" in str(plan), plan


def test_a_job_recorded_before_specs_keeps_its_key() -> None:
    """A job from a version before 2026-12-01 has no spec, only its owner `key:N`: after an upgrade it
    ran without its key (not charged, any voice, a revoked key's job too)."""
    from cosyserve.service.wire import decode_job_spec

    seen: list[int] = []
    spec = decode_job_spec(None, {"format": "mp3"}, "key:7", lambda key_id: seen.append(key_id) or None)
    assert seen == [7] and spec.extra["key_id"] == 7 and spec.format == "mp3"
    assert decode_job_spec(None, None, "session:admin", lambda key_id: None).extra["key_id"] is None


def test_links_to_outputs_deleted_by_an_earlier_version_are_cleared(engine: sa.Engine) -> None:
    """A version that did not clear them left jobs `done` with a link that answered 404 after upgrading;
    a single server clears them at start (`forget_missing`)."""
    from cosyserve.service.stores.batches import BatchStore
    from cosyserve.service.stores.output_refs import forget_missing

    jobs = JobStore(engine)
    BatchStore(engine)
    made = []
    for output_id in ("output_20250101_120000", "output_20250101_120001"):
        job = jobs.create({"text": "hi"})
        jobs.mark_running(job.id)
        jobs.finish_done(job.id, output_id=output_id)
        made.append(job.id)
    exists = lambda output_id: output_id.endswith("1")  # noqa: E731
    # no tombstone tells it was deleted, but the folder holds the other one: it is the right folder
    assert forget_missing(engine, lambda output_id: False, exists) == 1
    assert jobs.get(made[0]).output_id is None and jobs.get(made[1]).output_id == "output_20250101_120001"
    assert jobs.get(made[0]).result_extra.get("result_deleted") is True


def test_a_start_on_an_empty_output_directory_keeps_every_result_linked(engine, tmp_path, caplog) -> None:
    """One start with the wrong (or an unmounted) --output-dir cleared every job's and item's link to its
    result for good: only outputs deleted here (a tombstone) or past retention's age are forgotten now."""
    import time

    from cosyserve.service.stores.batches import BatchStore
    from cosyserve.service.stores.output_refs import forget_missing
    from cosyserve.service.stores.outputs import OutputStore

    jobs = JobStore(engine)
    BatchStore(engine)
    store = OutputStore(tmp_path / "empty", retention_days=30)
    now = time.time()
    stamp = lambda days_ago: time.strftime("%Y%m%d_%H%M%S", time.localtime(now - days_ago * 86400))  # noqa: E731
    named = {
        "recent": f"output_{stamp(2)}",
        "deleted": f"output_{stamp(3)}",
        "expired": f"output_{stamp(40)}",
    }
    (tmp_path / "empty" / f"{named['deleted']}.gone").touch()
    made = {}
    for what, output_id in named.items():
        job = jobs.create({"text": "hi"})
        jobs.mark_running(job.id)
        jobs.finish_done(job.id, output_id=output_id)
        made[what] = job.id
    caplog.set_level("WARNING")
    assert forget_missing(engine, store.removed_here, store.has_local) == 2
    assert jobs.get(made["recent"]).output_id == named["recent"]  # missing, not deleted: kept
    assert jobs.get(made["deleted"]).output_id is None and jobs.get(made["expired"]).output_id is None
    assert "1 of the 3 results that jobs and batch items name are not in the output directory" in caplog.text
