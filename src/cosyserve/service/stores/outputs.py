"""Finished results on disk: one audio file plus a JSON provenance sidecar per output, with retention.

Layout: `<root>/output_YYYYMMDD_HHMMSS[_N].<ext>` and `<root>/<same stem>.json`, where `root` is the
outputs directory itself (e.g. `<data dir>/outputs`). The stem is the output id. Times in names are the
local time of `zone` (`--timezone`), which people read; the sidecar records the UTC instant too. Lists
sort by name, which is creation order except across a DST fall-back hour or a change of `--timezone`.

How a save stays safe with many threads and processes writing at once, and with crashes:
1. The id is reserved by creating `<stem>.json` with O_EXCL (empty placeholder); on collision the next
   counter suffix `_1`, `_2`, ... is tried. Nothing is ever overwritten.
2. The audio is written to a hidden temp file, fsynced and renamed to `<stem>.<ext>`.
3. The sidecar is written the same way and renamed over the placeholder.
An output counts as complete only once its sidecar parses; readers skip the rest, and
`enforce_retention` removes leftovers (placeholders, temp files, audio without sidecar) after an hour.
Deletion removes the audio first and the sidecar last, so the id stays reserved until both are gone.

Remote copies: with an `S3Sync`, each save enqueues the audio and the sidecar for upload (in the
background; the audio first, so a sidecar in the bucket means its audio is there too). Local retention
never deletes remote objects: give the bucket a lifecycle rule (`S3Sync.apply_lifecycle`) for that.

Several nodes sharing a bucket (`remote_reads`, on by default with a sync): `get` of an output that is not
on this node downloads the pair into `root` (`bucket.OutputBucket`), where local retention treats
it like any other. Such a copy is served only while the bucket still has the output (checked at most
every few seconds), so a delete on one node reaches the others; outputs a node saved itself stay there
until its retention. `list` merges the bucket's sidecars with the local ones (fetched as needed, at most
limit + offset per call, and cached). Ids carry a per-node tag
(`_<6-digit tag><6-digit counter>`), so two nodes saving in the same second never write the same key.
`delete()` removes the remote sidecar at once (else the output would come back from the bucket), then
the audio; without remote reads it deletes the remote pair only with `sync_deletes=True`. While the
bucket can't be read, each node serves what it has locally.
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import itertools
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, tzinfo
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cosyserve import __version__
from cosyserve.errors import InputError, StorageError
from cosyserve.service.stores.atomic_files import content_digest, put_content
from cosyserve.service.stores.bucket import (
    BUCKET_COPY,  # noqa: F401  (re-exported, as are OutputNotFound, StoredOutput, check_output_id)
    REMOTE_LIST_TTL_S,
    OutputBucket,
    RemoteWalk,
)
from cosyserve.service.stores.output_files import (
    EXTENSION,
    OUTPUT_ID,
    TOMBSTONE,
    OutputNotFound,
    StoredOutput,
    build_manifest,  # noqa: F401  (re-exported)
    check_output_id,
    parse_sidecar,
    remove_pair,
    sort_key,
    to_json,
    write_atomic,
)
from cosyserve.service.stores.output_retention import (  # noqa: F401  (re-exported)
    STRAY_GRACE_S,
    Retention,
    RetentionReport,
)
from cosyserve.service.stores.output_space import SizeIndex, StorageHealth
from cosyserve.service.stores.output_timezone import local_datetime

if TYPE_CHECKING:
    from cosyserve.service.labels.labeller import Labeller
    from cosyserve.service.stores.s3sync import S3Sync

log = logging.getLogger(__name__)

MAX_SUFFIX = 999_999  # outputs with the same second-resolution stamp
MAX_LIST_LIMIT = 1000
MAX_REQUEST_SEARCH = 100_000  # bucket sidecars one request-id lookup may fetch (local ones are read anyway)
NODE_TAGS = range(100_000, 1_000_000)  # 6 digits, so tagged counters never look like plain ones


class OutputStore(Retention):
    """Saves, finds, lists and expires outputs under `root` (see the module docstring for the layout)."""

    def __init__(
        self,
        root: Path,
        *,
        retention_days: float | None = None,
        max_total_bytes: int | None = None,
        clock: Callable[[], float] = time.time,
        sync: S3Sync | None = None,
        sync_deletes: bool = False,
        url_prefix: str = "/v1/outputs",
        remote_reads: bool | None = None,
        node_tag: int | None = None,
        zone: tzinfo | None = None,
        min_free_bytes: int = 0,
        labels: Labeller | None = None,
    ) -> None:
        self.labels = labels  # labels every saved file with its id (None: files are kept as given)
        self.zone = zone  # of the file names (None: this machine's local time); sidecars say UTC too
        if (retention_days or 0) < 0 or (max_total_bytes or 0) < 0:
            raise InputError(
                f"retention_days and max_total_bytes must be positive, or 0/None for no limit "
                f"(got {retention_days}, {max_total_bytes})"
            )
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.retention_days = retention_days or None  # 0 and None: keep forever
        self.max_total_bytes = max_total_bytes or None
        self.sync = sync
        self.sync_deletes = sync_deletes
        self.url_prefix = url_prefix.rstrip("/")
        self._clock = clock
        self._retention_lock = threading.Lock()
        self.health = StorageHealth(self.root, min_free_bytes)  # can results be saved here? (/ready)
        self._sizes = SizeIndex(lambda: ((i, size, owner) for i, _at, size, owner in self._light_scan()))
        # the bucket other nodes' outputs are read from (None: this node's outputs only)
        self.remote = sync if (sync is not None if remote_reads is None else remote_reads) else None
        if node_tag is not None and node_tag not in NODE_TAGS:
            raise InputError(f"node_tag must be a 6-digit number (100000-999999), got {node_tag}")
        self.node_tag = (node_tag or random.choice(NODE_TAGS)) if self.remote is not None else None
        self.bucket = OutputBucket(self.remote, self.root, self.url_prefix, clock) if self.remote else None
        # told of each output deleted here, so other nodes drop their copies (a cluster's tombstones)
        self.on_deleted: Callable[[str], object] | None = None
        # told the ids retention or the size cap removed
        self.on_expired: Callable[[list[str]], object] | None = None

    @property
    def remote_list_ttl_s(self) -> float:
        """How long bucket listings and presence checks are reused, in seconds."""
        return self.bucket.ttl_s if self.bucket is not None else REMOTE_LIST_TTL_S

    @remote_list_ttl_s.setter
    def remote_list_ttl_s(self, seconds: float) -> None:
        if self.bucket is not None:
            self.bucket.ttl_s = seconds

    # -- writing -------------------------------------------------------------------------------------

    def save(
        self, audio: bytes | Path, ext: str, manifest: dict[str, Any], *, upload_now: bool = False
    ) -> StoredOutput:
        """Store one result; `manifest` (from `build_manifest` or the caller's own) goes into the sidecar
        together with the id, file name, size, sha256, created_at and the cosyserve version.
        `upload_now`: upload the pair before returning (a worker whose result another node serves next);
        SyncError if that fails (the local copy stays). `audio` may be a file already written (a dub's
        track, at a `temp_output_path`): moved in and hashed in pieces, never held whole."""
        ext = (ext or "").lower().lstrip(".")
        if not EXTENSION.fullmatch(ext):
            raise InputError(f"output extension {ext!r} is not usable; use e.g. wav, mp3, opus, flac, pcm")
        now = self._clock()
        when = local_datetime(now, self.zone)
        stem = self._reserve(when.strftime("output_%Y%m%d_%H%M%S"), ext)
        audio_path, sidecar_path = self.root / f"{stem}.{ext}", self.root / f"{stem}.json"
        record = dict(manifest)
        if self.labels is not None:  # labelled with its id, so the label names this output
            audio = self.labels.label_output(audio, ext, stem, record)
        size, digest = content_digest(audio)  # as stored
        record.setdefault("format", ext)
        record.setdefault("owner", None)
        record.update(
            id=stem,
            file=audio_path.name,
            size_bytes=size,
            sha256=digest,
            created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
            created_at_unix=now,
            created_at_local=when.isoformat(timespec="seconds"),
            cosyserve_version=__version__,
        )
        try:
            sidecar_bytes = to_json(record)  # fails before anything is written if a value isn't JSON
            put_content(audio_path, audio)
            write_atomic(sidecar_path, sidecar_bytes)
        except BaseException as exc:
            audio_path.unlink(missing_ok=True)
            sidecar_path.unlink(missing_ok=True)
            if isinstance(exc, OSError):  # disk full, read-only, permissions: the caller must know
                self.health.note_failure(exc.strerror or str(exc))
                # (said to the caller: no path, which its log line gives)
                raise StorageError(f"the output could not be saved: {exc.strerror or exc}") from exc
            raise
        stored = StoredOutput(stem, audio_path, sidecar_path, f"{self.url_prefix}/{stem}", record)
        self._keep_under_cap(stored)
        # the sidecar goes up only once its audio is there (a sidecar in the bucket promises its audio)
        if self.sync is not None and upload_now:
            self.sync.upload_now(audio_path, audio_path.name, then=sidecar_path)
        elif self.sync is not None:
            self.sync.enqueue(audio_path, audio_path.name, then=sidecar_path)
        return stored

    def _reserve(self, base: str, ext: str) -> str:
        for n in range(MAX_SUFFIX + 1):
            if self.node_tag is not None:
                stem = f"{base}_{self.node_tag * (MAX_SUFFIX + 1) + n}"
            else:
                stem = base if n == 0 else f"{base}_{n}"
            try:
                fd = os.open(self.root / f"{stem}.json", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                continue
            except OSError as exc:  # disk full or read-only before anything was written
                self.health.note_failure(exc.strerror or str(exc))
                raise StorageError(f"no output can be saved in {self.root}: {exc.strerror or exc}") from exc
            os.close(fd)
            if any(p.suffix != ".json" for p in self.root.glob(f"{stem}.*")):  # a stray file of that name
                (self.root / f"{stem}.json").unlink(missing_ok=True)
                continue
            return stem
        raise InputError(f"more than {MAX_SUFFIX} outputs in one second under {self.root}; retry later")

    # -- reading -------------------------------------------------------------------------------------

    def get(self, output_id: str) -> StoredOutput:
        """The complete output with this id; InputError for a malformed id, OutputNotFound if none. With
        remote reads, one that is only in the bucket is downloaded first (SyncError: bucket unreadable),
        and a copy downloaded earlier is served only while the bucket still has the output."""
        check_output_id(output_id)
        try:
            output = self._get_local(output_id)
        except OutputNotFound:
            if self.bucket is None:
                raise
            self.bucket.download(output_id)
            return self._get_local(output_id)
        if self.bucket is not None and not self.bucket.still_has(output):
            raise OutputNotFound(f"no output {output_id}; it was deleted or has expired")
        return output

    def _get_local(self, output_id: str) -> StoredOutput:
        sidecar_path = self.root / f"{output_id}.json"
        try:
            parsed = parse_sidecar(output_id, sidecar_path.read_bytes())
        except OSError as exc:
            if exc.errno in (errno.ENFILE, errno.EMFILE):  # it is there: this process can't open it now
                raise StorageError(f"output {output_id} can't be read now: {exc.strerror}; retry") from exc
            raise OutputNotFound(f"no output {output_id}; it may have expired or been deleted") from None
        if parsed is None:
            raise OutputNotFound(f"output {output_id} has a damaged sidecar; it will be cleaned up")
        manifest, ext = parsed
        audio_path = self.root / f"{output_id}.{ext}"
        if not audio_path.is_file():
            raise OutputNotFound(f"no output {output_id}; it may have expired or been deleted")
        return StoredOutput(output_id, audio_path, sidecar_path, f"{self.url_prefix}/{output_id}", manifest)

    def list(self, owner: str | None = None, limit: int = 50, offset: int = 0) -> list[StoredOutput]:
        """Complete outputs, newest first; only `owner`'s when given. Reads sidecars lazily (from disk,
        so it reflects other processes and restarts; with remote reads, also from the bucket, fetching
        at most limit + offset sidecars not seen before)."""
        return self.page(owner, limit, offset)[0]

    def page(self, owner: str | None, limit: int, offset: int) -> tuple[list[StoredOutput], bool]:
        """`list`, and whether more outputs follow the page (one more is read to know)."""
        if not 1 <= limit <= MAX_LIST_LIMIT or offset < 0:
            raise InputError(f"use 1 <= limit <= {MAX_LIST_LIMIT} and offset >= 0 (got {limit}, {offset})")
        outputs = self.newest_first(owner, fetches=limit + 1 + offset)
        found = list(itertools.islice(outputs, offset, offset + limit + 1))
        return found[:limit], len(found) > limit

    def newest_first(self, owner: str | None = None, fetches: int = MAX_LIST_LIMIT) -> Iterator[StoredOutput]:
        """Every complete output (`owner`'s when given), newest first, read as the caller goes on; with
        remote reads at most `fetches` sidecars not seen before are fetched from the bucket."""
        walk = RemoteWalk(fetches_left=fetches)
        ids: Iterator[str] = iter(self._ids_newest_first())
        if self.bucket is not None:
            ids = heapq.merge(ids, self.bucket.ids_newest_first(walk), key=sort_key, reverse=True)
        previous = None
        for output_id in ids:
            if output_id == previous:  # on this node and in the bucket
                continue
            previous = output_id
            if owner is not None and self._sizes.not_owned_by(output_id, owner):
                continue  # someone else's: not read (a user with few outputs paid for everyone's)
            output = self._listed(output_id, walk)
            if output is not None and (owner is None or output.manifest.get("owner") == owner):
                yield output

    def of_request(self, request_id: str, owner: str | None = None) -> StoredOutput | None:
        """The output the request `request_id` made (`owner`'s), however many were made after it; by the
        id a client sent too (it leads the request's id: `trace-1.3f9c…`), the newest of them."""
        for output in self.newest_first(owner, fetches=MAX_REQUEST_SEARCH):
            made_by = str((output.manifest.get("parameters") or {}).get("request_id") or "")
            if made_by == request_id or made_by.startswith(f"{request_id}."):
                return output
        return None

    def _ids_newest_first(self) -> list[str]:
        ids = [path.stem for path in self.root.glob("output_*.json") if OUTPUT_ID.fullmatch(path.stem)]
        return sorted(ids, key=sort_key, reverse=True)

    def total_bytes(self) -> int:
        """Bytes used by complete outputs on this node (audio + sidecars), from the size index: it read
        every sidecar, 2.5 s for /admin/status at 20 000 outputs."""
        return self._sizes.bytes()

    def _listed(self, output_id: str, walk: RemoteWalk) -> StoredOutput | None:
        try:
            local: StoredOutput | None = self._get_local(output_id)
        except OutputNotFound:
            local = None
        return self.bucket.listed(output_id, local, walk) if self.bucket is not None else local

    # -- removing ------------------------------------------------------------------------------------

    def delete(self, output_id: str) -> StoredOutput:
        """Remove an output (audio first, sidecar last); returns what was removed. With remote reads the
        bucket's copy goes too (its sidecar at once: SyncError if that fails, and nothing is removed)."""
        check_output_id(output_id)
        self._sizes.discard(output_id)
        if self.bucket is None:
            output = self._get_local(output_id)
            try:
                remove_pair(output)
            except OSError as exc:  # a read-only output directory: nothing was removed
                raise StorageError(
                    f"the output could not be deleted from {self.root}: {exc.strerror or exc}; the admin "
                    "has to make the output directory writable"
                ) from exc
            if self.sync is not None and self.sync_deletes:
                self.sync.enqueue_delete(output.path.name)
                self.sync.enqueue_delete(output.sidecar_path.name)
        else:
            output = self._delete_everywhere(self.bucket, output_id)
        if self.on_deleted is not None:
            self.on_deleted(output_id)
        return output

    def _delete_everywhere(self, bucket: OutputBucket, output_id: str) -> StoredOutput:
        try:
            output = self._get_local(output_id)
        except OutputNotFound:
            remote = bucket.output(output_id)
            if remote is None:
                raise
            output = remote
        bucket.delete(output)
        return output

    def has_local(self, output_id: str) -> bool:
        """Whether this node holds the complete output `output_id`."""
        try:
            self._get_local(check_output_id(output_id))
        except (OutputNotFound, InputError):
            return False
        return True

    def removed_here(self, output_id: str, now: float | None = None) -> bool:
        """Whether this node's output `output_id` is known to be gone: missing, and deleted here (its
        tombstone) or older than retention keeps outputs. Missing alone is not enough: an output
        directory not mounted yet, moved, or restored after the database misses every result."""
        if self.has_local(output_id):
            return False
        if (self.root / f"{output_id}{TOMBSTONE}").exists():
            return True
        stamp = sort_key(output_id)[0]
        if self.retention_days is None or not stamp:
            return False
        made = datetime.strptime(stamp, "%Y%m%d%H%M%S").replace(tzinfo=self.zone)  # (naive: local time)
        age_s = (now if now is not None else time.time()) - made.timestamp()
        return age_s > (self.retention_days + 1) * 86400  # (+1 day: the stamp's zone may be off by hours)

    def drop_local(self, output_id: str) -> bool:
        """Remove this node's copy of an output deleted through another node (the bucket's copy is gone
        already); returns whether there was one."""
        try:
            output = self._get_local(check_output_id(output_id))
        except (OutputNotFound, InputError):
            return False
        self._sizes.discard(output_id)
        remove_pair(output)
        return True

    def _iter_complete(self) -> Iterator[StoredOutput]:
        for output_id in self._ids_newest_first():
            with contextlib.suppress(OutputNotFound):
                yield self._get_local(output_id)
