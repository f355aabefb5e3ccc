"""The labels of files the local CLI writes (`synthesize`, `batch`, `dub` without `--server`): the implicit
label and the cue as the server would add them (docs/labels.md), from the same settings (env
`COSYSERVE_*`, ./cosyserve.toml) and the signing secret of the data directory, so that directory's server
verifies them. No C2PA manifest: it differs on every signing, and the same command should write the same
bytes. The content id is `local-` and the start of the audio's SHA-256, for the same reason."""

from __future__ import annotations

import hashlib
from pathlib import Path

from cosyserve.service.labels.labeller import Labeller

SUFFIX_FORMATS = {".wav": "wav", ".flac": "flac", ".mp3": "mp3", ".opus": "opus"}  # .ogg (Vorbis): none


def cli_labeller(data_dir: Path) -> Labeller:
    from cosyserve.service.settings import Settings

    return Labeller.from_settings(Settings.load(data_dir=data_dir, c2pa=False))


def label_bytes(labels: Labeller, data: bytes, fmt: str, voice: str | None) -> bytes:
    content_id = "local-" + hashlib.sha256(data).hexdigest()[:16]
    return labels.label_file(data, fmt, content_id, voice=voice)


def label_written_file(labels: Labeller, path: Path, voice: str | None) -> None:
    """Label a file already written at `path` (its format from its suffix)."""
    fmt = SUFFIX_FORMATS.get(path.suffix.lower())
    if fmt is not None:
        path.write_bytes(label_bytes(labels, path.read_bytes(), fmt, voice))
