"""Retention of the outputs on one node: by age, by the size cap (at every save and periodically), the
leftovers of interrupted saves, and the uploads of outputs the bucket never got (`OutputStore` mixes it
in; it sets the attributes named below).

What retention removes leaves a tombstone (`output_files.remove_pair`), and `on_expired` is told of each
output so that its jobs and batch items stop pointing at it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cosyserve.service.stores.bucket import BUCKET_COPY
from cosyserve.service.stores.output_files import (
    OutputNotFound,
    StoredOutput,
    pair_size,
    remove_pair,
    remove_strays,
)

if TYPE_CHECKING:
    from cosyserve.service.stores.output_space import SizeIndex
    from cosyserve.service.stores.s3sync import S3Sync

log = logging.getLogger("cosyserve.service.stores.outputs")

STRAY_GRACE_S = 3600.0  # a half-written output younger than this may still be in progress


@dataclass(frozen=True)
class RetentionReport:
    removed: list[StoredOutput]  # complete outputs removed (by age first, then oldest-first by size)
    freed_bytes: int  # audio + sidecars of `removed`
    strays: list[Path]  # leftovers of interrupted saves/deletes that were removed


class Retention:
    """enforce_retention, the size cap kept at each save, and the catch-up of uploads."""

    root: Path
    retention_days: float | None
    max_total_bytes: int | None
    sync: S3Sync | None
    on_expired: Callable[[list[str]], object] | None
    _clock: Callable[[], float]
    _retention_lock: threading.Lock
    _sizes: SizeIndex

    def _get_local(self, output_id: str) -> StoredOutput:
        raise NotImplementedError

    def _iter_complete(self) -> Iterator[StoredOutput]:
        raise NotImplementedError

    def enforce_retention(self) -> RetentionReport:
        """Remove outputs older than `retention_days`, then (`SizeIndex.over`) the oldest of whoever holds
        the most until the total is at most `max_total_bytes`, then leftovers of interrupted saves older
        than STRAY_GRACE_S. The directory is read before the lock is taken (saves wait only for the
        removals), keeping (id, created_at, size, owner) per output, not its manifest."""
        scanned = self._light_scan()  # oldest first: (id, created_at, size, owner)
        with self._retention_lock:
            now = self._clock()
            expired: list[str] = []
            kept = scanned
            if self.retention_days is not None:
                cutoff = now - self.retention_days * 86400.0
                expired = [o[0] for o in scanned if o[1] < cutoff]
                kept = [o for o in scanned if o[1] >= cutoff]
            sizes = {o[0]: o[2] for o in scanned}
            # outputs saved while the directory was read are in the index already: keep them there
            seen = {o[0] for o in scanned}
            recent = [(i, s, w) for i, (s, w) in self._sizes.items_if_loaded() if i not in seen]
            self._sizes.reset([(o[0], o[2], o[3]) for o in kept] + recent)
            over: list[str] = []
            if self.max_total_bytes is not None and (kept or recent):
                newest = recent[-1][0] if recent else kept[-1][0]
                over = self._sizes.over(self.max_total_bytes, keep=newest)
                for output_id in over:
                    self._sizes.discard(output_id)
            removed: list[StoredOutput] = []
            for output_id in expired + over:
                with contextlib.suppress(OutputNotFound):
                    output = self._get_local(output_id)  # the whole record, only for what goes
                    sizes.setdefault(output_id, pair_size(output))
                    removed.append(output)
                    self._remove_expired(output)
            strays = remove_strays(self.root, now, STRAY_GRACE_S, self._get_local, complete=seen)
        if removed or strays:
            log.info("retention removed %d outputs and %d stray files", len(removed), len(strays))
        self._tell_expired([output.id for output in removed])
        return RetentionReport(removed, sum(sizes[o.id] for o in removed), strays)

    def _light_scan(self) -> list[tuple[str, float, int, str | None]]:
        """(id, created_at, bytes, owner) of every complete output, oldest first; manifests are dropped
        as soon as these are read."""
        found = []
        for output in self._iter_complete():
            found.append((output.id, output.created_at, pair_size(output), output.owner))
        found.sort(key=lambda o: (o[1], o[0]))
        return found

    def _keep_under_cap(self, stored: StoredOutput) -> None:
        """The size cap holds at every save: the largest holder's oldest outputs go first, never the one
        just saved."""
        if self.max_total_bytes is None:
            return
        with self._retention_lock:
            self._sizes.add(stored.id, pair_size(stored), stored.owner)
            evicted = self._sizes.over(self.max_total_bytes, keep=stored.id)
            for output_id in evicted:
                self._sizes.discard(output_id)
                with contextlib.suppress(OutputNotFound):
                    self._remove_expired(self._get_local(output_id))
        if evicted:
            log.info("output size cap: removed the %d oldest outputs to make room", len(evicted))
        self._tell_expired(evicted)

    def _remove_expired(self, output: StoredOutput) -> None:
        try:
            remove_pair(output)
        except OSError as exc:  # a read-only or vanished directory: the next pass tries again
            log.warning("retention could not remove %s: %s", output.id, exc.strerror or exc)

    def _tell_expired(self, output_ids: list[str]) -> None:
        """The jobs and batch items naming outputs retention removed stop pointing at them."""
        if output_ids and self.on_expired is not None:
            self.on_expired(output_ids)

    def upload_missing(self) -> int:
        """Queue the upload of every complete output made here whose sidecar the bucket lacks: those
        whose upload gave up before a restart (the sync only remembers failures while it runs). Asked
        by the retention worker; returns how many were queued. SyncError when the bucket can't be read."""
        if self.sync is None:
            return 0
        mine = [o for o in self._iter_complete() if BUCKET_COPY not in o.manifest]
        present: set[str] = set()
        for day in sorted({o.id[len("output_") : len("output_") + 8] for o in mine}):
            present.update(self.sync.list_keys(f"output_{day}"))
        queued = 0
        for output in mine:
            if output.sidecar_path.name not in present and output.path.exists():
                queued += self.sync.enqueue(output.path, output.path.name, then=output.sidecar_path)
        if queued:
            log.info("S3: %d outputs saved here were not in the bucket; their upload is queued", queued)
        return queued
