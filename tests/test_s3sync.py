"""S3 sync against a real S3-compatible server (moto's, on 127.0.0.1): uploads, lifecycle, retries."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from botocore.exceptions import EndpointConnectionError

from cosyserve.service.stores.outputs import OutputStore
from cosyserve.service.stores.s3sync import S3Sync, SyncError

moto_server = pytest.importorskip("moto.server")


def start_server(port: int = 0) -> moto_server.ThreadedMotoServer:
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    return server


def stop_server(server: moto_server.ThreadedMotoServer) -> None:
    server.stop()
    server._server.server_close()  # release the port: connections are refused, not left hanging


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    server = start_server()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    stop_server(server)


_bucket_counter = iter(range(10_000))


def make_sync(endpoint: str, bucket: str | None = None, **kwargs: object) -> S3Sync:
    options: dict[str, object] = {"path_style": True, "backoff_s": 0.01, "botocore_attempts": 1}
    options.update(kwargs)
    return S3Sync(
        endpoint,
        bucket or f"bucket-{next(_bucket_counter)}",
        "outputs/",
        "us-east-1",
        "test",
        "test",
        **options,
    )


def body(sync: S3Sync, key: str) -> bytes:
    return sync.client.get_object(Bucket=sync.bucket, Key=key)["Body"].read()


def test_prepare_creates_the_bucket_and_a_lifecycle_rule_keeping_others(endpoint: str) -> None:
    sync = make_sync(endpoint, lifecycle_days=7)
    with pytest.raises(SyncError, match="does not exist"):
        sync.ensure_bucket(create=False)
    assert sync.ensure_bucket() is True and sync.ensure_bucket() is False
    other = {"ID": "keep-me", "Filter": {"Prefix": "logs/"}, "Status": "Enabled", "Expiration": {"Days": 30}}
    sync.client.put_bucket_lifecycle_configuration(
        Bucket=sync.bucket, LifecycleConfiguration={"Rules": [other]}
    )
    sync.prepare()
    sync.apply_lifecycle(7)  # twice: replaced by ID, not duplicated
    rules = sync.client.get_bucket_lifecycle_configuration(Bucket=sync.bucket)["Rules"]
    ours = [r for r in rules if r["ID"].startswith("cosyserve-")]
    assert len(ours) == 1 and ours[0]["Expiration"]["Days"] == 7 and ours[0]["Filter"]["Prefix"] == "outputs/"
    assert any(r["ID"] == "keep-me" for r in rules)
    sync.close()


def test_enqueued_uploads_arrive_intact(endpoint: str, tmp_path: Path) -> None:
    sync = make_sync(endpoint)
    sync.ensure_bucket()
    files = {}
    for i in range(5):
        path = tmp_path / f"out{i}.wav"
        path.write_bytes(bytes(range(256)) * (i + 1))
        files[path.name] = path
        assert sync.enqueue(path, path.name)
    assert sync.flush(timeout=20)
    for name, path in files.items():
        assert body(sync, f"outputs/{name}") == path.read_bytes()
    head = sync.client.head_object(Bucket=sync.bucket, Key="outputs/out0.wav")
    assert head["ContentType"] == "audio/wav"
    assert sync.uploaded == 5 and sync.failed == [] and sync.retries == 0
    sync.close()


def test_upload_now_and_presigned_download(endpoint: str, tmp_path: Path) -> None:
    sync = make_sync(endpoint)
    sync.ensure_bucket()
    path = tmp_path / "a.json"
    path.write_text('{"x": 1}')
    sync.upload_now(path, "a.json")
    assert body(sync, "outputs/a.json") == b'{"x": 1}'
    assert httpx.get(sync.presign("a.json", 60)).content == b'{"x": 1}'
    sync.close()


def test_transient_failures_are_retried(endpoint: str, tmp_path: Path) -> None:
    sync = make_sync(endpoint)
    sync.ensure_bucket()
    real_put, calls = sync.client.put_object, []

    def flaky_put(**kwargs: object) -> object:
        calls.append(kwargs["Key"])
        if len(calls) <= 2:
            raise EndpointConnectionError(endpoint_url=endpoint)
        return real_put(**kwargs)

    sync.client.put_object = flaky_put
    path = tmp_path / "r.wav"
    path.write_bytes(b"retry me")
    sync.enqueue(path, "r.wav")
    assert sync.flush(timeout=20)
    assert len(calls) == 3 and sync.retries == 2 and sync.failed == []
    assert body(sync, "outputs/r.wav") == b"retry me"
    sync.close()


def test_an_outage_is_ridden_out(tmp_path: Path) -> None:
    server = start_server()
    host, port = server.get_host_and_port()
    sync = make_sync(f"http://{host}:{port}", backoff_s=0.2, max_attempts=8)
    sync.ensure_bucket()
    stop_server(server)
    path = tmp_path / "during-outage.wav"
    path.write_bytes(b"patience")
    sync.enqueue(path, path.name)
    time.sleep(0.3)  # the first attempts fail: nothing listens
    server = start_server(port)  # moto keeps its state in-process, so the bucket is still there
    try:
        assert sync.flush(timeout=30)
        assert sync.retries >= 1 and sync.failed == []
        assert body(sync, "outputs/during-outage.wav") == b"patience"
    finally:
        sync.close()
        stop_server(server)


def test_an_output_given_up_on_gets_there_once_the_bucket_is_back(tmp_path: Path) -> None:
    """Uploads that gave up during an outage were never tried again, and a sidecar could reach the
    bucket without its audio (a team's run): the pair goes audio first, sidecar only after it, and
    a pair that gave up on a transient failure is tried again while the sync is idle."""
    server = start_server()
    host, port = server.get_host_and_port()
    sync = make_sync(f"http://{host}:{port}", max_attempts=1)
    sync.ensure_bucket()
    stop_server(server)
    audio, sidecar = tmp_path / "output_1.wav", tmp_path / "output_1.json"
    audio.write_bytes(b"audio")
    sidecar.write_bytes(b"{}")
    sync.catch_up_s = 0.2
    sync.enqueue(audio, audio.name, then=sidecar)
    assert sync.flush(timeout=30)
    assert [f.key for f in sync.failed] == ["outputs/output_1.wav"]  # the sidecar was not tried alone
    assert sync.status()["ok"] is False and sync.status()["failing"] == 1
    server = start_server(port)
    try:
        deadline = time.monotonic() + 30
        while not sync.status()["ok"] or sync.status()["pending"]:
            assert time.monotonic() < deadline, sync.status()
            time.sleep(0.1)
        assert body(sync, "outputs/output_1.wav") == b"audio" and body(sync, "outputs/output_1.json") == b"{}"
    finally:
        sync.close()
        stop_server(server)


def test_permanent_failures_are_recorded_not_retried(endpoint: str, tmp_path: Path) -> None:
    sync = make_sync(endpoint)
    sync.ensure_bucket()
    sync.enqueue(tmp_path / "missing.wav", "missing.wav")
    assert sync.flush(timeout=10)
    assert sync.failed_count == 1
    failure = sync.failed[0]
    assert (
        failure.key == "outputs/missing.wav"
        and failure.attempts == 1
        and "FileNotFoundError" in failure.error
    )
    no_bucket = make_sync(endpoint, bucket="never-created")
    with pytest.raises(SyncError, match="failed"):
        (tmp_path / "f.wav").write_bytes(b"x")
        no_bucket.upload_now(tmp_path / "f.wav", "f.wav")
    assert no_bucket.failed[0].attempts == 1  # NoSuchBucket is not transient
    sync.close()
    no_bucket.close()


def test_giving_up_after_max_attempts(endpoint: str, tmp_path: Path) -> None:
    sync = make_sync(endpoint, max_attempts=3)

    def always_down(**kwargs: object) -> object:
        raise EndpointConnectionError(endpoint_url=endpoint)

    sync.client.put_object = always_down
    path = tmp_path / "x.wav"
    path.write_bytes(b"x")
    sync.enqueue(path, "x.wav")
    assert sync.flush(timeout=10)
    assert sync.failed[0].attempts == 3 and sync.retries == 2
    sync.client.put_object = lambda **kwargs: None  # the endpoint is back: failed uploads can be requeued
    assert sync.retry_failed() == 1 and sync.flush(timeout=10)
    assert sync.failed == [] and sync.uploaded == 1
    sync.close()


def test_a_full_queue_refuses_and_records(endpoint: str, tmp_path: Path) -> None:
    sync = make_sync(endpoint, queue_size=1)
    gate = threading.Event()
    sync.client.put_object = lambda **kwargs: gate.wait(10)
    path = tmp_path / "q.wav"
    path.write_bytes(b"q")
    accepted = [sync.enqueue(path, f"q{i}.wav") for i in range(4)]
    assert accepted[0] and not all(accepted)  # one in flight, one queued, the rest refused
    assert any("not queued" in f.error for f in sync.failed)
    gate.set()
    assert sync.flush(timeout=10)
    sync.close()
    assert not sync.enqueue(path, "late.wav")  # closed: refused and recorded
    assert sync.failed[-1].error.startswith("not queued")


def test_output_store_uploads_and_deletes_through_sync(endpoint: str, tmp_path: Path) -> None:
    sync = make_sync(endpoint)
    sync.ensure_bucket()
    store = OutputStore(tmp_path / "outputs", sync=sync, sync_deletes=True)
    saved = store.save(b"RIFFdata", "wav", {"text": "hello"})
    assert sync.flush(timeout=20)
    assert body(sync, f"outputs/{saved.path.name}") == b"RIFFdata"
    assert body(sync, f"outputs/{saved.sidecar_path.name}") == saved.sidecar_path.read_bytes()
    store.delete(saved.id)
    assert sync.flush(timeout=20)
    assert sync.client.list_objects_v2(Bucket=sync.bucket, Prefix="outputs/")["KeyCount"] == 0
    sync.close()


def test_outputs_the_bucket_never_got_are_uploaded_after_a_restart(endpoint: str, tmp_path: Path) -> None:
    """The sync remembers uploads that gave up only while it runs: after a restart, the retention
    worker's pass finds the outputs made here that the bucket lacks and queues them."""
    made_offline = OutputStore(tmp_path / "outputs").save(b"RIFFdata", "wav", {})  # the bucket never saw it
    sync = make_sync(endpoint)
    sync.ensure_bucket()
    store = OutputStore(tmp_path / "outputs", sync=sync, remote_reads=False)
    assert store.upload_missing() == 1 and sync.flush(timeout=20)
    assert body(sync, f"outputs/{made_offline.path.name}") == b"RIFFdata"
    assert store.upload_missing() == 0  # there now
    sync.close()


def test_reads_list_fetch_download_and_fail_fast(endpoint: str, tmp_path: Path) -> None:
    sync = make_sync(endpoint)
    sync.ensure_bucket()
    for name in ("b.wav", "a.json", "a.wav"):
        (tmp_path / name).write_bytes(name.encode())
        sync.upload_now(tmp_path / name, name)
    assert sync.list_keys() == ["a.json", "a.wav", "b.wav"]  # without the prefix, ascending
    assert sync.list_keys("a.") == ["a.json", "a.wav"] and sync.list_keys(max_keys=1) == ["a.json"]
    assert sync.fetch("b.wav") == b"b.wav" and sync.fetch("nope.wav") is None
    assert sync.exists("a.wav") and not sync.exists("nope.wav")
    target = tmp_path / "down" / "copy.wav"
    target.parent.mkdir()
    assert sync.download("a.wav", target) and target.read_bytes() == b"a.wav"
    assert not sync.download("nope.wav", tmp_path / "down" / "x.wav")
    assert [p.name for p in target.parent.iterdir()] == ["copy.wav"]  # no temp files left
    sync.close()

    dead = S3Sync("http://127.0.0.1:9", "b", "", "us-east-1", "x", "y", path_style=True, botocore_attempts=1)
    started = time.monotonic()
    with pytest.raises(SyncError, match="can't be reached"):
        dead.fetch("a.wav")
    with pytest.raises(SyncError, match="reads resume"):
        dead.list_keys()  # no second wait for the endpoint
    assert time.monotonic() - started < 5
    dead.close()
