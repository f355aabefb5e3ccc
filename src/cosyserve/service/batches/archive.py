"""A batch's results as one ZIP, streamed from storage, and a dub's per-cue report.

The ZIP holds every finished item as `0001_<name>.<format>` (read from the output store one file at a time,
so memory holds one item, never the archive), its sentence timings as `0001_<name>.srt`, and
`manifest.csv` last: one row per item with its text, voice, seed, duration, file, subtitles, state and
error, and its kept take's scores (`check` = listen: every take failed its checks, docs/quality.md).
A dub adds its track (`dub.<format>`; a long one transcoded file to file, never whole in memory)
and `report.csv` (`dub_report`).
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import soundfile as sf

from cosyserve.errors import CosyServeError
from cosyserve.service.audio_formats import EXTENSIONS, IN_MEMORY_LIMIT_BYTES, encode, transcode_file
from cosyserve.service.batches.csv_cells import csv_text
from cosyserve.service.batches.dub_report import dub_report, report_csv
from cosyserve.service.quality.reporting import MANIFEST_COLUMNS as QUALITY_COLUMNS
from cosyserve.service.quality.reporting import manifest_columns
from cosyserve.service.stores.batches import BatchItem
from cosyserve.service.stores.output_files import temp_output_path
from cosyserve.service.stores.outputs import OutputStore, StoredOutput
from cosyserve.service.subtitles import manifest_timings, to_srt

MANIFEST_COLUMNS = (
    "position",
    "file",
    "name",
    "text",
    "voice",
    "seed",
    "duration_s",
    "subtitles",
    "state",
    "error",
    *QUALITY_COLUMNS,
)
COPY_PIECE = 1 << 20


class _Sink(io.RawIOBase):
    """Where `zipfile` writes: collects bytes until the stream takes them (not seekable, so zipfile
    writes data descriptors and never goes back)."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.position = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        chunk = bytes(data)
        self.parts.append(chunk)
        self.position += len(chunk)
        return len(chunk)

    def tell(self) -> int:
        return self.position

    def take(self) -> bytes:
        data, self.parts = b"".join(self.parts), []
        return data


def stream_zip(
    items: list[BatchItem],
    outputs: OutputStore,
    *,
    track: StoredOutput | None = None,
    track_format: str = "wav",
    dub: bool = False,
) -> Iterator[bytes]:
    """The batch's ZIP, a piece at a time; a `dub`'s has its report, and its `track` when there is one."""
    sink = _Sink()
    rows = []
    with zipfile.ZipFile(sink, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for item in items:
            row = manifest_row(item)
            output = _output(outputs, item)
            if output is None and item.state == "done":  # expired or deleted since it was made
                row["state"] = "missing"
            if output is not None:
                fmt = str(item.params.get("format") or "wav")
                row["file"] = f"{item.file_stem}.{EXTENSIONS.get(fmt, fmt)}"
                yield from _add_audio(archive, sink, row["file"], output, fmt, outputs)
                sentences = manifest_timings(output.manifest)
                if sentences:
                    row["subtitles"] = f"{item.file_stem}.srt"
                    archive.writestr(row["subtitles"], to_srt(sentences))
            rows.append(row)
            yield sink.take()
        if track is not None:
            yield from _add_audio(
                archive,
                sink,
                f"dub.{EXTENSIONS.get(track_format, track_format)}",
                track,
                track_format,
                outputs,
            )
        if dub or track is not None:  # the report, with the track or without it (deleted, never made)
            archive.writestr("report.csv", report_csv(dub_report(items)))
        archive.writestr("manifest.csv", rows_csv(MANIFEST_COLUMNS, rows))
    yield sink.take()


def _add_audio(
    archive: zipfile.ZipFile,
    sink: _Sink,
    name: str,
    output: StoredOutput,
    fmt: str,
    outputs: OutputStore | None = None,
) -> Iterator[bytes]:
    if fmt == "wav":
        yield from _copy_in(archive, sink, name, output.path)
        return
    if outputs is not None and output.path.stat().st_size > IN_MEMORY_LIMIT_BYTES:  # a long dub track
        temp = temp_output_path(outputs.root, EXTENSIONS.get(fmt, fmt))
        try:
            transcode_file(output.path, temp, fmt)
            yield from _copy_in(archive, sink, name, temp)
        finally:
            temp.unlink(missing_ok=True)
        return
    audio, rate = sf.read(output.path, dtype="float32")
    data = encode(audio, fmt, source_rate=rate)
    labels = outputs.labels if outputs is not None else None
    archive.writestr(name, labels.label_stored(data, fmt, output) if labels is not None else data)


def _copy_in(archive: zipfile.ZipFile, sink: _Sink, name: str, path: Path) -> Iterator[bytes]:
    with archive.open(name, "w", force_zip64=True) as entry, path.open("rb") as source:
        while piece := source.read(COPY_PIECE):
            entry.write(piece)
            yield sink.take()


def _output(outputs: OutputStore, item: BatchItem) -> StoredOutput | None:
    if item.state != "done" or not item.output_id:
        return None
    try:
        return outputs.get(item.output_id)
    except CosyServeError:  # expired or deleted since: the manifest says it is missing
        return None


def manifest_row(item: BatchItem) -> dict[str, Any]:
    params = item.params
    return {
        "position": item.position,
        "file": "",
        "name": item.name,
        "text": params.get("text", ""),
        "voice": params.get("voice") or "",
        "seed": item.seed if item.seed is not None else "",
        "duration_s": f"{item.duration_s:.3f}" if item.duration_s is not None else "",
        "subtitles": "",
        "state": item.state if item.state != "done" or item.output_id else "missing",
        "error": item.error_message or "",
        **manifest_columns(item.result),
    }


def rows_csv(columns: tuple[str, ...], rows: list[dict[str, Any]]) -> str:
    return csv_text(columns, rows)
