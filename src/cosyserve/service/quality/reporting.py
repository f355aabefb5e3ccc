"""The scores where users see them: a job's pieces as one report, a job's or batch item's stored fields,
manifest.csv's columns and the "check these" list of items whose every take failed."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from cosyserve.service.quality.scores import CHECKS, TakeScores
from cosyserve.service.quality.takes import TakeReport

FIELD = "quality"  # the key in a job's or item's stored result
MANIFEST_COLUMNS = ("takes", "take_passed", "take_failed", "similarity", "pace_ratio", "check")


def combined_report(reports: Sequence[TakeReport | None]) -> TakeReport | None:
    """Pieces of one job as one report: each score at its worst piece, the failed checks of every piece,
    the most takes any piece made. None when no piece was scored."""
    scored = [r for r in reports if r is not None]
    if not scored:
        return None
    if len(scored) == 1:
        return scored[0]
    scores = [r.scores for r in scored]

    def worst(values: Iterable[float | None], pick: Any) -> float | None:
        known = [v for v in values if v is not None]
        return pick(known) if known else None

    failed = {name for s in scores for name in s.failed}
    combined = TakeScores(
        similarity=worst((s.similarity for s in scores), min),
        seconds_per_unit=worst((s.seconds_per_unit for s in scores), max),
        pace_ratio=worst(
            (s.pace_ratio for s in scores), lambda v: max(v, key=lambda r: abs(math.log(r or 1e-9)))
        ),
        repetition=max(s.repetition for s in scores),
        silence_ratio=max(s.silence_ratio for s in scores),
        longest_pause_s=max(s.longest_pause_s for s in scores),
        clipping_ratio=max(s.clipping_ratio for s in scores),
        flatness=max(s.flatness for s in scores),
        error_rate=worst((s.error_rate for s in scores), max),
        failed=tuple(name for name in CHECKS if name in failed),
        scoring_s=sum(s.scoring_s for s in scores),
    )
    return TakeReport(combined, max(r.takes for r in scored))


def _furthest_from_one(ratios: list[float]) -> float:
    return max(ratios, key=lambda ratio: abs(math.log(max(ratio, 1e-9))))


def stored_fields(report: TakeReport | None) -> dict[str, Any]:
    """`{"quality": {...}}` for a stored result (empty when the take was not scored)."""
    return {FIELD: report.as_dict()} if report is not None else {}


def saved_report(manifest: Mapping[str, Any]) -> TakeReport | None:
    """The kept take's report from an output's manifest (an output adopted after a restart)."""
    quality = manifest.get(FIELD)
    return TakeReport.from_dict(quality) if isinstance(quality, Mapping) else None


def manifest_columns(result: Mapping[str, Any] | None) -> dict[str, Any]:
    """An item's MANIFEST_COLUMNS from its stored result; `check` says "listen" when every take failed."""
    quality = (result or {}).get(FIELD)
    if not isinstance(quality, Mapping):
        return {}
    similarity, pace_ratio = quality.get("similarity"), quality.get("pace_ratio")
    passed = bool(quality.get("passed"))
    return {
        "takes": quality.get("takes", ""),
        "take_passed": "yes" if passed else "no",
        "take_failed": " ".join(quality.get("failed") or []),
        "similarity": f"{similarity:.3f}" if isinstance(similarity, int | float) else "",
        "pace_ratio": f"{pace_ratio:.2f}" if isinstance(pace_ratio, int | float) else "",
        "check": "" if passed else "listen",
    }


def listen_list(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Rows carrying `manifest_columns` (and position, text) -> the ones whose every take failed: their
    position, text and the checks the kept take failed, for a person to listen to."""
    return [
        {"position": row["position"], "text": row.get("text", ""), "failed": str(row["take_failed"]).split()}
        for row in rows
        if row.get("check") == "listen"
    ]


def needs_listen(result: Mapping[str, Any] | None) -> bool:
    """Whether an item's stored result says every take failed its checks."""
    quality = (result or {}).get(FIELD)
    return isinstance(quality, Mapping) and not quality.get("passed", True)
