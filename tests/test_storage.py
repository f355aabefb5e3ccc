"""Output store: names, sidecars, id validation, listing, retention and atomic writes."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from cosyserve import __version__
from cosyserve.errors import InputError
from cosyserve.service.outcomes import SentenceTiming, SynthesisResult
from cosyserve.service.requests import SynthesisRequest
from cosyserve.service.stores.output_space import RetentionWorker
from cosyserve.service.stores.outputs import (
    STRAY_GRACE_S,
    OutputNotFound,
    OutputStore,
    build_manifest,
)

T0 = 1_735_732_800.0  # 2025-01-01 12:00:00 UTC


class FakeClock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def make_store(tmp_path: Path, clock: FakeClock | None = None, **kwargs: object) -> OutputStore:
    return OutputStore(tmp_path / "outputs", clock=clock or FakeClock(), **kwargs)


def test_names_are_utc_stamps_with_counters_on_collision(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    ids = [store.save(b"RIFF....", "wav", {"text": str(i)}).id for i in range(3)]
    assert ids == ["output_20250101_120000", "output_20250101_120000_1", "output_20250101_120000_2"]
    other_ext = store.save(b"mp3", "mp3", {})  # same stem with another extension would be ambiguous
    assert other_ext.id == "output_20250101_120000_3" and other_ext.path.name.endswith(".mp3")
    assert sorted(p.name for p in store.root.iterdir())[:2] == [
        "output_20250101_120000.json",
        "output_20250101_120000.wav",
    ]


def test_a_stray_file_of_the_same_name_is_never_overwritten(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    (store.root / "output_20250101_120000.wav").write_bytes(b"someone else's")
    saved = store.save(b"mine", "wav", {})
    assert saved.id == "output_20250101_120000_1"
    assert (store.root / "output_20250101_120000.wav").read_bytes() == b"someone else's"
    assert not (store.root / "output_20250101_120000.json").exists()


def test_concurrent_saves_produce_distinct_complete_files(tmp_path: Path) -> None:
    store = OutputStore(tmp_path / "outputs", clock=lambda: T0)
    results, barrier = [], threading.Barrier(8)

    def worker(n: int) -> None:
        barrier.wait()
        for i in range(5):
            results.append(store.save(f"{n}-{i}".encode() * 100, "wav", {"text": f"{n}-{i}"}))

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({r.id for r in results}) == 40
    for saved in results:
        assert saved.path.read_bytes() == saved.manifest["text"].encode() * 100
        assert json.loads(saved.sidecar_path.read_text())["text"] == saved.manifest["text"]
    assert not [p for p in store.root.iterdir() if p.name.startswith(".")]  # no temp files left


def _save_in_process(root: str, count: int) -> list[str]:
    store = OutputStore(Path(root), clock=lambda: T0)
    return [store.save(f"{os.getpid()}-{i}".encode(), "wav", {}).id for i in range(count)]


def test_concurrent_saves_from_several_processes_never_collide(tmp_path: Path) -> None:
    import multiprocessing

    root = tmp_path / "outputs"
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        batches = pool.starmap(_save_in_process, [(str(root), 10)] * 4)
    ids = [output_id for batch in batches for output_id in batch]
    assert len(set(ids)) == 40
    assert len(OutputStore(root).list(limit=100)) == 40


def test_sidecar_holds_the_manifest_and_provenance(tmp_path: Path) -> None:
    store = make_store(tmp_path, url_prefix="/v1/outputs/")
    audio = b"\x00\x01" * 500
    saved = store.save(audio, "WAV", {"text": "你好", "seed": 7, "parameters": {"top_p": np.float32(0.8)}})
    sidecar = json.loads(saved.sidecar_path.read_text(encoding="utf-8"))
    assert sidecar == saved.manifest
    assert sidecar["text"] == "你好" and sidecar["seed"] == 7
    assert sidecar["parameters"]["top_p"] == pytest.approx(0.8)
    assert sidecar["sha256"] == hashlib.sha256(audio).hexdigest()
    assert sidecar["size_bytes"] == len(audio)
    assert sidecar["format"] == "wav" and sidecar["file"] == saved.path.name
    assert sidecar["created_at"] == "2025-01-01T12:00:00Z" and sidecar["created_at_unix"] == T0
    assert sidecar["cosyserve_version"] == __version__ and sidecar["owner"] is None
    assert saved.url_path == f"/v1/outputs/{saved.id}"


def test_build_manifest_records_request_result_and_model() -> None:
    request = SynthesisRequest(text="hello", prompt_wav=b"RIFF", prompt_text="hi", seed=None)
    result = SynthesisResult(
        audio=np.zeros(24000, np.float32),
        sample_rate=24000,
        seed=1234,
        timings=[SentenceTiming(0, "hello", 0.0, 1.0)],
        stage_seconds={"llm": 0.5},
    )
    manifest = build_manifest(
        request, result, format="mp3", sample_rate=24000, model_checksum="abc", owner="key:1",
        parameters={"top_k": 25},
    )  # fmt: skip
    assert manifest["seed"] == 1234  # the seed used, not the None asked for
    assert (
        manifest["prompt_wav_sha256"] == hashlib.sha256(b"RIFF").hexdigest() and "prompt_wav" not in manifest
    )
    assert manifest["duration_s"] == 1.0 and manifest["sentences"][0]["text"] == "hello"
    assert manifest["model_checksum"] == "abc" and manifest["owner"] == "key:1"
    assert manifest["parameters"] == {"top_k": 25} and manifest["format"] == "mp3"
    json.dumps(manifest)


@pytest.mark.parametrize(
    "bad_id",
    ["../x", "/etc/passwd", "output_20250101_120000/../../x", "output_2025_1", "output_20250101_120000.wav",
     "output_20250101_120000_0", "output_20250101_120000_01", "x", "", "output_20250101_120000\n", "..",
     "output_20250101_12000a"],
)  # fmt: skip
def test_malformed_ids_are_rejected(tmp_path: Path, bad_id: str) -> None:
    store = make_store(tmp_path)
    with pytest.raises(InputError, match="not an output id"):
        store.get(bad_id)
    with pytest.raises(InputError, match="not an output id"):
        store.delete(bad_id)


def test_get_and_delete(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    saved = store.save(b"abc", "flac", {"text": "x"})
    assert store.get(saved.id).manifest == saved.manifest
    removed = store.delete(saved.id)
    assert removed.id == saved.id
    assert not saved.path.exists() and not saved.sidecar_path.exists()
    with pytest.raises(OutputNotFound):
        store.get(saved.id)
    with pytest.raises(OutputNotFound):
        store.get("output_20990101_000000")


def test_an_id_once_removed_is_never_given_to_another_output(tmp_path: Path) -> None:
    """A result deleted (or removed by retention) within the second it was made gave its id to the next
    result of that second: the first one's link and job then served the second one, someone else's audio
    (a team's run: 34 of 59). A tombstone holds the id until it can no longer come round again."""
    clock = FakeClock()
    store = make_store(tmp_path, clock)
    alices = store.save(b"alice", "wav", {"owner": "alice"})
    store.delete(alices.id)
    bobs = store.save(b"bob", "wav", {"owner": "bob"})  # the same second
    assert bobs.id != alices.id
    with pytest.raises(OutputNotFound):
        store.get(alices.id)
    capped = make_store(tmp_path / "capped", clock, max_total_bytes=1)  # each save evicts the one before
    made = [capped.save(b"x" * 100, "wav", {"n": n}).id for n in range(4)]
    assert len(set(made)) == 4
    clock.now += 8 * 86400 + 1  # tombstones outlive a DST change, a time-zone switch and any link
    for tombstone in store.root.glob("*.gone"):
        os.utime(tombstone, (clock.now - 8 * 86400 - 1, clock.now - 8 * 86400 - 1))
    store.enforce_retention()
    assert list(store.root.glob("*.gone")) == []


def test_saves_do_not_wait_while_retention_reads_the_directory(tmp_path: Path) -> None:
    """With a year of outputs, each pass read every sidecar (twice) under the lock every save waits for
    under the size cap: syntheses stalled 10-45 s at start and every hour."""
    import threading

    store = make_store(tmp_path, max_total_bytes=10**9, retention_days=30)
    for number in range(3):
        store.save(b"RIFF" + bytes(number), "wav", {})
    reading, go_on = threading.Event(), threading.Event()
    walk = store._iter_complete

    def slow_walk():
        for output in walk():
            reading.set()
            go_on.wait(10)
            yield output

    store._iter_complete = slow_walk  # type: ignore[method-assign]
    sweep = threading.Thread(target=store.enforce_retention)
    sweep.start()
    assert reading.wait(10)
    saved = []
    saver = threading.Thread(target=lambda: saved.append(store.save(b"RIFFnew", "wav", {})))
    saver.start()
    saver.join(5)
    go_on.set()
    sweep.join(10)
    assert saved and not saver.is_alive()  # saved while the pass was still reading
    assert store._sizes.total == sum(  # the pass kept the new output in the size index
        (store.root / f"{o.id}.wav").stat().st_size + (store.root / f"{o.id}.json").stat().st_size
        for o in store.list(limit=10)
    )


def test_retention_tells_whoever_names_the_outputs_it_removes(tmp_path: Path) -> None:
    """A job whose result retention removed still said done with a link that answered 404."""
    clock = FakeClock()
    aged = make_store(tmp_path / "aged", clock, retention_days=1)
    capped = make_store(tmp_path / "capped", clock, max_total_bytes=1)
    told: list[str] = []
    aged.on_expired = capped.on_expired = told.extend
    old = aged.save(b"a", "wav", {})
    clock.now += 2 * 86400
    aged.enforce_retention()
    assert told == [old.id]
    first = capped.save(b"b", "wav", {})
    capped.save(b"c", "wav", {})  # the cap evicts the one before at this save
    assert told == [old.id, first.id]


def test_the_periodic_pass_keeps_the_newest_even_over_the_cap(tmp_path: Path) -> None:
    """The save kept one output larger than the cap; the next periodic pass removed it, seconds after
    its job said done."""
    store = make_store(tmp_path, max_total_bytes=100)
    huge = store.save(b"y" * 1000, "wav", {})
    assert store.enforce_retention().removed == [] and store.get(huge.id)


def test_listing_is_newest_first_filters_owner_and_survives_restart(tmp_path: Path) -> None:
    clock = FakeClock()
    store = make_store(tmp_path, clock)
    saved = []
    for i in range(12):
        clock.now = T0 + (i // 3) * 10  # several per second, and counters above 9 sort numerically
        saved.append(store.save(b"a", "wav", {"owner": "alice" if i % 2 else "bob", "n": i}))
    for extra in range(8):  # counter suffixes _1.._10 within one second
        saved.append(store.save(b"a", "wav", {"owner": "carol", "n": 12 + extra}))
    reopened = OutputStore(store.root)  # a new process: everything comes from the files
    listed = reopened.list(limit=1000)
    assert [o.manifest["n"] for o in listed] == list(range(19, -1, -1))
    assert [o.manifest["n"] for o in reopened.list(owner="alice", limit=2, offset=1)] == [9, 7]
    assert reopened.list(owner="nobody") == []
    with pytest.raises(InputError):
        reopened.list(limit=0)


def test_a_request_id_finds_its_output_however_many_came_after(tmp_path: Path) -> None:
    """`GET /v1/outputs?request_id=` searched the newest 1000 only: a user's older result read as never
    saved."""
    store = make_store(tmp_path)
    old = store.save(b"a", "wav", {"owner": "alice", "parameters": {"request_id": "r-old"}})
    for n in range(6):
        store.save(b"a", "wav", {"owner": "alice" if n % 2 else "bob", "parameters": {"request_id": f"r{n}"}})
    assert store.of_request("r-old", "alice").id == old.id
    assert store.of_request("r-old", "bob") is None and store.of_request("r-none") is None


def test_listing_skips_outputs_still_being_written(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    done = store.save(b"a", "wav", {})
    (store.root / "output_20250101_130000.json").touch()  # a reservation of a save in progress
    assert [o.id for o in store.list()] == [done.id]
    with pytest.raises(OutputNotFound):
        store.get("output_20250101_130000")


def test_retention_by_age(tmp_path: Path) -> None:
    clock = FakeClock()
    store = make_store(tmp_path, clock, retention_days=1)
    old = store.save(b"old", "wav", {})
    clock.now += 86400 - 60
    young = store.save(b"young", "wav", {})
    clock.now += 120  # `old` is now a day and a minute old
    report = store.enforce_retention()
    assert [o.id for o in report.removed] == [old.id]
    assert not old.path.exists() and not old.sidecar_path.exists()
    assert young.path.exists() and young.sidecar_path.exists()
    assert report.freed_bytes > 3


def test_retention_by_size_removes_oldest_whole_pairs(tmp_path: Path) -> None:
    clock = FakeClock()
    store = make_store(tmp_path, clock)
    saved = []
    for i in range(5):
        clock.now = T0 + i
        saved.append(store.save(b"x" * 1000, "wav", {"n": i}))
    pair = saved[0].path.stat().st_size + saved[0].sidecar_path.stat().st_size
    assert store.total_bytes() == 5 * pair
    limited = OutputStore(store.root, clock=clock, max_total_bytes=2 * pair + pair // 2)
    report = limited.enforce_retention()
    assert [o.manifest["n"] for o in report.removed] == [0, 1, 2]
    assert report.freed_bytes == 3 * pair
    assert limited.total_bytes() == 2 * pair <= limited.max_total_bytes
    remaining = sorted(p.name for p in store.root.iterdir() if p.suffix != ".gone")
    assert remaining == sorted(
        n for s in saved[3:] for n in (s.path.name, s.sidecar_path.name)
    )  # no half pairs
    assert sorted(p.stem for p in store.root.glob("*.gone")) == sorted(s.id for s in saved[:3])


def test_retention_cleans_old_leftovers_of_interrupted_saves(tmp_path: Path) -> None:
    clock = FakeClock(time.time())
    store = make_store(tmp_path, clock)
    kept = store.save(b"a", "wav", {})
    leftovers = [
        store.root / ".output_20250101_120000.wav.abcd1234.tmp",  # temp file of a crashed write
        store.root / "output_20250101_110000.json",  # reservation placeholder, audio never finished
        store.root / "output_20250101_110001.wav",  # audio whose sidecar is gone
    ]
    for path in leftovers:
        path.write_bytes(b"")
    fresh = store.root / "output_20250101_110002.json"  # a save in progress right now
    fresh.write_bytes(b"")
    report = store.enforce_retention()
    assert report.strays == [] and all(p.exists() for p in leftovers)  # too young to judge
    clock.now += STRAY_GRACE_S + 1
    os.utime(fresh, (clock.now, clock.now))  # this one was touched just now: still in progress
    report = store.enforce_retention()
    assert sorted(report.strays) == sorted(leftovers)
    assert fresh.exists() and kept.path.exists() and kept.sidecar_path.exists()


def test_a_failed_write_leaves_nothing_under_the_final_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store(tmp_path)

    def broken_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="No space"):
        store.save(b"x" * 100, "wav", {})
    assert list(store.root.iterdir()) == []  # no partial audio, no placeholder, no temp file


def test_unserialisable_manifest_is_refused_before_writing(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    with pytest.raises(TypeError, match="can't be stored as JSON"):
        store.save(b"x", "wav", {"bad": object()})
    assert list(store.root.iterdir()) == []


def test_bad_extension_is_rejected(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    for ext in ("../wav", "", "w a v", "toolongext"):
        with pytest.raises(InputError, match="extension"):
            store.save(b"x", ext, {})


def test_retention_worker_runs_and_stops(tmp_path: Path) -> None:
    clock = FakeClock()
    store = make_store(tmp_path, clock, retention_days=1)
    old = store.save(b"old", "wav", {})
    clock.now += 2 * 86400
    housekeeping = []
    worker = RetentionWorker(store, interval_s=0.01, also=lambda: housekeeping.append(1)).start()
    deadline = time.monotonic() + 5
    while (old.path.exists() or not housekeeping) and time.monotonic() < deadline:
        time.sleep(0.01)
    worker.stop()
    assert not old.path.exists() and housekeeping  # (old job records go in the same pass)
    runs = worker.runs
    time.sleep(0.05)
    assert worker.runs == runs  # stopped


def test_save_enqueues_sync_and_delete_syncs_when_asked(tmp_path: Path) -> None:
    class RecordingSync:
        def __init__(self) -> None:
            self.calls: list[tuple[str, str]] = []

        def enqueue(self, path: Path, key: str, then: Path | None = None) -> bool:
            self.calls.append(("put", key))
            if then is not None:  # uploaded after it, only once it is there
                self.calls.append(("then put", then.name))
            return True

        def enqueue_delete(self, key: str) -> bool:
            self.calls.append(("delete", key))
            return True

    sync = RecordingSync()
    # remote_reads=False: the bucket as a copy only (reading through it is tested in test_s3sync.py)
    store = make_store(tmp_path, sync=sync, sync_deletes=True, remote_reads=False)  # type: ignore[arg-type]
    saved = store.save(b"a", "mp3", {})
    store.delete(saved.id)
    assert sync.calls == [
        ("put", f"{saved.id}.mp3"),
        ("then put", f"{saved.id}.json"),
        ("delete", f"{saved.id}.mp3"),
        ("delete", f"{saved.id}.json"),
    ]


def test_the_size_cap_holds_at_every_save_and_spares_the_newest(tmp_path: Path) -> None:
    clock = FakeClock()
    probe = make_store(tmp_path / "probe", clock)
    pair = probe.save(b"x" * 1000, "wav", {}).path.stat().st_size  # audio; the sidecar adds a little
    store = make_store(tmp_path, clock, max_total_bytes=3 * pair)
    saved = []
    for i in range(8):
        clock.now += 1.0
        saved.append(store.save(b"x" * 1000, "wav", {"text": str(i)}).id)
        assert store.total_bytes() <= store.max_total_bytes  # no waiting for the hourly retention run
    left = [o.id for o in store.list(limit=100)]
    assert left[0] == saved[-1] and set(left) < set(saved) and saved[0] not in left
    huge = store.save(b"y" * (5 * pair), "wav", {})  # larger than the cap alone: kept, everything else goes
    assert [o.id for o in store.list(limit=100)] == [huge.id]


def test_storage_health_reports_a_low_floor_and_failed_saves(tmp_path: Path, monkeypatch) -> None:
    roomy = make_store(tmp_path / "roomy", min_free_bytes=1)
    assert roomy.health.problem() is None
    cramped = make_store(tmp_path / "cramped", min_free_bytes=1 << 62)
    assert "free for outputs" in (cramped.health.problem() or "")

    def no_space(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(OSError, match="No space"):
        roomy.save(b"x", "wav", {})
    assert "No space left on device" in (roomy.health.problem() or "")


def test_a_result_removed_between_its_lookup_and_its_send_is_a_404(tmp_path: Path) -> None:
    """Retention or a delete removing a result while it was being fetched answered 500 (Starlette found
    no file), or, removed while it was sent, broke off after headers promising its whole length."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from cosyserve.api.errors import install_error_handlers
    from cosyserve.api.held_file import HeldFileResponse
    from cosyserve.api.outputs import removed_meanwhile

    path = tmp_path / "output_20250101_120000.wav"
    path.write_bytes(b"RIFF" + bytes(200_000))
    from types import SimpleNamespace

    gone = SimpleNamespace(path=tmp_path / "output_20250101_130000.wav")
    app = FastAPI()

    @app.get("/sent")
    def sent() -> HeldFileResponse:
        answer = HeldFileResponse(path, media_type="audio/wav")
        path.unlink()  # deleted once the answer was made, before a byte was sent
        return answer

    @app.get("/gone")
    def missing() -> HeldFileResponse:
        with removed_meanwhile(gone):
            return HeldFileResponse(gone.path, media_type="audio/wav")

    install_error_handlers(app)
    client = TestClient(app)
    whole = client.get("/sent")
    assert whole.status_code == 200 and len(whole.content) == 200_004 == int(whole.headers["content-length"])
    answer = client.get("/gone")
    assert answer.status_code == 404 and answer.json()["error"]["code"] == "output_not_found"


def test_a_read_only_output_directory_is_a_problem_not_a_crash(tmp_path: Path, monkeypatch) -> None:
    """On a read-only mount the probe's cleanup raised too, and /ready and streams answered 500."""
    store = make_store(tmp_path, min_free_bytes=1)
    saved = store.save(b"a", "wav", {})

    def read_only(*args, **kwargs):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr("builtins.open", read_only)
    monkeypatch.setattr(Path, "unlink", read_only)
    monkeypatch.setattr(Path, "touch", read_only)
    assert "Read-only file system" in (store.health._check() or "")
    from cosyserve.errors import StorageError

    with pytest.raises(StorageError, match="could not be deleted"):  # a 503, not a 500
        store.delete(saved.id)


def test_one_users_flood_evicts_its_own_results_first(tmp_path: Path) -> None:
    """The size cap is shared, and it evicted oldest first: two three-hour dub tracks (one cue's work
    each) removed every result another user had (a team's run). The largest holder gives up its own
    oldest first."""
    clock = FakeClock()
    probe = make_store(tmp_path / "probe", clock)
    pair = probe.save(b"x" * 1000, "wav", {"owner": "key:1"}).path.stat().st_size + 400
    store = make_store(tmp_path, clock, max_total_bytes=6 * pair)
    alices = []
    for _ in range(2):
        clock.now += 1
        alices.append(store.save(b"a" * 1000, "wav", {"owner": "key:alice"}).id)
    for _ in range(8):  # mallory floods
        clock.now += 1
        store.save(b"m" * 1000, "wav", {"owner": "key:mallory"})
    left = {o.id for o in store.list(limit=100)}
    assert set(alices) <= left  # alice's two older results stay
    assert store.total_bytes() <= store.max_total_bytes
    store.enforce_retention()  # the periodic pass follows the same rule
    assert set(alices) <= {o.id for o in store.list(limit=100)}
