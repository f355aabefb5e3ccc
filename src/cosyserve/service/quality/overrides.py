"""A request's own thresholds: some `QualityThresholds` fields set for one request, over the server's.

A request carries them as a mapping, name -> value (`SynthesisRequest.thresholds`); `check_overrides`
says which names exist and what values make sense (THRESHOLD_BOUNDS), `apply_overrides` puts them over
the server's thresholds. The API, the batch reader and the CLI check with the same bounds.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cosyserve.errors import InputError
from cosyserve.service.quality.scores import QualityThresholds


@dataclass(frozen=True)
class Bounds:
    """Where a threshold may lie: from `low` (excluded when `above`) to `high`."""

    low: float
    high: float
    above: bool = False  # `low` itself is not allowed (a ratio of 0 would fail every take)

    def holds(self, value: float) -> bool:
        over_low = value > self.low if self.above else value >= self.low
        return over_low and value <= self.high

    def describe(self) -> str:
        if self.above:
            return f"above {self.low:g} and at most {self.high:g}"
        return f"{self.low:g} to {self.high:g}"


# Every field of QualityThresholds: a cosine, ratios of a pace, shares in [0, 1], seconds, an error rate
# (a WER passes 1 when the transcript has more words than the text).
THRESHOLD_BOUNDS: dict[str, Bounds] = {
    "min_similarity": Bounds(-1.0, 1.0),
    "min_pace_ratio": Bounds(0.0, 100.0, above=True),
    "max_pace_ratio": Bounds(0.0, 100.0, above=True),
    "max_repetition": Bounds(0.0, 1.0),
    "max_silence_ratio": Bounds(0.0, 1.0),
    "max_pause_s": Bounds(0.0, 3600.0, above=True),
    "max_clipping_ratio": Bounds(0.0, 1.0),
    "max_flatness": Bounds(0.0, 1.0),
    "max_error_rate": Bounds(0.0, 100.0),
}
THRESHOLD_NAMES = tuple(field.name for field in dataclasses.fields(QualityThresholds))


def check_overrides(values: Mapping[str, Any] | None) -> dict[str, float]:
    """`values` as checked thresholds (numbers, known names, within THRESHOLD_BOUNDS); InputError naming
    the first wrong one otherwise. None or empty: no overrides."""
    if values is None:
        return {}
    if not isinstance(values, Mapping):
        raise InputError(
            'thresholds must map names to numbers, e.g. {"min_similarity": 0.6}, '
            f"got {type(values).__name__}"
        )
    checked: dict[str, float] = {}
    for name, value in values.items():
        if name not in THRESHOLD_BOUNDS:
            raise InputError(f"unknown quality threshold {name!r}: use {', '.join(THRESHOLD_NAMES)}")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InputError(f"quality threshold {name} must be a number, got {value!r}")
        bounds = THRESHOLD_BOUNDS[name]
        if not math.isfinite(value) or not bounds.holds(float(value)):
            raise InputError(f"quality threshold {name} {value!r} is out of range: use {bounds.describe()}")
        checked[name] = float(value)
    return checked


def apply_overrides(thresholds: QualityThresholds, values: Mapping[str, Any] | None) -> QualityThresholds:
    """The server's `thresholds` with a request's own `values` over them (checked; the pace range must
    stay a range)."""
    checked = check_overrides(values)
    if not checked:
        return thresholds
    merged = dataclasses.replace(thresholds, **checked)
    if merged.min_pace_ratio > merged.max_pace_ratio:
        raise InputError(
            f"quality thresholds: min_pace_ratio {merged.min_pace_ratio:g} is above "
            f"max_pace_ratio {merged.max_pace_ratio:g}"
        )
    return merged


def checked_against(thresholds: QualityThresholds, values: Mapping[str, Any] | None) -> dict[str, float]:
    """`check_overrides`, and the pace range they leave once over the server's `thresholds` (InputError):
    what a job or batch is refused for at submit, not failed for once it runs."""
    apply_overrides(thresholds, values)
    return check_overrides(values)
