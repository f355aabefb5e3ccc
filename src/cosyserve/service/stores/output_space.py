"""Space for outputs: the size cap kept at every save, whether the output directory can take more, and
the worker that runs retention now and then.

`SizeIndex` knows each complete output's size, oldest first: built once from a scan of the directory,
then kept up to date by saves, deletes and retention runs, so keeping the store under its cap at save
time costs no scan. `StorageHealth` answers "can results be saved here?" for `/ready`: the directory is
writable (a probe file) and has more free space than the configured floor; checked at most every
CHECK_INTERVAL_S, because load balancers poll `/ready` often.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)
CHECK_INTERVAL_S = 5.0


class SizeIndex:
    """Sizes and owners of the complete outputs of one directory, oldest first (ids sort by creation).

    The size cap is shared, but not first come, first evicted: when it is exceeded, the owner holding the
    most bytes gives up its oldest output first, again and again. One user's flood (a dub track of three
    hours is one cue's work) used to evict every other user's results; now it evicts its own.
    """

    def __init__(self, scan: Callable[[], Iterable[tuple[str, int, str | None]]]) -> None:
        self._scan = scan  # (id, bytes, owner) of every complete output, oldest first
        self._sizes: OrderedDict[str, tuple[int, str | None]] | None = None
        self.total = 0

    def _loaded(self) -> OrderedDict[str, tuple[int, str | None]]:
        if self._sizes is None:
            self.reset(self._scan())
        assert self._sizes is not None
        return self._sizes

    def reset(self, outputs: Iterable[tuple[str, int, str | None]]) -> None:
        self._sizes = OrderedDict((output_id, (size, owner)) for output_id, size, owner in outputs)
        self.total = sum(size for size, _owner in self._sizes.values())

    def items_if_loaded(self) -> list[tuple[str, tuple[int, str | None]]]:
        """What the index holds, oldest first; nothing before it was first loaded."""
        return list(self._sizes.items()) if self._sizes is not None else []

    def add(self, output_id: str, size: int, owner: str | None = None) -> None:
        sizes = self._loaded()
        self.total += size - sizes.pop(output_id, (0, None))[0]
        sizes[output_id] = (size, owner)

    def bytes(self) -> int:
        """The total, scanning the directory only the first time."""
        self._loaded()
        return self.total

    def not_owned_by(self, output_id: str, owner: str) -> bool:
        """Known to belong to someone other than `owner` (an id not known yet is not: read it)."""
        known = self._loaded().get(output_id)
        return known is not None and known[1] != owner

    def discard(self, output_id: str) -> None:
        if self._sizes is not None:
            self.total -= self._sizes.pop(output_id, (0, None))[0]

    def over(self, cap: int, keep: str) -> list[str]:
        """The ids to remove (never `keep`) so that the total fits in `cap` bytes: each time the oldest
        output of the owner holding the most bytes (`keep` counted as its owner's)."""
        sizes, total = self._loaded(), self.total
        if total <= cap:
            return []
        held: Counter[str | None] = Counter()
        queues: dict[str | None, deque[str]] = {}
        for output_id, (size, owner) in sizes.items():
            held[owner] += size
            if output_id != keep:
                queues.setdefault(owner, deque()).append(output_id)
        chosen = []
        while total > cap and queues:
            owner = max(queues, key=lambda who: held[who])
            output_id = queues[owner].popleft()
            size = sizes[output_id][0]
            chosen.append(output_id)
            total -= size
            held[owner] -= size
            if not queues[owner]:
                del queues[owner]
        return chosen


class StorageHealth:
    """Whether outputs can be saved under `root`: writable, and more than `min_free_bytes` free."""

    def __init__(self, root: Path, min_free_bytes: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.root = Path(root)
        self.min_free_bytes = min_free_bytes
        self._clock = clock
        self._checked_at: float | None = None
        self._problem: str | None = None
        self._lock = threading.Lock()

    def problem(self) -> str | None:
        """Why results can't be saved now (None: they can); cached for CHECK_INTERVAL_S."""
        with self._lock:
            now = self._clock()
            if self._checked_at is None or now - self._checked_at >= CHECK_INTERVAL_S:
                self._problem, self._checked_at = self._check(), now
            return self._problem

    def public_problem(self) -> str | None:
        """`problem()` as said to anyone (unauthenticated `/ready`, a user's stream): without the output
        folder's path, its free space or the system's error, which only admins see."""
        problem = self.problem()
        if problem is None:
            return None
        if problem.startswith("only "):
            return "the output disk is nearly full: results may not be saved (/admin/status says more)"
        return "results can't be saved on this server now (/admin/status says why)"

    def note_failure(self, reason: str) -> None:
        """A save just failed: report it until the next check finds the directory usable again."""
        with self._lock:
            self._problem, self._checked_at = f"saving an output failed: {reason}", self._clock()

    def _check(self) -> str | None:
        try:
            free = shutil.disk_usage(self.root).free
        except OSError as exc:
            return f"the output directory {self.root} can't be read: {exc.strerror or exc}"
        if free < self.min_free_bytes:
            return (
                f"only {free / 1e6:.0f} MB free for outputs in {self.root} (the floor is "
                f"{self.min_free_bytes / 1e6:.0f} MB, min_free_mb): free space, or keep outputs for less "
                "(retention_days, retention_max_gb)"
            )
        probe = self.root / f".write-probe-{secrets.token_hex(4)}"
        try:
            with open(probe, "wb") as handle:
                handle.write(b"cosyserve")
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as exc:
            return f"the output directory {self.root} is not writable: {exc.strerror or exc}"
        finally:
            with contextlib.suppress(OSError):  # a read-only mount refuses the unlink too: the answer stands
                probe.unlink(missing_ok=True)
        return None


class Expiring(Protocol):
    def enforce_retention(self) -> object: ...


class RetentionWorker:
    """Runs `store.enforce_retention()` now and then every `interval_s` seconds, until `stop()`."""

    def __init__(
        self,
        store: Expiring,
        interval_s: float = 3600.0,
        also: Callable[[], object] | None = None,
    ) -> None:
        self.store = store
        self.interval_s = interval_s
        self.also = also  # more housekeeping for each pass (old job records)
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
            if self.also is not None:
                try:
                    self.also()
                except Exception:  # the database briefly away: the next pass tries again
                    log.exception("housekeeping after output retention failed")
            upload_missing = getattr(self.store, "upload_missing", None)  # outputs the bucket never got
            if upload_missing is not None:
                try:
                    upload_missing()
                except Exception as exc:  # the bucket unreadable: the next run asks again
                    log.warning("could not check which outputs the bucket lacks: %s", exc)
            self.runs += 1
            self._stop.wait(self.interval_s)
