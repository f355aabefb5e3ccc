"""A dub as planned at submit, before anything is synthesised: where each cue goes, how long the track
will be, whether that is within the limit, and how the track's length is charged.

The track runs from 0 to the latest cue's end, whatever the cues' speech turns out to be: that length is
the audio the caller receives, so it is what a dub sets aside from its key's quota at submit and what it
is charged in the end (`planned_track_seconds`). The charge is paid as the dub goes: each cue, once made,
pays its share of the track (`share_s`: from its start to the next cue's start, the first from 0, the
last to the track's end), and storing the track pays what is left (the shares of cues that failed). A dub
stopped by the quota ends its track where the first cue it did not make starts: it pays what it delivers.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from cosyserve.errors import InputError

TRACK_LIMIT_SETTING = "max_dub_track_s (--max-dub-track-s, COSYSERVE_MAX_DUB_TRACK_S)"


class Timed(Protocol):
    """Anything with a start and an end in seconds (a subtitle `Cue`, a `CueSlot`)."""

    @property
    def start_s(self) -> float: ...

    @property
    def end_s(self) -> float: ...


@dataclass(frozen=True)
class CueSlot:
    """Where a cue goes: its start and planned end, and where it must stop (the next cue's start)."""

    start_s: float
    end_s: float
    limit_s: float

    @classmethod
    def of(cls, params: Mapping[str, Any]) -> CueSlot:
        """The slot a dub's item carries in its parameters (`inputs.cue_items`)."""
        return cls(float(params["start_s"]), float(params["end_s"]), float(params["limit_s"]))

    @property
    def slot_s(self) -> float:
        return self.end_s - self.start_s


def planned_track_seconds(cues: Iterable[Timed]) -> float:
    """The track's length in seconds (to the millisecond): to the latest cue's end. Every cue counts, one
    that fails too: the track keeps its silence."""
    return round(max((float(cue.end_s) for cue in cues), default=0.0), 3)


def track_seconds_of_items(params: Iterable[Mapping[str, Any]]) -> float:
    """`planned_track_seconds` of a dub's items, from their parameters."""
    return planned_track_seconds(CueSlot.of(p) for p in params)


def check_track_length(cues: Sequence[Timed], max_track_s: float | None) -> float:
    """The planned track's length; InputError naming the limit and its setting when it is longer."""
    track_s = planned_track_seconds(cues)
    if max_track_s is not None and track_s > max_track_s:
        raise InputError(
            f"the dub's track would be {clock(track_s)} long (it runs to the end of the last cue), longer "
            f"than the limit of {clock(max_track_s)} ({TRACK_LIMIT_SETTING} = {max_track_s:g} s): split "
            "the subtitle file, or have the limit raised"
        )
    return track_s


def charge_shares(cues: Sequence[Timed]) -> list[float]:
    """Each cue's share of the track (cues in time order): from its start to the next cue's start, the
    first from 0 and the last to the track's end, so the shares add up to the track's length."""
    if not cues:
        return []
    bounds = [0.0] + [round(float(cue.start_s), 3) for cue in cues[1:]] + [planned_track_seconds(cues)]
    return [round(max(0.0, after - before), 3) for before, after in itertools.pairwise(bounds)]


def clock(seconds: float) -> str:
    """H:MM:SS(.mmm) for messages."""
    millis = round(seconds * 1000)
    text = f"{millis // 3_600_000}:{millis // 60_000 % 60:02d}:{millis // 1000 % 60:02d}"
    return text + (f".{millis % 1000:03d}" if millis % 1000 else "")
