"""Scoring one take: every measurement of `TakeScores` from the audio, the text and the LM's tokens.

scorer = TakeScorer(speaker_encoder, thresholds)
scores = scorer.score(TakeInput(audio, 24000, text, token_segments, prompt_embedding, voice_rate))
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from cosyserve.frontend.onnx_models import SpeakerEncoder
from cosyserve.service.quality.error_rate import error_rate
from cosyserve.service.quality.pace import pace
from cosyserve.service.quality.repetition import repetition_ratio
from cosyserve.service.quality.scores import QualityThresholds, TakeScores, failed_checks
from cosyserve.service.quality.signal_checks import clipping_ratio, silence_profile, spectral_flatness
from cosyserve.service.quality.similarity import cosine, speaker_embedding

log = logging.getLogger(__name__)
# (S,) float32 audio, its rate -> what was said (an ASR); raising means "no transcript".
Transcriber = Callable[[np.ndarray, int], str]


@dataclass(frozen=True, eq=False)
class TakeInput:
    """What one take is judged on."""

    audio: np.ndarray  # (S,) float32 in [-1, 1]
    sample_rate: int
    text: str  # what it should say (as the request wrote it)
    speech_tokens: Sequence[Sequence[int]] = ()  # the LM's tokens, one list per segment
    prompt_embedding: torch.Tensor | None = None  # (1, 192) of the voice's prompt
    voice_seconds_per_unit: float | None = None  # the voice's own pace (`pace.voice_seconds_per_unit`)
    speed: float = 1.0  # the speed asked for (a faster take is expected to be shorter)


class TakeScorer:
    """Scores takes against thresholds; `transcriber` adds the intelligibility check when given."""

    def __init__(
        self,
        speaker_encoder: SpeakerEncoder | None,
        thresholds: QualityThresholds | None = None,
        transcriber: Transcriber | None = None,
    ) -> None:
        self.speaker_encoder = speaker_encoder
        self.thresholds = thresholds or QualityThresholds()
        self.transcriber = transcriber

    def score(self, take: TakeInput, thresholds: QualityThresholds | None = None) -> TakeScores:
        started = time.perf_counter()
        audio = np.asarray(take.audio, np.float32)
        silence = silence_profile(audio, take.sample_rate)
        per_unit, ratio = pace(silence.voiced_s, take.text, take.speed, take.voice_seconds_per_unit)
        transcript, rate = self._intelligibility(audio, take)
        scores = TakeScores(
            similarity=self._similarity(audio, take),
            seconds_per_unit=per_unit,
            pace_ratio=ratio,
            repetition=repetition_ratio(take.speech_tokens),
            silence_ratio=silence.ratio,
            longest_pause_s=silence.longest_pause_s,
            clipping_ratio=clipping_ratio(audio),
            flatness=spectral_flatness(audio, take.sample_rate),
            error_rate=rate,
            transcript=transcript,
        )
        failed = failed_checks(scores, thresholds or self.thresholds)
        return dataclasses.replace(scores, failed=failed, scoring_s=time.perf_counter() - started)

    def _similarity(self, audio: np.ndarray, take: TakeInput) -> float | None:
        if self.speaker_encoder is None or take.prompt_embedding is None:
            return None
        embedding = speaker_embedding(self.speaker_encoder, audio, take.sample_rate)
        return None if embedding is None else cosine(take.prompt_embedding, embedding)

    def _intelligibility(self, audio: np.ndarray, take: TakeInput) -> tuple[str | None, float | None]:
        if self.transcriber is None or len(audio) == 0:
            return None, None
        try:
            transcript = self.transcriber(audio, take.sample_rate)
        except Exception as exc:  # an ASR that fails costs the check, never the synthesis
            log.warning("the quality check's transcription failed: %s", exc)
            return None, None
        return transcript, error_rate(take.text, transcript)
