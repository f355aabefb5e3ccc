"""Other nodes' outputs, read through from the bucket they share (`OutputStore` with remote reads).

`download` copies an output that is not on this node from the bucket into the outputs directory (same
layout as a local save, atomic; the sidecar gains `bucket_copy`). Such a copy is served only while the
bucket still has the output (`still_has`, asked at most every `ttl_s`), so a delete on one node reaches
the others. `ids_newest_first` + `listed` merge the bucket's sidecars into `OutputStore.list`, fetching
at most a call's budget of sidecars not seen before (kept in a small cache: sidecars never change).
While the bucket can't be read, each node serves what it has locally.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cosyserve.errors import CosyServeError
from cosyserve.service.stores.output_files import (
    OUTPUT_ID,
    OutputNotFound,
    StoredOutput,
    parse_sidecar,
    remove_pair,
    sha256,
    sort_key,
    to_json,
    write_atomic,
)

if TYPE_CHECKING:
    from cosyserve.service.stores.s3sync import S3Sync

REMOTE_LIST_TTL_S = 5.0  # bucket listings are reused this long (paging through a list)
REMOTE_CACHE_SIDECARS = 4096  # fetched sidecars kept in memory
BUCKET_COPY = "bucket_copy"  # in the sidecar of a copy downloaded from the bucket: where it came from


@dataclass
class RemoteWalk:
    """One `list` call's walk through the bucket."""

    fetches_left: int  # sidecars it may still fetch
    seen: set[str] = dataclasses.field(default_factory=set)  # sidecar ids listed so far
    listed_from: str = "99999999"  # YYYYMMDD: the newest day listed (tomorrow: clocks differ)
    listed_to: str | None = None  # YYYYMMDD: every day from `listed_from` down to this one is listed


class OutputBucket:
    """Reads the outputs in `remote` (the bucket every node uploads to) into `root`. Thread-safe."""

    def __init__(self, remote: S3Sync, root: Path, url_prefix: str, clock: Callable[[], float]) -> None:
        self.remote = remote
        self.root = root
        self.url_prefix = url_prefix
        self.ttl_s = REMOTE_LIST_TTL_S
        self._clock = clock
        self._lock = threading.Lock()
        self._listings: dict[str, tuple[float, list[str]]] = {}  # key prefix -> (monotonic time, names)
        self._sidecars: collections.OrderedDict[str, bytes] = collections.OrderedDict()
        self._verified: dict[str, float] = {}  # downloaded copy -> when the bucket last still had it

    # -- get ------------------------------------------------------------------------------------------

    def download(self, output_id: str) -> None:
        """Copy an output from the bucket into `root` (audio first, sidecar last, each atomically);
        OutputNotFound if the bucket doesn't have it (complete and intact), SyncError if unreadable."""
        output = self.output(output_id)
        audio = self.remote.fetch(output.path.name) if output is not None else None
        sha = output.manifest.get("sha256") if output is not None else None
        if output is None or audio is None or (isinstance(sha, str) and sha256(audio) != sha):
            with self._lock:  # deleted (or damaged) since its sidecar was read
                self._sidecars.pop(output_id, None)
            raise OutputNotFound(f"no output {output_id}; it may have expired or been deleted")
        copied = {"bucket": self.remote.bucket, "key": self.remote.key(output.sidecar_path.name)}
        write_atomic(output.path, audio)
        write_atomic(output.sidecar_path, to_json({**output.manifest, BUCKET_COPY: copied}))
        self._mark_verified(output_id, time.monotonic())

    def output(self, output_id: str) -> StoredOutput | None:
        """The output as the bucket's sidecar describes it (files not downloaded); None if absent."""
        with self._lock:
            sidecar = self._sidecars.get(output_id)
        if sidecar is None:
            sidecar = self.remote.fetch(f"{output_id}.json")
            if sidecar is not None:
                with self._lock:  # sidecars never change: keep the most recently used
                    self._sidecars[output_id] = sidecar
                    while len(self._sidecars) > REMOTE_CACHE_SIDECARS:
                        self._sidecars.popitem(last=False)
        parsed = parse_sidecar(output_id, sidecar) if sidecar is not None else None
        if parsed is None:
            return None
        manifest, ext = parsed
        audio_path, sidecar_path = self.root / f"{output_id}.{ext}", self.root / f"{output_id}.json"
        url = f"{self.url_prefix}/{output_id}"
        return StoredOutput(output_id, audio_path, sidecar_path, url, manifest, remote_only=True)

    def still_has(self, output: StoredOutput) -> bool:
        """For a local output: True unless it is a downloaded copy of one gone from the bucket, which is
        then removed. Asked at most every `ttl_s`; while the bucket can't be read, the copy is served."""
        if BUCKET_COPY not in output.manifest:
            return True
        now = time.monotonic()
        with self._lock:
            checked = self._verified.get(output.id)
        if checked is not None and now - checked < self.ttl_s:
            return True
        try:
            present = self.remote.exists(output.sidecar_path.name)
        except CosyServeError:  # SyncError
            return True
        if present:
            self._mark_verified(output.id, now)
            return True
        with self._lock:
            self._verified.pop(output.id, None)
            self._sidecars.pop(output.id, None)
        remove_pair(output)
        return False

    def _mark_verified(self, output_id: str, now: float) -> None:
        with self._lock:
            self._verified[output_id] = now
            if len(self._verified) > REMOTE_CACHE_SIDECARS:  # forget checks too old to be used again
                for old in [k for k, at in self._verified.items() if now - at >= self.ttl_s]:
                    del self._verified[old]

    # -- list -----------------------------------------------------------------------------------------

    def listed(self, output_id: str, local: StoredOutput | None, walk: RemoteWalk) -> StoredOutput | None:
        """One listed id: the `local` output (unless it is a copy of one gone from the bucket), or the
        bucket's (fetching its sidecar while the walk's budget lasts)."""
        if local is None:
            if output_id not in walk.seen:
                return None
            with self._lock:
                cached = output_id in self._sidecars
            if not cached:
                if walk.fetches_left <= 0:
                    return None
                walk.fetches_left -= 1
            try:
                return self.output(output_id)
            except CosyServeError:  # SyncError (s3sync is imported only where a bucket is used)
                walk.fetches_left = 0
                return None
        listed = walk.listed_to is not None and walk.listed_to <= output_id[7:15] <= walk.listed_from
        if BUCKET_COPY in local.manifest and listed and output_id not in walk.seen:
            return None  # a downloaded copy of an output since deleted (or expired) in the bucket
        return local

    def ids_newest_first(self, walk: RemoteWalk) -> Iterator[str]:
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
                ids = sorted((i for i in ids if OUTPUT_ID.fullmatch(i)), key=sort_key, reverse=True)
                walk.seen.update(ids)
                walk.listed_to = f"{day:%Y%m%d}"
                yield from ids
                day -= dt.timedelta(days=1)
            if day < first:
                walk.listed_to = "00000000"
        except CosyServeError:  # SyncError: local outputs only (S3Sync logged why)
            return

    def _listing(self, prefix: str, max_keys: int | None = None) -> list[str]:
        """`list_keys`, reused for `ttl_s` (paging through a list asks the bucket once)."""
        key = f"{prefix}|{max_keys}"
        now = time.monotonic()
        with self._lock:
            cached = self._listings.get(key)
        if cached is not None and now - cached[0] < self.ttl_s:
            return cached[1]
        names = self.remote.list_keys(prefix, max_keys)
        with self._lock:
            for old in [k for k, (at, _) in self._listings.items() if now - at >= self.ttl_s]:
                del self._listings[old]
            self._listings[key] = (now, names)
        return names

    # -- delete ---------------------------------------------------------------------------------------

    def delete(self, output: StoredOutput) -> None:
        """Remove the output everywhere: the bucket's sidecar at once (SyncError if that fails, and
        nothing is removed), then the local pair, then (queued) the bucket's pair."""
        self.remote.delete_now(output.sidecar_path.name)  # from now on no node lists or downloads it
        remove_pair(output)
        with self._lock:
            self._sidecars.pop(output.id, None)
            self._verified.pop(output.id, None)
            self._listings.clear()
        # Queued behind any upload of this output still pending, so that upload can't bring it back.
        self.remote.enqueue_delete(output.path.name)
        self.remote.enqueue_delete(output.sidecar_path.name)
