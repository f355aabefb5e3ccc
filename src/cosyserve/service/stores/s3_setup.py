"""Setting a bucket up once, at start: that it exists (created when allowed) and that objects under the
service's prefix expire after a number of days (a lifecycle rule merged with the bucket's others)."""

from __future__ import annotations

import logging
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from cosyserve.service.stores.s3_failures import SyncError, code_of, describe, status_of

log = logging.getLogger(__name__)


def ensure_bucket(client: Any, bucket: str, *, region: str | None, where: str, create: bool = True) -> bool:
    """Make sure `bucket` exists; True if it was created now. SyncError if it can't be used."""
    try:
        client.head_bucket(Bucket=bucket)
        return False
    except ClientError as exc:
        status = status_of(exc)
        if status == 403:
            raise SyncError(
                f"access to bucket {bucket!r} is denied: check the access key and the bucket policy"
            ) from exc
        if status != 404:
            raise SyncError(f"bucket {bucket!r} can't be checked: {describe(exc)}") from exc
    except (BotoCoreError, OSError) as exc:
        raise SyncError(f"the S3 endpoint {where} can't be reached: {describe(exc)}") from exc
    if not create:
        raise SyncError(f"bucket {bucket!r} does not exist at {where}: create it, or allow creation")
    params: dict[str, Any] = {"Bucket": bucket}
    if region and region != "us-east-1":  # us-east-1 refuses an explicit constraint
        params["CreateBucketConfiguration"] = {"LocationConstraint": region}
    try:
        client.create_bucket(**params)
    except (BotoCoreError, ClientError) as exc:
        raise SyncError(f"bucket {bucket!r} can't be created: {describe(exc)}") from exc
    log.info("created bucket %s at %s", bucket, where)
    return True


def apply_lifecycle(client: Any, bucket: str, prefix: str, days: int) -> dict[str, Any]:
    """Expire objects under `prefix` after `days` days. Other lifecycle rules of the bucket are kept (put
    replaces the whole configuration, so ours is merged in by its ID). Returns our rule."""
    if days < 1:
        raise SyncError(f"lifecycle days must be at least 1, got {days}")
    rule_id = f"cosyserve-expire-{prefix or 'all'}"[:255]
    rule = {
        "ID": rule_id,
        "Filter": {"Prefix": f"{prefix}/" if prefix else ""},
        "Status": "Enabled",
        "Expiration": {"Days": int(days)},
    }
    try:
        try:
            existing = client.get_bucket_lifecycle_configuration(Bucket=bucket).get("Rules", [])
        except ClientError as exc:
            if code_of(exc) != "NoSuchLifecycleConfiguration":
                raise
            existing = []
        rules = [r for r in existing if r.get("ID") != rule_id] + [rule]
        client.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration={"Rules": rules})
    except (BotoCoreError, ClientError) as exc:
        raise SyncError(f"the lifecycle rule for {bucket!r} can't be set: {describe(exc)}") from exc
    return rule
