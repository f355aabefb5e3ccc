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

Reads (`fetch`, `exists`, `download`, `list_keys`) let every node serve outputs another node saved; they
run in the caller's thread with botocore's retries only and raise SyncError when the bucket can't be read,
after which reads fail at once for `read_retry_s` (30 s) instead of waiting for timeouts again.
"""

from __future__ import annotations

import collections
import logging
import queue
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from botocore.exceptions import BotoCoreError, ClientError

from cosyserve.service.stores.atomic_files import write_atomic
from cosyserve.service.stores.s3_failures import (
    SyncError,
    SyncFailure,
    code_of,
    describe,
    is_transient,
    status_of,
)
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
READ_RETRY_S = 30.0
T = TypeVar("T")


@dataclass(frozen=True)
class _Job:
    op: str
    key: str
    path: Path | None = None


class S3Sync:
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

        config = Config(
            region_name=region,
            retries={"mode": "standard", "total_max_attempts": max(1, botocore_attempts)},
            connect_timeout=connect_timeout_s,
            read_timeout=read_timeout_s,
            s3={"addressing_style": "path" if path_style else "auto"},
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        self.client = client or boto3.session.Session().client(
            "s3",
            endpoint_url=endpoint_url,
            region_name=region,
            aws_access_key_id=access_key_id,
            aws_secret_access_key=secret_access_key,
            config=config,
        )
        self.region = region
        self.uploaded = 0
        self.deleted = 0
        self.retries = 0  # attempts repeated after a transient failure
        self.failed_count = 0
        self.read_retry_s = READ_RETRY_S
        self._reads_down_until = 0.0  # time.monotonic() before which reads fail at once
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

    # -- reads (other nodes' outputs) ----------------------------------------------------------------

    def fetch(self, name: str) -> bytes | None:
        """The object `<prefix>/<name>`, or None if there is none; SyncError if the bucket can't be read."""
        return self._read(
            name, lambda: self.client.get_object(Bucket=self.bucket, Key=self.key(name))["Body"].read()
        )

    def exists(self, name: str) -> bool:
        """Whether `<prefix>/<name>` exists (a HEAD request); SyncError if the bucket can't be read."""
        found = self._read(name, lambda: self.client.head_object(Bucket=self.bucket, Key=self.key(name)))
        return found is not None

    def download(self, name: str, path: Path) -> bool:
        """Copy `<prefix>/<name>` to `path` (temp file + rename: never half a file under `path`); False if
        there is no such object, SyncError if the bucket can't be read."""
        data = self.fetch(name)
        if data is None:
            return False
        write_atomic(Path(path), data)
        return True

    def list_keys(self, prefix: str = "", max_keys: int | None = None) -> list[str]:
        """Names (keys without `<prefix>/`) that start with `prefix`, in ascending order; at most `max_keys`
        (all when None, page by page). SyncError if the bucket can't be listed."""
        root = self.key("")
        params: dict[str, Any] = {"Bucket": self.bucket, "Prefix": root + prefix}
        names: list[str] = []

        def pages() -> list[str]:
            while True:
                if max_keys is not None:
                    params["MaxKeys"] = min(1000, max_keys - len(names))
                page = self.client.list_objects_v2(**params)
                names.extend(item["Key"][len(root) :] for item in page.get("Contents", []))
                if not page.get("IsTruncated") or (max_keys is not None and len(names) >= max_keys):
                    return names
                params["ContinuationToken"] = page["NextContinuationToken"]

        return self._read(prefix + "*", pages) or []

    def _read(self, what: str, call: Callable[[], T]) -> T | None:
        """`call()`, None for a missing object. SyncError for any other failure, after which reads fail
        at once for `read_retry_s` (an unreachable endpoint would cost timeouts on every request)."""
        left = self._reads_down_until - time.monotonic()
        if left > 0:
            raise SyncError(f"the bucket {self.bucket!r} failed a moment ago; reads resume in {left:.0f} s")
        try:
            return call()
        except ClientError as exc:
            if status_of(exc) == 404 and code_of(exc) in ("NoSuchKey", "NotFound", "404"):
                return None
            error = SyncError(f"{self.key(what)} can't be read from {self.bucket!r}: {describe(exc)}")
            cause: Exception = exc
        except (BotoCoreError, OSError) as exc:
            error = SyncError(f"the S3 endpoint {self._where()} can't be reached: {describe(exc)}")
            cause = exc
        log.warning("%s; reads skip the bucket for %.0f s", error, self.read_retry_s)
        self._reads_down_until = time.monotonic() + self.read_retry_s
        raise error from cause

    def delete_now(self, name: str) -> None:
        """Remove `<prefix>/<name>` in this thread, with retries; SyncError if that fails for good."""
        failure = self._attempt(_Job("delete", self.key(name)))
        if failure is not None:
            raise SyncError(f"deleting {failure.key} from {self.bucket!r} failed: {failure.error}")

    # -- uploads -------------------------------------------------------------------------------------

    def upload_now(self, path: Path, key: str) -> None:
        """Upload `path` as `<prefix>/<key>` in this thread, with retries; SyncError if it fails for good."""
        failure = self._attempt(_Job("put", self.key(key), Path(path)))
        if failure is not None:
            raise SyncError(f"upload of {path} to {failure.key} failed: {failure.error}")

    def enqueue(self, path: Path, key: str) -> bool:
        """Queue `path` for upload as `<prefix>/<key>`; False (and recorded in `failed`) if the queue is
        full or the sync is closed."""
        return self._submit(_Job("put", self.key(key), Path(path)))

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

    def retry_failed(self) -> int:
        """Queue the recorded failed uploads again (those whose file still exists); returns how many."""
        failures, self._failures = list(self._failures), collections.deque(maxlen=MAX_RECORDED_FAILURES)
        queued = 0
        for failure in failures:
            if failure.path is not None and failure.path.exists():
                queued += self._submit(_Job(failure.op, failure.key, failure.path))
            elif failure.op == "delete":
                queued += self._submit(_Job("delete", failure.key))
        return queued

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
            job = self._queue.get()
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
                return None
            except Exception as exc:
                if not is_transient(exc) or attempt == self.max_attempts:
                    return self._record(job, describe(exc), attempt)
                delay = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1)) * random.uniform(0.5, 1)
                log.info("S3 %s of %s failed (%s); retry %d in %.1fs", job.op, job.key, exc, attempt, delay)
                self.retries += 1
                if self._stop.wait(delay):
                    return self._record(job, f"given up at shutdown after: {describe(exc)}", attempt)
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

    def _record(self, job: _Job, error: str, attempts: int) -> SyncFailure:
        failure = SyncFailure(job.op, job.key, job.path, error, attempts, time.time())
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
