"""How many seconds of audio a request will make, before it is made: what its quota reservation holds.

A text's length in speech is estimated per character of its spoken form (numbers, amounts, units and
dates read out as words, as the engine will read them: "1234567890123" is 13 characters but 13 s of
speech) — a CJK character is about a syllable, other letters about 14 a second — scaled by the voice's
own pace where known: its enrolled recording's speech length against its transcript's estimate.
Reservations are given back when the real length is known, so the estimate leans long: a margin plus the
pauses around each request.
"""

from __future__ import annotations

import unicodedata
from typing import Any

CJK_SECONDS_PER_CHAR = 0.25  # a Chinese/Japanese/Korean character: about a syllable
OTHER_SECONDS_PER_CHAR = 0.07  # a letter or digit of other scripts: about 14 per second of speech
MARGIN = 1.2  # speech runs longer than the estimate as often as shorter; over-holding is given back
PAUSE_S = 0.5  # silence and breath around one synthesis
VOICE_PACE_RANGE = (0.5, 2.0)  # a voice's pace outside this is a transcript that does not match
MIN_TRANSCRIPT_S = 1.0  # shorter transcripts say too little about a voice's pace


def spoken_form(text: str) -> str:
    """`text` as the engine reads it out (`frontend.text.normalize`); the text itself if that fails: an
    estimate never stops a request."""
    try:
        from cosyserve.frontend.text.normalize import normalize_text

        return normalize_text(text)
    except Exception:  # the estimate only sizes a reservation
        return text


def estimate_audio_s(text: str) -> float:
    """Roughly how many seconds of speech `text` makes at an average pace (no margin)."""
    seconds = 0.0
    for char in spoken_form(text):
        if unicodedata.east_asian_width(char) in ("W", "F") and char.isalnum():
            seconds += CJK_SECONDS_PER_CHAR
        elif char.isalnum():
            seconds += OTHER_SECONDS_PER_CHAR
    return round(seconds, 1)


def voice_pace(transcript: str | None, report: dict[str, Any] | None) -> float | None:
    """How much slower (> 1) or faster (< 1) than average a voice speaks: its recording's speech length
    against its transcript's estimate; None when unknown (no transcript, no report, or too short)."""
    if not transcript or not report:
        return None
    spoken = report.get("speech_s") or report.get("duration_s")
    expected = estimate_audio_s(transcript)
    if not spoken or expected < MIN_TRANSCRIPT_S:
        return None
    low, high = VOICE_PACE_RANGE
    return min(high, max(low, float(spoken) / expected))


def request_estimate_s(text: str, speed: float | None = None, pace: float | None = None) -> float:
    """The seconds one synthesis of `text` is expected to make at `speed` in a voice of `pace`: what its
    reservation holds."""
    seconds = estimate_audio_s(text) * (pace or 1.0) * MARGIN + PAUSE_S
    return round(seconds / (speed if speed and speed > 0 else 1.0), 2)
