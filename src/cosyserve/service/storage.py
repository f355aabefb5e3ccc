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
background). Local retention never deletes remote objects: give the bucket a lifecycle rule
(`S3Sync.apply_lifecycle`) for that. `delete()` also deletes the remote pair when `sync_deletes=True`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from cosyserve import __version__
from cosyserve.errors import InputError
from cosyserve.service.requests import SynthesisRequest, SynthesisResult

if TYPE_CHECKING:
    from cosyserve.service.s3sync import S3Sync

log = logging.getLogger(__name__)

OUTPUT_ID = re.compile(r"output_(\d{8})_(\d{6})(?:_([1-9]\d{0,5}))?")
EXTENSION = re.compile(r"[a-z0-9]{1,8}")
MAX_SUFFIX = 999_999  # outputs with the same second-resolution stamp
STRAY_GRACE_S = 3600.0  # a half-written output younger than this may still be in progress
MAX_LIST_LIMIT = 1000
TEMP_SUFFIX = ".tmp"


class OutputNotFound(InputError):
    """No complete output with that id (never saved, removed, or still being written)."""


@dataclass(frozen=True)
class StoredOutput:
    id: str  # the file stem, e.g. output_20250101_120000_1
    path: Path  # the audio file
    sidecar_path: Path  # the JSON provenance manifest
    url_path: str  # where the API serves it, e.g. /v1/outputs/output_20250101_120000_1
    manifest: dict[str, Any]

    @property
    def created_at(self) -> float:
        return float(self.manifest.get("created_at_unix", 0.0))

    @property
    def filename(self) -> str:
        return self.path.name


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

    # -- writing -------------------------------------------------------------------------------------

    def save(self, audio_bytes: bytes, ext: str, manifest: dict[str, Any]) -> StoredOutput:
        """Store one result; `manifest` (from `build_manifest` or the caller's own) goes into the sidecar
        together with the id, file name, size, sha256, created_at and the cosyserve version."""
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
        if self.sync is not None:
            self.sync.enqueue(audio_path, audio_path.name)
            self.sync.enqueue(sidecar_path, sidecar_path.name)
        return stored

    def _reserve(self, base: str, ext: str) -> str:
        for n in range(MAX_SUFFIX + 1):
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
        """The complete output with this id; InputError for a malformed id, OutputNotFound if none."""
        check_output_id(output_id)
        sidecar_path = self.root / f"{output_id}.json"
        try:
            manifest = json.loads(sidecar_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise OutputNotFound(f"no output {output_id}; it may have expired or been deleted") from None
        name = manifest.get("file") if isinstance(manifest, dict) else None
        ext = name[len(output_id) + 1 :] if isinstance(name, str) and name.startswith(f"{output_id}.") else ""
        if not EXTENSION.fullmatch(ext):  # the sidecar names the audio file: trust only its extension
            raise OutputNotFound(f"output {output_id} has a damaged sidecar; it will be cleaned up")
        audio_path = self.root / f"{output_id}.{ext}"
        if not audio_path.is_file():
            raise OutputNotFound(f"no output {output_id}; it may have expired or been deleted")
        return StoredOutput(output_id, audio_path, sidecar_path, f"{self.url_prefix}/{output_id}", manifest)

    def list(self, owner: str | None = None, limit: int = 50, offset: int = 0) -> list[StoredOutput]:
        """Complete outputs, newest first; only `owner`'s when given. Reads sidecars lazily (from disk,
        so it reflects other processes and restarts)."""
        if not 1 <= limit <= MAX_LIST_LIMIT or offset < 0:
            raise InputError(f"use 1 <= limit <= {MAX_LIST_LIMIT} and offset >= 0 (got {limit}, {offset})")
        found: list[StoredOutput] = []
        skipped = 0
        for output_id in self._ids_newest_first():
            try:
                output = self.get(output_id)
            except OutputNotFound:
                continue
            if owner is not None and output.manifest.get("owner") != owner:
                continue
            if skipped < offset:
                skipped += 1
                continue
            found.append(output)
            if len(found) >= limit:
                break
        return found

    def _ids_newest_first(self) -> list[str]:
        ids = []
        for path in self.root.glob("output_*.json"):
            match = OUTPUT_ID.fullmatch(path.stem)
            if match:
                ids.append((match.group(1) + match.group(2), int(match.group(3) or 0), path.stem))
        return [output_id for *_, output_id in sorted(ids, reverse=True)]

    def total_bytes(self) -> int:
        """Bytes used by complete outputs (audio + sidecars)."""
        return sum(_pair_size(output) for output in self._complete_outputs())

    # -- removing ------------------------------------------------------------------------------------

    def delete(self, output_id: str) -> StoredOutput:
        """Remove an output (audio first, sidecar last); returns what was removed."""
        output = self.get(output_id)
        self._remove(output)
        if self.sync is not None and self.sync_deletes:
            self.sync.enqueue_delete(output.path.name)
            self.sync.enqueue_delete(output.sidecar_path.name)
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
                outputs.append(self.get(output_id))
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
                        self.get(path.stem)
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
