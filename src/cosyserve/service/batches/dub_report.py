"""A dub's report: per cue, where its speech went, what was done to make it fit, and what was played.

Cues are placed in time order, and `position` (1, 2, ... in time order) is how the track, the items and
their files are numbered; each row also keeps what the subtitle file called the cue (`cue`: its SRT
number or WebVTT identifier, else its place in the file) and its place in the file (`file_position`).
When the file's order was not the time order the report says so (`reordered`).

Durations are split so that none counts audio twice: `speech_s` is the speech made for the cue (trimmed,
at the speed used), `played_s` what of it plays in the track, `cut_s` what was cut at the next cue (never
played), and `overflow_s` how far what plays runs past the cue's planned end. `adjustments` says it in
words: the speed-up (from `natural_s`, its length at the requested speed), the overflow, the cut.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from cosyserve.service.batches.csv_cells import csv_text
from cosyserve.service.batches.dub_plan import CueSlot
from cosyserve.service.batches.dub_timeline import placement
from cosyserve.service.quality.reporting import MANIFEST_COLUMNS as QUALITY_COLUMNS
from cosyserve.service.quality.reporting import listen_list, manifest_columns
from cosyserve.service.stores.batches import BatchItem

REPORT_COLUMNS = (
    "position",
    "cue",
    "file_position",
    "text",
    "planned_start_s",
    "planned_end_s",
    "actual_start_s",
    "actual_end_s",
    "speech_s",
    "played_s",
    "cut_s",
    "overflow_s",
    "speed",
    "speedup",
    "natural_s",
    "adjustments",
    "state",
    "error",
    *QUALITY_COLUMNS,
)
REORDERED_NOTE = (
    "the subtitle file's cues were not in time order: they are placed and numbered (`position`) in time "
    "order; `cue` and `file_position` are the file's own"
)


def cue_row(item: BatchItem) -> dict[str, Any]:
    """One cue's row (REPORT_COLUMNS); the placement columns only once it is done."""
    params, result = item.params, item.result or {}
    slot = CueSlot.of(params)
    row: dict[str, Any] = {
        "position": item.position,
        "cue": str(params.get("cue_id") or item.position),
        "file_position": int(params.get("file_position") or item.position),
        "text": params.get("text", ""),
        "planned_start_s": slot.start_s,
        "planned_end_s": slot.end_s,
        "state": item.state,
        "error": item.error_message or "",
        **manifest_columns(result),
    }
    if item.state != "done" or item.duration_s is None:
        return row
    placed = placement(item.duration_s, slot.start_s, slot.end_s, slot.limit_s)
    requested = float(params.get("speed") or 1.0)
    speed = float(result.get("speed") or requested)
    natural = result.get("natural_s")
    row.update(
        actual_start_s=placed.start_s,
        actual_end_s=round(placed.actual_end_s, 3),
        speech_s=placed.speech_s,
        played_s=placed.played_s,
        cut_s=placed.cut_s,
        overflow_s=placed.overflow_s,
        speed=speed,
        speedup=round(speed / requested, 4),
        natural_s=natural,
    )
    row["adjustments"] = _adjustments(row, natural)
    return row


def _adjustments(row: dict[str, Any], natural_s: float | None) -> str:
    said = []
    if row["speedup"] > 1.0:
        before = f" from {natural_s:.2f} s" if natural_s else ""
        said.append(f"sped up {row['speedup']:g}x{before} to {row['speech_s']:.2f} s")
    if row["overflow_s"] > 0:
        said.append(f"ran {row['overflow_s']:.3f} s past its end")
    if row["cut_s"] > 0:
        said.append(f"cut {row['cut_s']:.3f} s at the next cue (not played); {row['played_s']:.3f} s played")
    return "; ".join(said)


def dub_report(items: Sequence[BatchItem]) -> list[dict[str, Any]]:
    """One row per cue, in time order."""
    return [cue_row(item) for item in items]


def report_document(
    rows: list[dict[str, Any]],
    *,
    track_s: float | None = None,
    planned_track_s: float | None = None,
    charged_s: float | None = None,
) -> dict[str, Any]:
    """The JSON report: the rows, whether the file's order was changed, the length of the track made
    (None: not made yet, or not known here, e.g. a local run), the length planned from the cues, and
    what was charged for it."""
    reordered = any(row["file_position"] != row["position"] for row in rows)
    document: dict[str, Any] = {"reordered": reordered}
    if reordered:
        document["order_note"] = REORDERED_NOTE
    if track_s is not None:
        document["track_s"] = round(track_s, 3)
    if planned_track_s is not None:
        document["planned_track_s"] = round(planned_track_s, 3)
    if charged_s is not None:
        document["charged_s"] = round(charged_s, 3)
    document["check_these"] = listen_list(rows)  # cues whose every take failed its checks
    document["cues"] = rows
    return document


def report_json(document: dict[str, Any]) -> str:
    return json.dumps(document, ensure_ascii=False, indent=1)


def report_csv(rows: list[dict[str, Any]]) -> str:
    return csv_text(REPORT_COLUMNS, rows)
