"""One stored output on disk: its id, its audio + JSON sidecar pair, how a pair is written and read,
and what a sidecar records (`build_manifest`).

Shared by the local store (`outputs.OutputStore`) and the bucket reader (`bucket.OutputBucket`),
which both write pairs into the same outputs directory and parse the same sidecars.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cosyserve.errors import InputError
from cosyserve.errors import OutputNotFound as OutputNotFound  # defined there, with the error table
from cosyserve.service.outcomes import SynthesisResult
from cosyserve.service.requests import SynthesisRequest
from cosyserve.service.stores.atomic_files import TEMP_SUFFIX, write_atomic  # noqa: F401  (re-exported)

OUTPUT_ID = re.compile(r"output_(\d{8})_(\d{6})(?:_([1-9]\d{0,11}))?")  # 12 digits: node tag + counter
EXTENSION = re.compile(r"[a-z0-9]{1,8}")


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

    @property
    def owner(self) -> str | None:
        """Whom it was made for (its manifest's `owner`; None: made without one)."""
        owner = self.manifest.get("owner")
        return owner if isinstance(owner, str) else None


def check_output_id(output_id: str) -> str:
    """`output_id` if it is a well-formed id; InputError otherwise (the only guard against path tricks)."""
    if not isinstance(output_id, str) or not OUTPUT_ID.fullmatch(output_id):
        raise InputError(
            f"{output_id!r} is not an output id; ids look like output_20250101_120000 or "
            "output_20250101_120000_2"
        )
    return output_id


def temp_output_path(root: Path, ext: str) -> Path:
    """A hidden file in the outputs directory `root` for audio written piece by piece (a dub's track)
    before `OutputStore.save` takes it; left behind by a crash, retention removes it after an hour."""
    return root / f".output_{uuid.uuid4().hex}.{ext}{TEMP_SUFFIX}"


TOMBSTONE = ".gone"  # what a removed output leaves under its id, so the id is never given out again
TOMBSTONE_KEEP_S = 8 * 86400.0  # past a DST change, a time-zone switch and any sensible link lifetime


def remove_pair(output: StoredOutput) -> None:
    """Audio first, sidecar last, a tombstone left under the id: an id removed within the second it was
    made was given to the next output of that second, and a link or job that named it then served that
    output, someone else's audio (ids also repeat across a DST change: names are in local time)."""
    (output.sidecar_path.parent / f"{output.id}{TOMBSTONE}").touch()  # before the sidecar frees the id
    output.path.unlink(missing_ok=True)
    output.sidecar_path.unlink(missing_ok=True)


def pair_size(output: StoredOutput) -> int:
    size = 0
    for path in (output.path, output.sidecar_path):
        with contextlib.suppress(FileNotFoundError):
            size += path.stat().st_size
    return size


def to_json(record: dict[str, Any]) -> bytes:
    """A sidecar's bytes; TypeError for a value JSON can't hold (numpy values, bytes and paths can)."""

    def fallback(value: Any) -> Any:
        if isinstance(value, np.generic):
            return value.item()
        if isinstance(value, np.ndarray):
            return value.tolist()
        if isinstance(value, (bytes, bytearray)):
            return {"sha256": sha256(value), "bytes": len(value)}
        if isinstance(value, Path):
            return str(value)
        raise TypeError(f"manifest value of type {type(value).__name__} can't be stored as JSON")

    return json.dumps(record, ensure_ascii=False, indent=2, default=fallback).encode("utf-8")


def parse_sidecar(output_id: str, data: bytes) -> tuple[dict[str, Any], str] | None:
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


def sort_key(output_id: str) -> tuple[str, int]:
    """Creation order: the stamp (local time of the store's zone), then the counter (tagged counters
    order by node within a second)."""
    match = OUTPUT_ID.fullmatch(output_id)
    if match is None:
        return ("", 0)
    return (match.group(1) + match.group(2), int(match.group(3) or 0))


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


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
    actually used, extra `parameters` (sampling settings etc.), the model, timings, warnings and the kept
    take's scores (`service.quality`)."""
    fields = {}
    for field in dataclasses.fields(request):
        value = getattr(request, field.name)
        if field.name == "prompt_wav":
            fields["prompt_wav_sha256"] = sha256(value) if value else None
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
        "reading": dict(result.reading),  # spoken form, LM text and token pieces of every segment
        "stage_seconds": dict(result.stage_seconds),
        "warnings": list(result.warnings),
        "quality": result.quality.as_dict() if result.quality is not None else None,  # the kept take's scores
        "owner": owner,
    }


def remove_strays(
    root: Path,
    now: float,
    grace_s: float,
    read: Callable[[str], Any],
    complete: set[str] | frozenset[str] = frozenset(),
) -> list[Path]:
    """Remove temp files, unreadable sidecars (with their audio) and audio without a sidecar in `root`,
    if older than `grace_s`, and tombstones older than TOMBSTONE_KEEP_S; `read(output_id)` raises
    OutputNotFound for a sidecar it cannot read."""
    removed = []
    for path in sorted(root.iterdir()):
        name = path.name
        if name.startswith(".output_") and name.endswith(TEMP_SUFFIX):
            stray = True
        elif path.suffix == TOMBSTONE and OUTPUT_ID.fullmatch(path.stem):
            with contextlib.suppress(FileNotFoundError):
                if now - path.stat().st_mtime > TOMBSTONE_KEEP_S:
                    path.unlink(missing_ok=True)
            continue
        elif OUTPUT_ID.fullmatch(path.stem):
            if path.suffix == ".json":
                if path.stem in complete:  # read a moment ago: a complete output
                    continue
                try:
                    read(path.stem)
                    stray = False
                except OutputNotFound:
                    stray = True
            else:
                stray = path.stem not in complete and not path.with_suffix(".json").exists()
        else:
            continue
        try:
            old = now - path.stat().st_mtime > grace_s
        except FileNotFoundError:
            continue
        if stray and old:
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed
