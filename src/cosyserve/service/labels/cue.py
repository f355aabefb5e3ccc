"""The explicit label: the rhythm cue short-long-short-short (Morse "AI", ·- ··) that GB 45438-2025
gives for audio, as tones a listener notices, placed at the start (and optionally the end) of an output.

Timing: a short tone is 80 ms, a long one 240 ms, with 80 ms between tones, and 150 ms of silence between
the cue and the speech; each tone fades in and out over 5 ms so it does not click. About 0.87 s in all.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from cosyserve.service.outcomes import SentenceTiming, SynthesisResult

EXPLICIT_MODES = ("off", "start", "start_and_end")
TONE_HZ = 880.0
LEVEL = 0.3  # about -10 dBFS: clearly heard, below typical speech peaks
SHORT_S, LONG_S, GAP_S, PAUSE_S, FADE_S = 0.08, 0.24, 0.08, 0.15, 0.005
PATTERN = (SHORT_S, LONG_S, SHORT_S, SHORT_S)


def cue_samples(sample_rate: int) -> np.ndarray:
    """The cue followed by the pause before speech, (S,) float32 at `sample_rate`."""
    pieces = []
    fade = max(1, round(FADE_S * sample_rate))
    for n, seconds in enumerate(PATTERN):
        count = round(seconds * sample_rate)
        t = np.arange(count, dtype=np.float64) / sample_rate
        tone = LEVEL * np.sin(2 * np.pi * TONE_HZ * t)
        ramp = np.minimum(1.0, np.minimum(np.arange(count) + 1, count - np.arange(count)) / fade)
        pieces.append(tone * ramp)
        gap = GAP_S if n < len(PATTERN) - 1 else PAUSE_S
        pieces.append(np.zeros(round(gap * sample_rate)))
    return np.concatenate(pieces).astype(np.float32)


def cue_seconds(sample_rate: int) -> float:
    return len(cue_samples(sample_rate)) / sample_rate


@dataclass(frozen=True)
class ExplicitLabel:
    """What one output gets: `start` before the speech (ending in the pause), `end` after it (starting
    with the pause; None unless start_and_end), at the synthesizer's rate."""

    start: np.ndarray
    end: np.ndarray | None = None


def tones(mode: str, sample_rate: int) -> ExplicitLabel:
    """The cue as an explicit label for `mode` (start or start_and_end)."""
    return ExplicitLabel(cue_samples(sample_rate), end_cue(sample_rate) if mode == "start_and_end" else None)


def with_label(result: SynthesisResult, label: ExplicitLabel | None) -> SynthesisResult:
    """`result` with `label` around its audio (None: unchanged), sentence timings shifted by the start's
    length so subtitles stay on the speech."""
    if label is None:
        return result
    rate = result.sample_rate
    parts = [label.start, np.asarray(result.audio, dtype=np.float32)]
    if label.end is not None:
        parts.append(label.end)
    shift = len(label.start) / rate
    timings = [
        SentenceTiming(t.index, t.text, round(t.start_s + shift, 3), round(t.end_s + shift, 3))
        for t in result.timings
    ]
    return dataclasses.replace(result, audio=np.concatenate(parts), timings=timings)


def end_cue(sample_rate: int) -> np.ndarray:
    """What start_and_end appends after the speech: a pause, then the cue."""
    return np.concatenate(
        [np.zeros(round(PAUSE_S * sample_rate), dtype=np.float32), cue_samples(sample_rate)]
    )
