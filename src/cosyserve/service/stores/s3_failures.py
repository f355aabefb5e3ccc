"""What can go wrong with a bucket: the error the service raises, the record of an upload that gave up,
and which failures are worth another attempt (connection errors, timeouts, 5xx, throttling) and which are
not (access denied, a missing bucket, a local file gone).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotoConnectionError

from cosyserve.errors import SyncError as SyncError  # defined there, with the error table

TRANSIENT_CODES = frozenset(
    {"RequestTimeout", "RequestTimeTooSkewed", "SlowDown", "Throttling", "ThrottlingException",
     "InternalError", "ServiceUnavailable", "RequestLimitExceeded", "TooManyRequests"}
)  # fmt: skip


@dataclass(frozen=True)
class SyncFailure:
    op: str  # "put" or "delete"
    key: str  # full object key, prefix included
    path: Path | None  # local file of a put
    error: str
    attempts: int
    at: float  # unix time of giving up
    transient: bool = False  # worth trying again later (the bucket was down, the queue full)
    job: Any = None  # what to submit again: the upload with what follows it (an output's sidecar)


def status_of(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


def code_of(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def is_transient(exc: Exception) -> bool:
    if isinstance(exc, (BotoConnectionError, HTTPClientError)):
        return True
    if isinstance(exc, ClientError):
        status = status_of(exc)
        return status >= 500 or status == 429 or code_of(exc) in TRANSIENT_CODES
    return False  # local file errors, bad parameters, credentials: retrying can't help


def describe(exc: Exception) -> str:
    if isinstance(exc, ClientError):
        return f"{code_of(exc) or status_of(exc)}: {exc.response.get('Error', {}).get('Message', '') or exc}"
    return f"{type(exc).__name__}: {exc}"
