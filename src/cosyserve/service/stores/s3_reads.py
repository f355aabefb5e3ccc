"""Reads of the bucket that run in a request's thread: another node's output (`fetch`, `exists`,
`download`, `list_keys`) and the delete a user waits for (`delete_now`).

They use a client of their own with short timeouts (3 s to connect, 10 s to read, no botocore retry): the
uploads' client waits up to a minute per try, three tries, and a bucket that took connections but never
answered held `GET /v1/outputs` for 120 s and a user's DELETE for 313 s. A read that fails makes every
read fail at once for `read_retry_s` (30 s) instead of waiting for its timeout again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from botocore.exceptions import BotoCoreError, ClientError

from cosyserve.service.stores.atomic_files import write_atomic
from cosyserve.service.stores.s3_failures import SyncError, code_of, describe, status_of

log = logging.getLogger("cosyserve.service.stores.s3sync")

READ_RETRY_S = 30.0
READ_CONNECT_TIMEOUT_S = 3.0
READ_TIMEOUT_S = 10.0
T = TypeVar("T")


class BucketReads:
    """The reads of `S3Sync` (which sets `bucket`, `read_client`, `key()` and `_where()`)."""

    bucket: str
    read_client: Any
    read_retry_s: float = READ_RETRY_S
    _reads_down_until: float = 0.0  # time.monotonic() before which reads fail at once

    def key(self, name: str) -> str:
        raise NotImplementedError

    def _where(self) -> str:
        raise NotImplementedError

    def fetch(self, name: str) -> bytes | None:
        """The object `<prefix>/<name>`, or None if there is none; SyncError if the bucket can't be read."""
        return self._read(
            name, lambda: self.read_client.get_object(Bucket=self.bucket, Key=self.key(name))["Body"].read()
        )

    def exists(self, name: str) -> bool:
        """Whether `<prefix>/<name>` exists (a HEAD request); SyncError if the bucket can't be read."""
        found = self._read(name, lambda: self.read_client.head_object(Bucket=self.bucket, Key=self.key(name)))
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
                page = self.read_client.list_objects_v2(**params)
                names.extend(item["Key"][len(root) :] for item in page.get("Contents", []))
                if not page.get("IsTruncated") or (max_keys is not None and len(names) >= max_keys):
                    return names
                params["ContinuationToken"] = page["NextContinuationToken"]

        return self._read(prefix + "*", pages) or []

    def delete_now(self, name: str) -> None:
        """Remove `<prefix>/<name>` while the caller waits (a user's DELETE): SyncError at once while the
        bucket is known to be down, or when this delete fails."""
        self._read(name, lambda: self.read_client.delete_object(Bucket=self.bucket, Key=self.key(name)))

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
