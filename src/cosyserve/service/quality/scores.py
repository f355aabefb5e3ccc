"""What one take is judged on: the thresholds (`QualityThresholds`) and the scores (`TakeScores`).

A take fails a check when its score is outside the threshold; `TakeScores.failed` names the checks it
failed, in the order of CHECKS. A score that could not be measured (no prompt embedding, too little text
to judge the pace, no ASR) is None and fails nothing. docs/quality.md says how each threshold was chosen.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

# Every check, in the order reports list them.
CHECKS = ("similarity", "duration", "repetition", "silence", "pause", "clipping", "noise", "intelligibility")


@dataclass(frozen=True)
class QualityThresholds:
    """Where a take stops being acceptable. Each field is one check's limit."""

    min_similarity: float = 0.5  # cosine of CAM++ embeddings, prompt vs output (same speaker ~0.6-0.8)
    min_pace_ratio: float = 0.5  # seconds per syllable / expected: below = truncated or rushed
    max_pace_ratio: float = 2.0  # above = babbling, repetition or drawn out
    max_repetition: float = 0.3  # share of the LM's speech-token 5-grams that repeat an earlier one
    max_silence_ratio: float = 0.5  # share of 20 ms frames that are silent, lead and tail excluded
    max_pause_s: float = 2.0  # longest silence inside the speech
    max_clipping_ratio: float = 0.001  # share of samples at full scale
    max_flatness: float = 0.01  # median spectral flatness of voiced frames: speech ~0.001, noise > 0.01
    max_error_rate: float = 0.5  # word (or character, for Chinese/Japanese) error rate of the ASR transcript

    def with_overrides(self, **values: float | None) -> QualityThresholds:
        """A copy with the given fields replaced (None: kept)."""
        given = {name: value for name, value in values.items() if value is not None}
        unknown = set(given) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"unknown quality thresholds: {', '.join(sorted(unknown))}")
        return dataclasses.replace(self, **given)


@dataclass(frozen=True)
class TakeScores:
    """The scores of one take; `failed` holds the names (from CHECKS) of the checks it failed."""

    similarity: float | None = None  # cosine in [-1, 1]; None: no prompt embedding to compare with
    seconds_per_unit: float | None = None  # speech seconds per syllable (CJK character, kana, Latin syllable)
    pace_ratio: float | None = None  # seconds_per_unit / the voice's (or the language's) own
    repetition: float = 0.0  # share of speech-token 5-grams repeating an earlier one, in [0, 1]
    silence_ratio: float = 0.0  # in [0, 1]
    longest_pause_s: float = 0.0
    clipping_ratio: float = 0.0  # in [0, 1]
    flatness: float = 0.0  # median spectral flatness of the voiced frames, in [0, 1]
    error_rate: float | None = None  # WER/CER of an ASR transcript against the text; None: no ASR
    transcript: str | None = None  # what the ASR heard
    failed: tuple[str, ...] = ()
    scoring_s: float = 0.0  # how long scoring took

    @property
    def passed(self) -> bool:
        return not self.failed

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: every score rounded, plus `passed` and `failed`."""
        out: dict[str, Any] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            out[field.name] = round(value, 4) if isinstance(value, float) else value
        out["failed"] = list(self.failed)
        out["passed"] = self.passed
        return out


def failed_checks(scores: TakeScores, limits: QualityThresholds) -> tuple[str, ...]:
    """The checks `scores` fail under `limits`, in CHECKS order."""
    failing = {
        "similarity": scores.similarity is not None and scores.similarity < limits.min_similarity,
        "duration": scores.pace_ratio is not None
        and not (limits.min_pace_ratio <= scores.pace_ratio <= limits.max_pace_ratio),
        "repetition": scores.repetition > limits.max_repetition,
        "silence": scores.silence_ratio > limits.max_silence_ratio,
        "pause": scores.longest_pause_s > limits.max_pause_s,
        "clipping": scores.clipping_ratio > limits.max_clipping_ratio,
        "noise": scores.flatness > limits.max_flatness,
        "intelligibility": scores.error_rate is not None and scores.error_rate > limits.max_error_rate,
    }
    return tuple(name for name in CHECKS if failing[name])
