"""A batch's results as one ZIP, streamed from storage, and a dub's per-cue report.

The ZIP holds every finished item as `0001_<name>.<format>` (read from the output store one file at a time,
so memory holds one item, never the archive), its sentence timings as `0001_<name>.srt`, and
`manifest.csv` last: one row per item with its text, voice, seed, duration, file, subtitles, state and
error. A dub adds its track (`dub.<format>`) and `report.csv`.
"""

from __future__ import annotations

import csv
import io
import json
import zipfile
from collections.abc import Iterator
from typing import Any

import soundfile as sf

from cosyserve.errors import CosyServeError
from cosyserve.service.audio_formats import EXTENSIONS, encode
from cosyserve.service.dub_timeline import Placement
from cosyserve.service.labels.labeller import Labeller
from cosyserve.service.requests import SentenceTiming
from cosyserve.service.stores.batches import BatchItem
from cosyserve.service.stores.outputs import OutputStore, StoredOutput
from cosyserve.service.subtitles import to_srt

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
)
REPORT_COLUMNS = (
    "cue",
    "text",
    "planned_start_s",
    "planned_end_s",
    "actual_start_s",
    "actual_end_s",
    "duration_s",
    "speed",
    "overflow_s",
    "cut_s",
    "state",
    "error",
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
) -> Iterator[bytes]:
    """The batch's ZIP, a piece at a time."""
    sink = _Sink()
    rows = []
    with zipfile.ZipFile(sink, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for item in items:
            row = manifest_row(item)
            output = _output(outputs, item)
            if output is not None:
                fmt = str(item.params.get("format") or "wav")
                row["file"] = f"{item.file_stem}.{EXTENSIONS.get(fmt, fmt)}"
                yield from _add_audio(archive, sink, row["file"], output, fmt, outputs.labels)
                sentences = _timings(output.manifest)
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
                outputs.labels,
            )
            archive.writestr("report.csv", report_csv(dub_report(items)))
        archive.writestr("manifest.csv", rows_csv(MANIFEST_COLUMNS, rows))
    yield sink.take()


def _add_audio(
    archive: zipfile.ZipFile, sink: _Sink, name: str, output: StoredOutput, fmt: str, labels: Labeller | None
) -> Iterator[bytes]:
    if fmt == "wav":
        with archive.open(name, "w", force_zip64=True) as entry, output.path.open("rb") as source:
            while piece := source.read(COPY_PIECE):
                entry.write(piece)
                yield sink.take()
        return
    audio, rate = sf.read(output.path, dtype="float32")
    data = encode(audio, fmt, source_rate=rate)
    archive.writestr(name, labels.label_stored(data, fmt, output) if labels is not None else data)


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
    }


def _timings(manifest: dict[str, Any]) -> list[SentenceTiming]:
    return [
        SentenceTiming(int(s["index"]), str(s["text"]), float(s["start_s"]), float(s["end_s"]))
        for s in manifest.get("sentences", [])
    ]


def dub_report(items: list[BatchItem]) -> list[dict[str, Any]]:
    """One row per cue: planned and actual start and end, speed used, overflow, cut (REPORT_COLUMNS)."""
    rows = []
    for item in items:
        params, result = item.params, item.result or {}
        start, end, limit = float(params["start_s"]), float(params["end_s"]), float(params["limit_s"])
        row: dict[str, Any] = {
            "cue": item.position,
            "text": params.get("text", ""),
            "planned_start_s": start,
            "planned_end_s": end,
            "state": item.state,
            "error": item.error_message or "",
        }
        if item.state == "done" and item.duration_s is not None:
            placed = placement(item.duration_s, start, end, limit)
            row.update(
                actual_start_s=placed.start_s,
                actual_end_s=round(placed.actual_end_s, 3),
                duration_s=round(placed.duration_s, 3),
                speed=result.get("speed", 1.0),
                overflow_s=placed.overflow_s,
                cut_s=placed.cut_s,
            )
        rows.append(row)
    return rows


def placement(duration_s: float, start_s: float, end_s: float, limit_s: float) -> Placement:
    """Where speech of `duration_s` placed at `start_s` goes (the same rule `dub_timeline.place` applies)."""
    room = max(0.0, limit_s - start_s)
    return Placement(
        start_s=start_s,
        end_s=end_s,
        duration_s=min(duration_s, room),
        overflow_s=round(max(0.0, start_s + duration_s - end_s), 3),
        cut_s=round(max(0.0, duration_s - room), 3),
    )


def report_csv(rows: list[dict[str, Any]]) -> str:
    return rows_csv(REPORT_COLUMNS, rows)


def report_json(rows: list[dict[str, Any]]) -> str:
    return json.dumps({"cues": rows}, ensure_ascii=False, indent=1)


def rows_csv(columns: tuple[str, ...], rows: list[dict[str, Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()
