"""Copies outputs to an S3-compatible bucket (AWS S3, Tencent COS, Aliyun OSS, MinIO, Cloudflare R2, ...).

Uploads run in one background thread fed by a bounded queue, so a slow or unreachable bucket never slows
synthesis. Each upload is retried twice over: botocore's own retries (standard mode) inside one attempt,
and our attempts with exponential backoff and jitter around it for transient failures (connection
errors, timeouts, 5xx, throttling). Permanent failures (access denied, missing bucket, a local file gone)
are not retried. Nothing fails silently: every upload that gives up is logged and kept in `failed`.

Compatibility choices:
- `path_style=True` addresses `endpoint/bucket/key` (MinIO, moto, most self-hosted servers); the default
  lets botocore choose (virtual-hosted for AWS and COS).
- Checksums are sent only where the API requires them: botocore >= 1.36 adds CRC32 headers to every
  upload by default, which several S3-compatible services reject.
- Objects are written with `put_object` (one request; outputs are at most tens of MB).

Remote deletion is optional: `enqueue_delete` exists and `OutputStore(sync_deletes=True)` uses it;
otherwise objects stay until the bucket's lifecycle rule (`apply_lifecycle`) expires them.

An output is uploaded as a pair, its audio first and its sidecar only once the audio is there: a sidecar
in the bucket means its audio is there too. An upload that gave up on a transient failure (the bucket
down, the queue full) is tried again, with what follows it, every `catch_up_s` (60 s) while the sync is
idle; `status()` says whether anything is still waiting to get there (`/ready`, `/metrics`).

Reads (`s3_reads.BucketReads`: `fetch`, `exists`, `download`, `list_keys`, `delete_now`) let every node
serve outputs another node saved; they run in the caller's thread on a client with short timeouts.
"""

from __future__ import annotations

import collections
import logging
import queue
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cosyserve.service.stores.s3_failures import SyncError, SyncFailure, describe, is_transient
from cosyserve.service.stores.s3_reads import READ_CONNECT_TIMEOUT_S, READ_TIMEOUT_S, BucketReads
from cosyserve.service.stores.s3_setup import apply_lifecycle, ensure_bucket

log = logging.getLogger(__name__)

CONTENT_TYPES = {
    ".wav": "audio/wav",
    ".mp3": "audio/mpeg",
    ".opus": "audio/ogg",
    ".flac": "audio/flac",
    ".pcm": "audio/pcm",
    ".json": "application/json",
}
MAX_RECORDED_FAILURES = 1000
CATCH_UP_S = 60.0


@dataclass(frozen=True)
class _Job:
    op: str
    key: str
    path: Path | None = None
    then: _Job | None = None  # run once this one succeeded (an output's sidecar after its audio)


class S3Sync(BucketReads):
    """One bucket + prefix; `enqueue` for background uploads, `upload_now` to wait for one."""

    def __init__(
        self,
        endpoint_url: str | None,
        bucket: str,
        prefix: str = "",
        region: str | None = None,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        lifecycle_days: int | None = None,
        max_attempts: int = 5,
        *,
        path_style: bool = False,
        queue_size: int = 1000,
        backoff_s: float = 1.0,
        max_backoff_s: float = 60.0,
        botocore_attempts: int = 3,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 60.0,
        client: Any = None,
    ) -> None:
        if not bucket:
            raise SyncError("no bucket given: set the S3 bucket name, or turn S3 sync off")
        if max_attempts < 1:
            raise SyncError(f"max_attempts must be at least 1, got {max_attempts}")
        self.endpoint_url = endpoint_url
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.lifecycle_days = lifecycle_days
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        import boto3  # only when S3 sync is on (boto3's import costs ~0.15 s of every start)
        from botocore.config import Config

        def make_client(attempts: int, connect_s: float, read_s: float) -> Any:
            config = Config(
                region_name=region,
                retries={"mode": "standard", "total_max_attempts": max(1, attempts)},
                connect_timeout=connect_s,
                read_timeout=read_s,
                s3={"addressing_style": "path" if path_style else "auto"},
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            )
            return boto3.session.Session().client(
                "s3",
                endpoint_url=endpoint_url,
                region_name=region,
                aws_access_key_id=access_key_id,
                aws_secret_access_key=secret_access_key,
                config=config,
            )

        self.client = client or make_client(botocore_attempts, connect_timeout_s, read_timeout_s)
        self.read_client = client or make_client(1, READ_CONNECT_TIMEOUT_S, READ_TIMEOUT_S)
        self.region = region
        self.uploaded = 0
        self.deleted = 0
        self.retries = 0  # attempts repeated after a transient failure
        self.failed_count = 0
        self.catch_up_s = CATCH_UP_S
        self._next_catch_up = 0.0  # time.monotonic() of the next retry of transient failures
        self._failures: collections.deque[SyncFailure] = collections.deque(maxlen=MAX_RECORDED_FAILURES)
        self._queue: queue.Queue[_Job | None] = queue.Queue(maxsize=queue_size)
        self._pending = 0  # enqueued and not finished (queued or in progress)
        self._idle = threading.Condition()
        self._stop = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="cosyserve-s3sync", daemon=True)
        self._thread.start()

    # -- bucket setup --------------------------------------------------------------------------------

    def key(self, name: str) -> str:
        """The object key for a file name: `<prefix>/<name>`."""
        return f"{self.prefix}/{name}" if self.prefix else name

    def prepare(self, create_bucket: bool = False) -> None:
        """Check the bucket (creating it when allowed) and apply `lifecycle_days` if set; call at startup."""
        self.ensure_bucket(create=create_bucket)
        if self.lifecycle_days:
            self.apply_lifecycle(self.lifecycle_days)

    def ensure_bucket(self, create: bool = True) -> bool:
        """Make sure the bucket exists; True if it was created now. SyncError if it can't be used."""
        return ensure_bucket(self.client, self.bucket, region=self.region, where=self._where(), create=create)

    def apply_lifecycle(self, days: int) -> dict[str, Any]:
        """Expire objects under the prefix after `days` days, keeping the bucket's other rules."""
        return apply_lifecycle(self.client, self.bucket, self.prefix, days)

    def presign(self, name: str, expires_s: int = 900) -> str:
        """A time-limited download URL for an uploaded file, straight from the bucket."""
        return self.client.generate_presigned_url(
            "get_object", Params={"Bucket": self.bucket, "Key": self.key(name)}, ExpiresIn=int(expires_s)
        )

    # -- uploads -------------------------------------------------------------------------------------

    def upload_now(self, path: Path, key: str, then: Path | None = None) -> None:
        """Upload `path` as `<prefix>/<key>` in this thread, with retries, and then `then` (under its own
        name); SyncError if either fails for good."""
        failure = self._attempt(self._put(path, key, then))
        if failure is not None:
            raise SyncError(f"upload of {failure.path} to {failure.key} failed: {failure.error}")

    def enqueue(self, path: Path, key: str, then: Path | None = None) -> bool:
        """Queue `path` for upload as `<prefix>/<key>`, and `then` (under its own name) once it is there;
        False (and recorded in `failed`, to be tried again) if the queue is full or the sync is closed."""
        return self._submit(self._put(path, key, then))

    def _put(self, path: Path, key: str, then: Path | None) -> _Job:
        after = _Job("put", self.key(then.name), Path(then)) if then is not None else None
        return _Job("put", self.key(key), Path(path), after)

    def status(self) -> dict[str, Any]:
        """Whether everything saved got to the bucket: `ok` false while an upload that gave up waits to be
        tried again (`failing`), with the last error; the counts (`/ready`, `/metrics`, `/admin/status`)."""
        failures = list(self._failures)
        waiting = [f for f in failures if f.transient]
        return {
            "ok": not waiting,
            "failing": len(waiting),
            "pending": max(0, self._pending),
            "uploaded": self.uploaded,
            "failed_total": self.failed_count,
            "retries": self.retries,
            "last_error": failures[-1].error if failures else None,
        }

    def enqueue_delete(self, key: str) -> bool:
        """Queue the removal of `<prefix>/<key>` from the bucket."""
        return self._submit(_Job("delete", self.key(key)))

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued job has finished (uploaded or failed); False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._idle:
            while self._pending:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._idle.wait(remaining)
        return True

    def close(self, timeout: float = 30.0) -> None:
        """Finish queued uploads (up to `timeout` s), then stop; what is left is recorded as failed."""
        if self._closed:
            return
        self.flush(timeout)
        self._closed = True
        self._stop.set()  # also ends backoff waits
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                self._record(job, "not uploaded: the sync was closed first", 0)
                self._done()
        self._queue.put(None)
        self._thread.join(timeout=max(1.0, timeout))

    @property
    def failed(self) -> list[SyncFailure]:
        """The most recent failures (up to MAX_RECORDED_FAILURES; `failed_count` counts all)."""
        return list(self._failures)

    def retry_failed(self, transient_only: bool = False) -> int:
        """Queue the recorded failed jobs again (an upload whose file still exists, with what follows it);
        with `transient_only`, those that failed for a reason that may have passed. Returns how many."""
        failures, self._failures = list(self._failures), collections.deque(maxlen=MAX_RECORDED_FAILURES)
        queued = 0
        for failure in failures:
            if transient_only and not failure.transient:
                self._failures.append(failure)
                continue
            job = failure.job or _Job(failure.op, failure.key, failure.path)
            if job.op == "delete" or (job.path is not None and job.path.exists()):
                queued += self._submit(job)
        return queued

    def _catch_up(self) -> None:
        """While idle: the uploads that gave up on a transient failure, tried again every `catch_up_s`."""
        now = time.monotonic()
        if now < self._next_catch_up or not any(f.transient for f in self._failures):
            return
        self._next_catch_up = now + self.catch_up_s
        queued = self.retry_failed(transient_only=True)
        if queued:
            log.info("S3: trying %d uploads that failed earlier again", queued)

    # -- worker --------------------------------------------------------------------------------------

    def _submit(self, job: _Job) -> bool:
        if self._closed:
            self._record(job, "not queued: the sync is closed", 0)
            return False
        with self._idle:
            self._pending += 1
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            self._done()
            self._record(job, f"not queued: {self._queue.maxsize} uploads are already waiting", 0)
            return False
        return True

    def _run(self) -> None:
        while True:
            try:
                job = self._queue.get(timeout=self.catch_up_s)
            except queue.Empty:
                self._catch_up()
                continue
            if job is None:
                return
            try:
                self._attempt(job)
            except Exception:  # a bug must not kill the thread and strand the queue
                log.exception("unexpected error syncing %s", job.key)
            finally:
                self._done()

    def _attempt(self, job: _Job) -> SyncFailure | None:
        """Run `job` up to `max_attempts` times; the failure (also recorded) if it never succeeded."""
        for attempt in range(1, self.max_attempts + 1):
            try:
                self._perform(job)
                return self._attempt(job.then) if job.then is not None else None
            except Exception as exc:
                if not is_transient(exc) or attempt == self.max_attempts:
                    return self._record(job, describe(exc), attempt, transient=is_transient(exc))
                delay = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1)) * random.uniform(0.5, 1)
                log.info("S3 %s of %s failed (%s); retry %d in %.1fs", job.op, job.key, exc, attempt, delay)
                self.retries += 1
                if self._stop.wait(delay):
                    failed = f"given up at shutdown after: {describe(exc)}"
                    return self._record(job, failed, attempt, transient=True)
        return None  # unreachable: the loop returns on its last attempt

    def _perform(self, job: _Job) -> None:
        if job.op == "delete":
            self.client.delete_object(Bucket=self.bucket, Key=job.key)
            self.deleted += 1
            return
        if job.path is None:  # pragma: no cover - every put is made with its file
            raise SyncError(f"no local file to upload as {job.key}")
        body = job.path.read_bytes()
        content_type = CONTENT_TYPES.get(job.path.suffix.lower(), "application/octet-stream")
        self.client.put_object(Bucket=self.bucket, Key=job.key, Body=body, ContentType=content_type)
        self.uploaded += 1

    def _record(self, job: _Job, error: str, attempts: int, *, transient: bool = True) -> SyncFailure:
        """`job` gave up (`transient`: for a reason that may pass; it is tried again while idle)."""
        failure = SyncFailure(job.op, job.key, job.path, error, attempts, time.time(), transient, job)
        self._failures.append(failure)
        self.failed_count += 1
        log.error("S3 %s of %s to bucket %s failed for good: %s", job.op, job.key, self.bucket, error)
        return failure

    def _done(self) -> None:
        with self._idle:
            self._pending -= 1
            self._idle.notify_all()

    def _where(self) -> str:
        return self.endpoint_url or "AWS S3"
