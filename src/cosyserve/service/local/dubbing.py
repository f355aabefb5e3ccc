"""Dubbing with the model: one cue's speech made to fit its slot, and the cues assembled into one track.

A cue is synthesised at its speed; if its speech (trimmed of near-silence, `dub_timeline.trim`) is longer
than the cue, it is synthesised again with the same seed — the same speech tokens — at the speed that
fits, through the model's own speed control (the flow's mel is resampled before the vocoder), up to the
dub's limit. What still does not fit is reported and placed by `dub_timeline.place`.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from cosyserve.service.dub_timeline import Placement, audible_span, empty_track, fit_speed, place
from cosyserve.service.local.synthesizer import Synthesizer
from cosyserve.service.local.voice_pins import PinnedVoice
from cosyserve.service.requests import (
    EVERY_VOICE,
    SentenceTiming,
    SynthesisRequest,
    SynthesisResult,
    VoiceScope,
)

CancelFactory = Callable[[], threading.Event]  # a fresh cancel event (with its own clock) per synthesis


@dataclass(frozen=True)
class CueAudio:
    """A cue's speech as it will be placed, and how it was made to fit."""

    result: SynthesisResult  # trimmed audio, timings shifted to match
    speed: float  # the speed it was synthesised at
    natural_s: float  # its length at the requested speed (trimmed)


def synthesize_cue(
    synth: Synthesizer,
    request: SynthesisRequest,
    slot_s: float,
    max_speed: float,
    cancel: CancelFactory,
    voices: VoiceScope = EVERY_VOICE,
    pinned: PinnedVoice | None = None,
) -> CueAudio:
    """The cue's speech at `request.speed` (default 1), sped up to fit `slot_s` if needed and allowed; a
    saved voice outside `voices` is not found."""
    base = request.speed or 1.0
    at_base = dataclasses.replace(request, speed=base)
    first = _trimmed(synth.synthesize(at_base, cancel=cancel(), voices=voices, pinned=pinned).result())
    natural = first.duration_s
    speed = fit_speed(natural, slot_s, base, max(base, max_speed))
    if speed <= base:
        return CueAudio(first, base, natural)
    again = dataclasses.replace(request, speed=round(speed, 4), seed=first.seed)
    faster = _trimmed(synth.synthesize(again, cancel=cancel(), voices=voices, pinned=pinned).result())
    if faster.duration_s >= natural:  # pragma: no cover - speeding up always shortens the mel
        return CueAudio(first, base, natural)
    return CueAudio(faster, round(speed, 4), natural)


def _trimmed(result: SynthesisResult) -> SynthesisResult:
    first, last = audible_span(result.audio, result.sample_rate)
    offset = first / result.sample_rate
    end = (last - first) / result.sample_rate
    timings = [
        SentenceTiming(t.index, t.text, max(0.0, t.start_s - offset), min(end, max(0.0, t.end_s - offset)))
        for t in result.timings
    ]
    return dataclasses.replace(result, audio=result.audio[first:last], timings=timings)


@dataclass(frozen=True)
class CueSlot:
    """Where a cue goes: its start and planned end, and where it must stop (the next cue's start)."""

    start_s: float
    end_s: float
    limit_s: float

    @classmethod
    def of(cls, params: dict[str, Any]) -> CueSlot:
        return cls(float(params["start_s"]), float(params["end_s"]), float(params["limit_s"]))

    @property
    def slot_s(self) -> float:
        return self.end_s - self.start_s


def assemble(
    cues: Iterable[tuple[CueSlot, np.ndarray | None]], last_end_s: float, rate: int
) -> tuple[np.ndarray, list[Placement | None]]:
    """One track as long as the last cue's end with every cue's audio at its start (None: a cue without
    audio, left silent); returns the track and each cue's placement."""
    track = empty_track(last_end_s, rate)
    placements: list[Placement | None] = []
    for slot, audio in cues:
        if audio is None:
            placements.append(None)
            continue
        start, clip, placement = place(audio, rate, slot.start_s, slot.end_s, min(slot.limit_s, last_end_s))
        clip = clip[: max(0, len(track) - start)]
        track[start : start + len(clip)] = clip
        placements.append(placement)
    return track, placements
