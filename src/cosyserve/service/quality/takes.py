"""Retakes: how many takes a request may have, which one is kept, and the seeds they use.

Take k (from 0) uses seed `(seed + k) mod 2**31`, so the chosen take's seed, given back with `takes=1`,
makes the same audio again. The loop stops at the first take that passes every check. When none passes,
the kept take is the one failing the fewest checks, then the one most like the voice (highest similarity),
then the earliest.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cosyserve.service.quality.scores import QualityThresholds, TakeScores

MAX_TAKES = 5
TAKE_HEADERS = (  # every header `TakeReport.headers` may set
    "X-Takes",
    "X-Take-Passed",
    "X-Take-Failed",
    "X-Take-Similarity",
    "X-Take-Pace",
    "X-Take-Repetition",
    "X-Take-Silence",
    "X-Take-Longest-Pause",
    "X-Take-Clipping",
    "X-Take-Flatness",
    "X-Take-Error-Rate",
)


@dataclass(frozen=True)
class TakePolicy:
    """How many takes a synthesis may make and the limits each is judged by."""

    takes: int = 1  # 1: scores are computed, nothing is made again
    thresholds: QualityThresholds = field(default_factory=QualityThresholds)
    enabled: bool = True  # False: no scores at all (they cost a CAM++ run per take)

    def __post_init__(self) -> None:
        if not (1 <= self.takes <= MAX_TAKES):
            raise ValueError(f"takes must be from 1 to {MAX_TAKES}, got {self.takes}")


def take_seed(seed: int, index: int, max_seed: int) -> int:
    """The seed of take `index` (0 = the request's own)."""
    return (seed + index) % (max_seed + 1)


def best_take(scores: Sequence[TakeScores]) -> int:
    """Index of the take to keep among `scores` (in the order they were made); see the module's rule."""
    if not scores:
        raise ValueError("no takes to choose from")

    def rank(index: int) -> tuple[int, float, int]:
        take = scores[index]
        similarity = take.similarity if take.similarity is not None else 0.0
        return (len(take.failed), -similarity, index)

    return min(range(len(scores)), key=rank)


@dataclass(frozen=True)
class TakeReport:
    """The kept take's scores and how many takes were made: what a response, status or manifest shows."""

    scores: TakeScores
    takes: int = 1

    def as_dict(self) -> dict[str, object]:
        return {**self.scores.as_dict(), "takes": self.takes}

    @classmethod
    def from_fields(cls, data: Mapping[str, Any]) -> TakeReport:
        """Back from `dataclasses.asdict(report)` after JSON (a worker's outcome on an API node)."""
        scores = dict(data["scores"])
        scores["failed"] = tuple(scores.get("failed") or ())
        return cls(TakeScores(**scores), int(data.get("takes", 1)))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TakeReport:
        """Back from `as_dict` (what an output's manifest keeps), its rounding aside."""
        names = {f.name for f in dataclasses.fields(TakeScores)}
        scores = {name: value for name, value in data.items() if name in names}
        scores["failed"] = tuple(scores.get("failed") or ())
        return cls(TakeScores(**scores), int(data.get("takes") or 1))

    def headers(self) -> dict[str, str]:
        """HTTP response headers (`X-Take-…`)."""
        s = self.scores
        headers = {
            "X-Takes": str(self.takes),
            "X-Take-Passed": "true" if s.passed else "false",
            "X-Take-Failed": ",".join(s.failed) or "none",
            "X-Take-Repetition": f"{s.repetition:.3f}",
            "X-Take-Silence": f"{s.silence_ratio:.3f}",
            "X-Take-Longest-Pause": f"{s.longest_pause_s:.2f}",
            "X-Take-Clipping": f"{s.clipping_ratio:.4f}",
            "X-Take-Flatness": f"{s.flatness:.4f}",
        }
        if s.similarity is not None:
            headers["X-Take-Similarity"] = f"{s.similarity:.3f}"
        if s.pace_ratio is not None:
            headers["X-Take-Pace"] = f"{s.pace_ratio:.2f}"
        if s.error_rate is not None:
            headers["X-Take-Error-Rate"] = f"{s.error_rate:.3f}"
        return headers
