"""Dubbing with the model: one cue's speech made to fit its slot (the track is written by `dub_track`).

A cue is synthesised at its speed; if its speech (trimmed of near-silence, `dub_timeline.trim`) is longer
than the cue, it is synthesised again with the same seed — the same speech tokens — at the speed that
fits, through the model's own speed control (the flow's mel is resampled before the vocoder), up to the
dub's limit. What still does not fit is reported and placed by `dub_timeline.place`.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from dataclasses import dataclass

from cosyserve.service.batches.dub_plan import CueSlot  # noqa: F401  (re-exported: where a cue goes)
from cosyserve.service.batches.dub_timeline import audible_span, fit_speed
from cosyserve.service.local.synthesizer import Synthesizer
from cosyserve.service.local.voice_pins import PinnedVoice
from cosyserve.service.outcomes import SentenceTiming, SynthesisResult
from cosyserve.service.requests import EVERY_VOICE, SynthesisRequest, VoiceScope

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
