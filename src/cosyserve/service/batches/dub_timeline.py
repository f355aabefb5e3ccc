"""Where dubbed speech goes: each cue's audio at its start time in one track, and what had to give.

A cue's speech is trimmed of the near-silence around it (so its first audible sample lands on the cue's
start), then placed at that start. Speech longer than its cue was already sped up by the model within a
limit (`fit_speed`); whatever is still too long runs into the gap after the cue (`overflow_s`, counted
only for what is played) but never over the next cue: it is cut there with a short fade (`cut_s`, never
played). The track ends at the last cue's end (`dub_plan.planned_track_seconds`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

FRAME_S = 0.002  # the energy of the audio is measured in frames this long
AUDIBLE_LEVEL = 0.1  # a frame is audible from 10% (-20 dB) of the clip's RMS on
PRE_ROLL_S = 0.002  # kept before the first audible frame
TAIL_S = 0.02  # kept after the last audible frame
MAX_TRIM_S = 0.5  # at most this much is trimmed at either end (speech pauses stay)
FADE_S = 0.01  # the fade-out where an over-long cue is cut before the next one
FIT_MARGIN = 1.01  # ask for slightly more speed than measured: frame rounding must not push it over


@dataclass(frozen=True)
class Placement:
    """Where one cue's speech went in the track, as the report shows it."""

    start_s: float  # the cue's start: where its speech begins
    end_s: float  # the cue's planned end
    speech_s: float  # how long the speech made for it is (trimmed, at the speed used)
    played_s: float  # how much of it plays in the track: speech_s less cut_s
    overflow_s: float  # how far what plays runs past the cue's end (into the gap after it)
    cut_s: float  # cut so as not to run over the next cue (or past the track's end): never played

    @property
    def actual_end_s(self) -> float:
        return self.start_s + self.played_s


def placement(speech_s: float, start_s: float, end_s: float, limit_s: float) -> Placement:
    """Where speech of `speech_s` placed at `start_s` goes when it must stop by `limit_s` (in seconds;
    `place` applies the same rule to samples)."""
    played = max(0.0, min(speech_s, limit_s - start_s))
    return Placement(
        start_s=start_s,
        end_s=end_s,
        speech_s=round(speech_s, 3),
        played_s=round(played, 3),
        overflow_s=round(max(0.0, start_s + played - end_s), 3),
        cut_s=round(speech_s - played, 3),
    )


def audible_span(audio: np.ndarray, rate: int) -> tuple[int, int]:
    """[first, last) sample of `audio` worth keeping: from just before its first audible frame to just
    after its last, trimming at most MAX_TRIM_S each side; (0, 0) for silence."""
    frame = max(1, int(FRAME_S * rate))
    count = len(audio) // frame
    if count == 0:
        return 0, len(audio)
    frames = audio[: count * frame].astype(np.float64).reshape(count, frame)
    energy = np.sqrt(np.mean(frames**2, axis=1))
    level = math.sqrt(float(np.mean(audio.astype(np.float64) ** 2)))
    if level <= 1e-6:
        return 0, 0
    audible = np.flatnonzero(energy >= AUDIBLE_LEVEL * level)
    max_trim = int(MAX_TRIM_S * rate)
    first = min(max(0, int(audible[0]) * frame - int(PRE_ROLL_S * rate)), max_trim)
    last = max(min(len(audio), (int(audible[-1]) + 1) * frame + int(TAIL_S * rate)), len(audio) - max_trim)
    return first, max(first, last)


def trim(audio: np.ndarray, rate: int) -> np.ndarray:
    first, last = audible_span(audio, rate)
    return audio[first:last]


def fit_speed(duration_s: float, slot_s: float, speed: float, max_speed: float) -> float:
    """The speed at which speech that lasts `duration_s` at `speed` fits `slot_s`, at most `max_speed`
    (and never slower than `speed`)."""
    if duration_s <= slot_s or slot_s <= 0:
        return speed
    return max(speed, min(max_speed, speed * duration_s / slot_s * FIT_MARGIN))


def place(
    audio: np.ndarray, rate: int, start_s: float, end_s: float, limit_s: float
) -> tuple[int, np.ndarray, Placement]:
    """(first sample, samples to write, placement) of one cue's speech that starts at `start_s`, is
    planned to end at `end_s` and must stop by `limit_s` (the next cue's start, or the track's end)."""
    start = round(start_s * rate)
    room = max(0, round(limit_s * rate) - start)
    clip = audio[:room]
    if len(audio) > room:
        fade = min(len(clip), int(FADE_S * rate))
        if fade:
            clip = clip.copy()
            clip[-fade:] *= np.linspace(1.0, 0.0, fade, dtype=np.float32)
    played = len(clip) / rate
    placed = Placement(
        start_s=start / rate,
        end_s=end_s,
        speech_s=round(len(audio) / rate, 3),
        played_s=round(played, 3),
        overflow_s=round(max(0.0, start / rate + played - end_s), 3),
        cut_s=round((len(audio) - len(clip)) / rate, 3),
    )
    return start, clip, placed
