"""The take scores as Prometheus series (`cosyserve_take_*`), made by the service's `Series`."""

from __future__ import annotations

from cosyserve.service.metric_series import Series
from cosyserve.service.quality.scores import CHECKS
from cosyserve.service.quality.takes import MAX_TAKES, TakeReport

_SIMILARITY_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
_PACE_BUCKETS = (0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 4.0)
_SCORING_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class TakeMetrics:
    """Histograms of the kept takes' similarity and pace, how many takes were made, the scoring time, and
    a count of kept takes failing each check (every take of that synthesis failed)."""

    def __init__(self, series: Series) -> None:
        similarity, pace = "speaker similarity of kept takes", "pace of kept takes against the voice's"
        self.similarity = series.histogram("cosyserve_take_similarity", similarity, _SIMILARITY_BUCKETS)
        self.pace_ratio = series.histogram("cosyserve_take_pace_ratio", pace, _PACE_BUCKETS)
        takes = tuple(range(1, MAX_TAKES + 1))
        self.takes = series.histogram("cosyserve_takes", "takes made per synthesis", takes)
        self.scoring_seconds = series.histogram(
            "cosyserve_take_scoring_seconds", "time scoring a kept take", _SCORING_BUCKETS
        )
        self.failed = series.counter(
            "cosyserve_take_failed_checks", "kept takes failing a check, by check", ["check"]
        )
        for check in CHECKS:
            self.failed.labels(check=check)  # every series exists from the start (rate() over zeros)

    def observe(self, report: TakeReport | None) -> None:
        if report is None:
            return
        scores = report.scores
        self.takes.observe(report.takes)
        self.scoring_seconds.observe(scores.scoring_s)
        if scores.similarity is not None:
            self.similarity.observe(scores.similarity)
        if scores.pace_ratio is not None:
            self.pace_ratio.observe(scores.pace_ratio)
        for check in scores.failed:
            self.failed.labels(check=check).inc()
