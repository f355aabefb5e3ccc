"""Finished results on disk: one audio file plus a JSON provenance sidecar per output, with retention.

Layout: `<root>/output_YYYYMMDD_HHMMSS[_N].<ext>` and `<root>/<same stem>.json`, where `root` is the
outputs directory itself (e.g. `<data dir>/outputs`). The stem is the output id. Times in names are UTC:
names then sort in creation order on every server, across DST changes and time zones.

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
on this node downloads the pair into `root` (same layout, atomic; the sidecar gains `bucket_copy`), where
local retention treats it like any other. Such a copy is served only while the bucket still has the
output (checked at most every few seconds), so a delete on one node reaches the others; outputs a node
saved itself stay there until its retention. `list` merges the bucket's sidecars with the local ones
(fetched as needed, at most limit + offset per call, and cached). Ids carry a per-node tag
(`_<6-digit tag><6-digit counter>`), so two nodes saving in the same second never write the same key.
`delete()` removes the remote sidecar at once (else the output would come back from the bucket), then
the audio; without remote reads it deletes the remote pair only with `sync_deletes=True`. While the
bucket can't be read, each node serves what it has locally.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime as dt
import hashlib
import heapq
import json
import logging
import os
import random
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from cosyserve import __version__
from cosyserve.errors import CosyServeError, InputError
from cosyserve.service.requests import SynthesisRequest, SynthesisResult

if TYPE_CHECKING:
    from cosyserve.service.s3sync import S3Sync

log = logging.getLogger(__name__)

OUTPUT_ID = re.compile(r"output_(\d{8})_(\d{6})(?:_([1-9]\d{0,11}))?")  # 12 digits: node tag + counter
EXTENSION = re.compile(r"[a-z0-9]{1,8}")
MAX_SUFFIX = 999_999  # outputs with the same second-resolution stamp
STRAY_GRACE_S = 3600.0  # a half-written output younger than this may still be in progress
MAX_LIST_LIMIT = 1000
TEMP_SUFFIX = ".tmp"
NODE_TAGS = range(100_000, 1_000_000)  # 6 digits, so tagged counters never look like plain ones
REMOTE_LIST_TTL_S = 5.0  # bucket listings are reused this long (paging through a list)
REMOTE_CACHE_SIDECARS = 4096  # fetched sidecars kept in memory
BUCKET_COPY = "bucket_copy"  # in the sidecar of a copy downloaded from the bucket: where it came from


class OutputNotFound(InputError):
    """No complete output with that id (never saved, removed, or still being written)."""


@dataclass(frozen=True)
class StoredOutput:
    id: str  # the file stem, e.g. output_20250101_120000_1
    path: Path  # the audio file
    sidecar_path: Path  # the JSON provenance manifest
    url_path: str  # where the API serves it, e.g. /v1/outputs/output_20250101_120000_1
    manifest: dict[str, Any]
    remote_only: bool = False  # listed from the bucket: `path` exists only after `OutputStore.get(id)`

    @property
    def created_at(self) -> float:
        return float(self.manifest.get("created_at_unix", 0.0))

    @property
    def filename(self) -> str:
        return self.path.name


@dataclass
class _RemoteWalk:
    """One `list` call's walk through the bucket."""

    fetches_left: int  # sidecars it may still fetch
    seen: set[str] = dataclasses.field(default_factory=set)  # sidecar ids listed so far
    listed_from: str = "99999999"  # YYYYMMDD: the newest day listed (tomorrow: clocks differ)
    listed_to: str | None = None  # YYYYMMDD: every day from `listed_from` down to this one is listed


@dataclass(frozen=True)
class RetentionReport:
    removed: list[StoredOutput]  # complete outputs removed (by age first, then oldest-first by size)
    freed_bytes: int  # audio + sidecars of `removed`
    strays: list[Path]  # leftovers of interrupted saves/deletes that were removed


def check_output_id(output_id: str) -> str:
    """`output_id` if it is a well-formed id; InputError otherwise (the only guard against path tricks)."""
    if not isinstance(output_id, str) or not OUTPUT_ID.fullmatch(output_id):
        raise InputError(
            f"{output_id!r} is not an output id; ids look like output_20250101_120000 or "
            "output_20250101_120000_2"
        )
    return output_id


class OutputStore:
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
    ) -> None:
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
        # the bucket other nodes' outputs are read from (None: this node's outputs only)
        self.remote = sync if (sync is not None if remote_reads is None else remote_reads) else None
        if node_tag is not None and node_tag not in NODE_TAGS:
            raise InputError(f"node_tag must be a 6-digit number (100000-999999), got {node_tag}")
        self.node_tag = (node_tag or random.choice(NODE_TAGS)) if self.remote is not None else None
        self.remote_list_ttl_s = REMOTE_LIST_TTL_S
        self._remote_lock = threading.Lock()
        self._listings: dict[str, tuple[float, list[str]]] = {}  # key prefix -> (monotonic time, names)
        self._sidecars: collections.OrderedDict[str, bytes] = collections.OrderedDict()
        self._verified: dict[str, float] = {}  # downloaded copy -> when the bucket last still had it

    # -- writing -------------------------------------------------------------------------------------

    def save(
        self, audio_bytes: bytes, ext: str, manifest: dict[str, Any], *, upload_now: bool = False
    ) -> StoredOutput:
        """Store one result; `manifest` (from `build_manifest` or the caller's own) goes into the sidecar
        together with the id, file name, size, sha256, created_at and the cosyserve version.
        `upload_now`: upload the pair before returning (a worker whose result another node serves next);
        SyncError if that fails (the local copy stays)."""
        ext = (ext or "").lower().lstrip(".")
        if not EXTENSION.fullmatch(ext):
            raise InputError(f"output extension {ext!r} is not usable; use e.g. wav, mp3, opus, flac, pcm")
        now = self._clock()
        stem = self._reserve(time.strftime("output_%Y%m%d_%H%M%S", time.gmtime(now)), ext)
        audio_path, sidecar_path = self.root / f"{stem}.{ext}", self.root / f"{stem}.json"
        data = bytes(audio_bytes)
        record = dict(manifest)
        record.setdefault("format", ext)
        record.setdefault("owner", None)
        record.update(
            id=stem,
            file=audio_path.name,
            size_bytes=len(data),
            sha256=hashlib.sha256(data).hexdigest(),
            created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
            created_at_unix=now,
            cosyserve_version=__version__,
        )
        try:
            sidecar_bytes = _to_json(record)  # fails before anything is written if a value isn't JSON
            self._write_atomic(audio_path, data)
            self._write_atomic(sidecar_path, sidecar_bytes)
        except BaseException:
            audio_path.unlink(missing_ok=True)
            sidecar_path.unlink(missing_ok=True)
            raise
        stored = StoredOutput(stem, audio_path, sidecar_path, f"{self.url_prefix}/{stem}", record)
        if self.sync is not None and upload_now:
            self.sync.upload_now(audio_path, audio_path.name)
            self.sync.upload_now(sidecar_path, sidecar_path.name)
        elif self.sync is not None:
            self.sync.enqueue(audio_path, audio_path.name)
            self.sync.enqueue(sidecar_path, sidecar_path.name)
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
            os.close(fd)
            if any(p.suffix != ".json" for p in self.root.glob(f"{stem}.*")):  # a stray file of that name
                (self.root / f"{stem}.json").unlink(missing_ok=True)
                continue
            return stem
        raise InputError(f"more than {MAX_SUFFIX} outputs in one second under {self.root}; retry later")

    def _write_atomic(self, path: Path, data: bytes) -> None:
        temp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}{TEMP_SUFFIX}")
        try:
            with open(temp, "xb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())  # else a power cut can leave an empty file under the final name
            os.replace(temp, path)
        finally:
            temp.unlink(missing_ok=True)

    # -- reading -------------------------------------------------------------------------------------

    def get(self, output_id: str) -> StoredOutput:
        """The complete output with this id; InputError for a malformed id, OutputNotFound if none. With
        remote reads, one that is only in the bucket is downloaded first (SyncError: bucket unreadable),
        and a copy downloaded earlier is served only while the bucket still has the output."""
        check_output_id(output_id)
        try:
            output = self._get_local(output_id)
        except OutputNotFound:
            if self.remote is None:
                raise
            return self._download(output_id)
        if self.remote is not None and BUCKET_COPY in output.manifest and not self._still_in_bucket(output):
            raise OutputNotFound(f"no output {output_id}; it was deleted or has expired")
        return output

    def _get_local(self, output_id: str) -> StoredOutput:
        sidecar_path = self.root / f"{output_id}.json"
        try:
            parsed = _parse_sidecar(output_id, sidecar_path.read_bytes())
        except OSError:
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
        if not 1 <= limit <= MAX_LIST_LIMIT or offset < 0:
            raise InputError(f"use 1 <= limit <= {MAX_LIST_LIMIT} and offset >= 0 (got {limit}, {offset})")
        walk = _RemoteWalk(fetches_left=limit + offset)
        ids: Iterator[str] = iter(self._ids_newest_first())
        if self.remote is not None:
            ids = heapq.merge(ids, self._remote_ids(walk), key=_sort_key, reverse=True)
        found: list[StoredOutput] = []
        skipped = 0
        previous = None
        for output_id in ids:
            if output_id == previous:  # on this node and in the bucket
                continue
            previous = output_id
            output = self._listed(output_id, walk)
            if output is None or (owner is not None and output.manifest.get("owner") != owner):
                continue
            if skipped < offset:
                skipped += 1
                continue
            found.append(output)
            if len(found) >= limit:
                break
        return found

    def _ids_newest_first(self) -> list[str]:
        ids = [path.stem for path in self.root.glob("output_*.json") if OUTPUT_ID.fullmatch(path.stem)]
        return sorted(ids, key=_sort_key, reverse=True)

    def total_bytes(self) -> int:
        """Bytes used by complete outputs on this node (audio + sidecars)."""
        return sum(_pair_size(output) for output in self._complete_outputs())

    # -- the bucket (other nodes' outputs) -----------------------------------------------------------

    def _listed(self, output_id: str, walk: _RemoteWalk) -> StoredOutput | None:
        """One listed id: the local output (unless it is a copy of one gone from the bucket), or the
        bucket's (fetching its sidecar while the walk's budget lasts)."""
        try:
            output = self._get_local(output_id)
        except OutputNotFound:
            if output_id not in walk.seen:
                return None
            with self._remote_lock:
                cached = output_id in self._sidecars
            if not cached:
                if walk.fetches_left <= 0:
                    return None
                walk.fetches_left -= 1
            try:
                return self._remote_output(output_id)
            except CosyServeError:  # SyncError (s3sync is imported only where a bucket is used)
                walk.fetches_left = 0
                return None
        listed = walk.listed_to is not None and walk.listed_to <= output_id[7:15] <= walk.listed_from
        if BUCKET_COPY in output.manifest and listed and output_id not in walk.seen:
            return None  # a downloaded copy of an output since deleted (or expired) in the bucket
        return output

    def _download(self, output_id: str) -> StoredOutput:
        """Copy an output from the bucket into `root` (audio first, sidecar last, each atomically)."""
        assert self.remote is not None
        output = self._remote_output(output_id)
        audio = self.remote.fetch(output.path.name) if output is not None else None
        sha = output.manifest.get("sha256") if output is not None else None
        if output is None or audio is None or (isinstance(sha, str) and _sha256(audio) != sha):
            with self._remote_lock:  # deleted (or damaged) since its sidecar was read
                self._sidecars.pop(output_id, None)
            raise OutputNotFound(f"no output {output_id}; it may have expired or been deleted")
        copied = {"bucket": self.remote.bucket, "key": self.remote.key(output.sidecar_path.name)}
        self._write_atomic(output.path, audio)
        self._write_atomic(output.sidecar_path, _to_json({**output.manifest, BUCKET_COPY: copied}))
        self._mark_verified(output_id, time.monotonic())
        return self._get_local(output_id)

    def _remote_output(self, output_id: str) -> StoredOutput | None:
        """The output as the bucket's sidecar describes it (files not downloaded); None if absent."""
        assert self.remote is not None
        with self._remote_lock:
            sidecar = self._sidecars.get(output_id)
        if sidecar is None:
            sidecar = self.remote.fetch(f"{output_id}.json")
            if sidecar is not None:
                with self._remote_lock:  # sidecars never change: keep the most recently used
                    self._sidecars[output_id] = sidecar
                    while len(self._sidecars) > REMOTE_CACHE_SIDECARS:
                        self._sidecars.popitem(last=False)
        parsed = _parse_sidecar(output_id, sidecar) if sidecar is not None else None
        if parsed is None:
            return None
        manifest, ext = parsed
        audio_path, sidecar_path = self.root / f"{output_id}.{ext}", self.root / f"{output_id}.json"
        url = f"{self.url_prefix}/{output_id}"
        return StoredOutput(output_id, audio_path, sidecar_path, url, manifest, remote_only=True)

    def _still_in_bucket(self, output: StoredOutput) -> bool:
        """For a downloaded copy: does the bucket still hold the output? If not, the copy is removed.
        Checked at most every REMOTE_LIST_TTL_S; while the bucket can't be read, the copy is served."""
        assert self.remote is not None
        now = time.monotonic()
        with self._remote_lock:
            checked = self._verified.get(output.id)
        if checked is not None and now - checked < self.remote_list_ttl_s:
            return True
        try:
            present = self.remote.exists(output.sidecar_path.name)
        except CosyServeError:  # SyncError
            return True
        if present:
            self._mark_verified(output.id, now)
            return True
        with self._remote_lock:
            self._verified.pop(output.id, None)
            self._sidecars.pop(output.id, None)
        self._remove(output)
        return False

    def _mark_verified(self, output_id: str, now: float) -> None:
        with self._remote_lock:
            self._verified[output_id] = now
            if len(self._verified) > REMOTE_CACHE_SIDECARS:  # forget checks too old to be used again
                for old in [k for k, at in self._verified.items() if now - at >= self.remote_list_ttl_s]:
                    del self._verified[old]

    def _remote_ids(self, walk: _RemoteWalk) -> Iterator[str]:
        """Ids of the bucket's sidecars, newest first, added to `walk.seen` as they are listed. Listings
        only go oldest-first, so this walks back one day prefix at a time (skipping empty months), from
        tomorrow (clocks differ) to the day of the oldest key; it stops when the walk's budget is spent
        or the bucket fails. `walk.listed_to`: the oldest day listed completely so far (YYYYMMDD)."""
        try:
            oldest = self._listing("output_", max_keys=1)
            match = re.match(r"output_(\d{8})", oldest[0]) if oldest else None
            if match is None:
                walk.listed_to = "00000000"  # an empty bucket: every day is listed
                return
            first = dt.datetime.strptime(match.group(1), "%Y%m%d").date()
            day = dt.datetime.fromtimestamp(self._clock(), dt.timezone.utc).date() + dt.timedelta(days=1)
            walk.listed_from = f"{day:%Y%m%d}"
            month_with_keys = None
            while day >= first and walk.fetches_left > 0:
                if (day.year, day.month) != month_with_keys:
                    if not self._listing(f"output_{day:%Y%m}", max_keys=1):
                        walk.listed_to = f"{day.replace(day=1):%Y%m%d}"
                        day = day.replace(day=1) - dt.timedelta(days=1)  # nothing that month
                        continue
                    month_with_keys = (day.year, day.month)
                names = self._listing(f"output_{day:%Y%m%d}")
                ids = {name[:-5] for name in names if name.endswith(".json")}
                ids = sorted((i for i in ids if OUTPUT_ID.fullmatch(i)), key=_sort_key, reverse=True)
                walk.seen.update(ids)
                walk.listed_to = f"{day:%Y%m%d}"
                yield from ids
                day -= dt.timedelta(days=1)
            if day < first:
                walk.listed_to = "00000000"
        except CosyServeError:  # SyncError: local outputs only (S3Sync logged why)
            return

    def _listing(self, prefix: str, max_keys: int | None = None) -> list[str]:
        """`list_keys`, reused for `remote_list_ttl_s` (paging through a list asks the bucket once)."""
        assert self.remote is not None
        key = f"{prefix}|{max_keys}"
        now = time.monotonic()
        with self._remote_lock:
            cached = self._listings.get(key)
        if cached is not None and now - cached[0] < self.remote_list_ttl_s:
            return cached[1]
        names = self.remote.list_keys(prefix, max_keys)
        with self._remote_lock:
            for old in [k for k, (at, _) in self._listings.items() if now - at >= self.remote_list_ttl_s]:
                del self._listings[old]
            self._listings[key] = (now, names)
        return names

    # -- removing ------------------------------------------------------------------------------------

    def delete(self, output_id: str) -> StoredOutput:
        """Remove an output (audio first, sidecar last); returns what was removed. With remote reads the
        bucket's copy goes too (its sidecar at once: SyncError if that fails, and nothing is removed)."""
        check_output_id(output_id)
        if self.remote is None:
            output = self._get_local(output_id)
            self._remove(output)
            if self.sync is not None and self.sync_deletes:
                self.sync.enqueue_delete(output.path.name)
                self.sync.enqueue_delete(output.sidecar_path.name)
            return output
        try:
            output = self._get_local(output_id)
        except OutputNotFound:
            remote = self._remote_output(output_id)
            if remote is None:
                raise
            output = remote
        self.remote.delete_now(output.sidecar_path.name)  # from now on no node lists or downloads it
        self._remove(output)
        with self._remote_lock:
            self._sidecars.pop(output_id, None)
            self._verified.pop(output_id, None)
            self._listings.clear()
        # Queued behind any upload of this output still pending, so that upload can't bring it back.
        self.remote.enqueue_delete(output.path.name)
        self.remote.enqueue_delete(output.sidecar_path.name)
        return output

    def enforce_retention(self) -> RetentionReport:
        """Remove outputs older than `retention_days`, then the oldest until the total is at most
        `max_total_bytes`, then leftovers of interrupted saves older than STRAY_GRACE_S."""
        with self._retention_lock:
            now = self._clock()
            outputs = sorted(self._complete_outputs(), key=lambda o: (o.created_at, o.id))
            removed: list[StoredOutput] = []
            if self.retention_days is not None:
                cutoff = now - self.retention_days * 86400.0
                removed = [o for o in outputs if o.created_at < cutoff]
                outputs = [o for o in outputs if o.created_at >= cutoff]
            sizes = {o.id: _pair_size(o) for o in outputs + removed}
            if self.max_total_bytes is not None:
                total = sum(sizes[o.id] for o in outputs)
                while outputs and total > self.max_total_bytes:
                    oldest = outputs.pop(0)
                    total -= sizes[oldest.id]
                    removed.append(oldest)
            for output in removed:
                self._remove(output)
            strays = self._remove_strays(now)
        if removed or strays:
            log.info("retention removed %d outputs and %d stray files", len(removed), len(strays))
        return RetentionReport(removed, sum(sizes[o.id] for o in removed), strays)

    def _complete_outputs(self) -> list[StoredOutput]:
        outputs = []
        for output_id in self._ids_newest_first():
            with contextlib.suppress(OutputNotFound):
                outputs.append(self._get_local(output_id))
        return outputs

    def _remove(self, output: StoredOutput) -> None:
        output.path.unlink(missing_ok=True)
        output.sidecar_path.unlink(missing_ok=True)

    def _remove_strays(self, now: float) -> list[Path]:
        """Temp files, unreadable sidecars (with their audio) and audio without a sidecar, if old."""
        removed = []
        for path in sorted(self.root.iterdir()):
            name = path.name
            if name.startswith(".output_") and name.endswith(TEMP_SUFFIX):
                stray = True
            elif OUTPUT_ID.fullmatch(path.stem):
                sidecar = path.with_suffix(".json")
                if path.suffix == ".json":
                    try:
                        self._get_local(path.stem)
                        stray = False
                    except OutputNotFound:
                        stray = True
                else:
                    stray = not sidecar.exists()
            else:
                continue
            try:
                old = now - path.stat().st_mtime > STRAY_GRACE_S
            except FileNotFoundError:
                continue
            if stray and old:
                path.unlink(missing_ok=True)
                removed.append(path)
        return removed


class RetentionWorker:
    """Runs `store.enforce_retention()` now and then every `interval_s` seconds, until `stop()`."""

    def __init__(self, store: OutputStore, interval_s: float = 3600.0) -> None:
        self.store = store
        self.interval_s = interval_s
        self.runs = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> RetentionWorker:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="cosyserve-retention", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.store.enforce_retention()
            except Exception:  # a bad disk moment must not end the worker; the next run tries again
                log.exception("output retention failed")
            self.runs += 1
            self._stop.wait(self.interval_s)


def build_manifest(
    request: SynthesisRequest,
    result: SynthesisResult,
    *,
    format: str,
    sample_rate: int,
    model_checksum: str,
    owner: str | None = None,
    parameters: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The provenance of one result: every request field (an uploaded prompt as its sha256), the seed
    actually used, extra `parameters` (sampling settings etc.), the model, timings and warnings."""
    fields = {}
    for field in dataclasses.fields(request):
        value = getattr(request, field.name)
        if field.name == "prompt_wav":
            fields["prompt_wav_sha256"] = hashlib.sha256(value).hexdigest() if value else None
        else:
            fields[field.name] = value
    return {
        **fields,
        "seed": result.seed,
        "parameters": dict(parameters or {}),
        "model_checksum": model_checksum,
        "format": format,
        "sample_rate": sample_rate,
        "duration_s": round(result.duration_s, 3),
        "speech_tokens": result.speech_tokens,
        "sentences": [dataclasses.asdict(timing) for timing in result.timings],
        "stage_seconds": dict(result.stage_seconds),
        "warnings": list(result.warnings),
        "owner": owner,
    }


def _pair_size(output: StoredOutput) -> int:
    size = 0
    for path in (output.path, output.sidecar_path):
        with contextlib.suppress(FileNotFoundError):
            size += path.stat().st_size
    return size


def _to_json(record: dict[str, Any]) -> bytes:
    def fallback(value: Any) -> Any:
        if isinstance(value, np.generic):
            return value.item()
        if isinstance(value, np.ndarray):
            return value.tolist()
        if isinstance(value, (bytes, bytearray)):
            return {"sha256": hashlib.sha256(value).hexdigest(), "bytes": len(value)}
        if isinstance(value, Path):
            return str(value)
        raise TypeError(f"manifest value of type {type(value).__name__} can't be stored as JSON")

    return json.dumps(record, ensure_ascii=False, indent=2, default=fallback).encode("utf-8")


def _sort_key(output_id: str) -> tuple[str, int]:
    """Creation order: the UTC stamp, then the counter (tagged counters order by node within a second)."""
    match = OUTPUT_ID.fullmatch(output_id)
    if match is None:
        return ("", 0)
    return (match.group(1) + match.group(2), int(match.group(3) or 0))


def _parse_sidecar(output_id: str, data: bytes) -> tuple[dict[str, Any], str] | None:
    """(manifest, audio extension) of a sidecar, or None if it is damaged or names another output."""
    try:
        manifest = json.loads(data.decode("utf-8"))
    except ValueError:
        return None
    name = manifest.get("file") if isinstance(manifest, dict) else None
    ext = name[len(output_id) + 1 :] if isinstance(name, str) and name.startswith(f"{output_id}.") else ""
    if not EXTENSION.fullmatch(ext):  # the sidecar names the audio file: trust only its extension
        return None
    return manifest, ext


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
