"""The `[quality]` settings group: how many takes a synthesis may make and where each check fails
(`COSYSERVE_QUALITY_TAKES`, `--quality-min-similarity`, …). docs/quality.md: how the defaults were chosen."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from cosyserve.service.quality.scores import QualityThresholds
from cosyserve.service.quality.takes import MAX_TAKES, TakePolicy

_DEFAULTS = QualityThresholds()


class QualitySettings(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)

    checks: bool = Field(
        True, description="score every take (speaker similarity, pace, repetition, silence, …)"
    )
    takes: int = Field(
        1,
        ge=1,
        le=MAX_TAKES,
        description="takes a synthesis may make: a take failing a check is made again with the next seed "
        "(1: scored, never made again; a request's `takes` wins)",
    )
    asr: bool = Field(
        False,
        description="also transcribe every take with the prompt ASR (engine.asr_model) and check its WER",
    )
    min_similarity: float = Field(_DEFAULTS.min_similarity, description="lowest speaker similarity (cosine)")
    min_pace_ratio: float = Field(_DEFAULTS.min_pace_ratio, description="shortest pace against the voice's")
    max_pace_ratio: float = Field(_DEFAULTS.max_pace_ratio, description="longest pace against the voice's")
    max_repetition: float = Field(
        _DEFAULTS.max_repetition, description="largest share of repeated token 5-grams"
    )
    max_silence_ratio: float = Field(_DEFAULTS.max_silence_ratio, description="largest share of silence")
    max_pause_s: float = Field(_DEFAULTS.max_pause_s, description="longest pause inside the speech, seconds")
    max_clipping_ratio: float = Field(
        _DEFAULTS.max_clipping_ratio, description="largest share of clipped samples"
    )
    max_flatness: float = Field(_DEFAULTS.max_flatness, description="largest spectral flatness (noise-like)")
    max_error_rate: float = Field(
        _DEFAULTS.max_error_rate, description="largest WER/CER of the ASR transcript"
    )

    def policy(self) -> TakePolicy:
        limits = {name: getattr(self, name) for name in QualityThresholds.__dataclass_fields__}
        return TakePolicy(takes=self.takes, thresholds=QualityThresholds(**limits), enabled=self.checks)
