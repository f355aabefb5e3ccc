"""Every take checked: scores of one synthesis (speaker similarity, pace, repetition, silence, clipping,
optionally intelligibility) and the retake policy that makes a failing take again with the next seed.

Scores are pure measurements (`scorer`, over `signal_checks`, `pace`, `repetition`, `similarity`,
`error_rate`); `takes` chooses among takes; `settings` holds the `[quality]` group. docs/quality.md.
This package's root imports only the light parts (settings read it); the scorer is `quality.scorer`.
"""

from cosyserve.service.quality.scores import CHECKS, QualityThresholds, TakeScores
from cosyserve.service.quality.takes import (
    MAX_TAKES,
    TAKE_HEADERS,
    TakePolicy,
    TakeReport,
    best_take,
    take_seed,
)

__all__ = [
    "CHECKS",
    "MAX_TAKES",
    "TAKE_HEADERS",
    "QualityThresholds",
    "TakePolicy",
    "TakeReport",
    "TakeScores",
    "best_take",
    "take_seed",
]
