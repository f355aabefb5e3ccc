"""Measurements of the output waveform itself: silence, the longest pause inside the speech, clipping,
and how noise-like the voiced part is (spectral flatness).

Frames are 20 ms; a frame is silent when its RMS is below SILENCE_DB under the loud frames' level (the 95th
percentile), or below an absolute floor, so a quiet voice is judged against itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FRAME_S = 0.02
SILENCE_DB = 35.0  # below the loud frames' level
SILENCE_FLOOR = 10 ** (-60 / 20)  # -60 dBFS: silent whatever the level
FULL_SCALE = 0.999  # a sample at or above this magnitude counts as clipped
FLATNESS_FRAME_S = 0.032  # 32 ms windows, half overlapping


@dataclass(frozen=True)
class SilenceProfile:
    """Silence in one take: `ratio` of the frames between the first and last voiced frame, the longest
    silent run there, and the voiced seconds (what the pace is measured on)."""

    ratio: float
    longest_pause_s: float
    voiced_s: float


def frame_rms(audio: np.ndarray, sample_rate: int) -> np.ndarray:
    """(S,) -> (F,) RMS of consecutive 20 ms frames (a last partial frame dropped)."""
    size = max(1, int(sample_rate * FRAME_S))
    count = len(audio) // size
    frames = np.asarray(audio[: count * size], np.float64).reshape(count, size)
    return np.sqrt(np.mean(frames**2, axis=1)) if count else np.zeros(0)


def silence_profile(audio: np.ndarray, sample_rate: int) -> SilenceProfile:
    """Silence of a (S,) float waveform; leading and trailing silence do not count (the model pads)."""
    rms = frame_rms(audio, sample_rate)
    if rms.size == 0:
        return SilenceProfile(0.0, 0.0, 0.0)
    level = float(np.percentile(rms, 95))
    threshold = max(SILENCE_FLOOR, level * 10 ** (-SILENCE_DB / 20))
    voiced = rms >= threshold
    where = np.flatnonzero(voiced)
    if where.size == 0:
        return SilenceProfile(1.0, 0.0, 0.0)
    inner = voiced[where[0] : where[-1] + 1]
    silent = ~inner
    longest = _longest_run(silent)
    return SilenceProfile(
        ratio=float(silent.mean()),
        longest_pause_s=longest * FRAME_S,
        voiced_s=float(inner.sum()) * FRAME_S,
    )


def clipping_ratio(audio: np.ndarray) -> float:
    """Share of samples at full scale (|x| >= 0.999)."""
    if len(audio) == 0:
        return 0.0
    return float(np.mean(np.abs(audio) >= FULL_SCALE))


def spectral_flatness(audio: np.ndarray, sample_rate: int) -> float:
    """Median spectral flatness (geometric over arithmetic mean of the power spectrum, in [0, 1]) of the
    voiced 32 ms frames: ~0.001 for speech (harmonics stand out), ~0.56 for white noise. 0.0 when silent."""
    size = int(FLATNESS_FRAME_S * sample_rate)
    if len(audio) < size:
        return 0.0
    frames = np.lib.stride_tricks.sliding_window_view(np.asarray(audio, np.float64), size)[:: size // 2]
    rms = np.sqrt(np.mean(frames**2, axis=1))
    level = float(np.percentile(rms, 95))
    voiced = rms >= max(SILENCE_FLOOR, level * 10 ** (-SILENCE_DB / 20))
    if not voiced.any():
        return 0.0
    power = np.abs(np.fft.rfft(frames[voiced] * np.hanning(size), axis=1)) ** 2 + 1e-12
    flatness = np.exp(np.mean(np.log(power), axis=1)) / np.mean(power, axis=1)
    return float(np.median(flatness))


def _longest_run(flags: np.ndarray) -> int:
    longest = current = 0
    for flag in flags:
        current = current + 1 if flag else 0
        longest = max(longest, current)
    return longest
