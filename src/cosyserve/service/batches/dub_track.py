"""A dub's track written to a WAV file front to back, so that memory does not depend on its length.

The cues are taken in time order and each cue's audio is loaded only when its turn comes; the silence
before it is written in blocks of `SILENCE_BLOCK` samples from one buffer of zeros, then its clip
(`dub_timeline.place`: cut at the next cue's start, so clips never overlap). Memory holds one cue's audio
and one block, whether the track lasts a minute or ten hours; the WAV is 16-bit PCM, converted by
libsndfile as every stored output is (`audio_formats.encode`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType

import numpy as np
import soundfile as sf

from cosyserve.service.batches.dub_plan import CueSlot
from cosyserve.service.batches.dub_timeline import Placement, place

SILENCE_BLOCK = 1 << 16  # samples of silence written at once (128 KiB)
_SILENCE = np.zeros(SILENCE_BLOCK, dtype=np.int16)  # int16: written as is, no float conversion per sample

LoadCue = Callable[[], np.ndarray | None]  # loads one cue's audio when its turn comes (None: left silent)


class TrackWriter:
    """A mono 16-bit WAV of exactly `total_samples`, written front to back: `write(start, clip)` in order
    of `start`, then `close()` pads the rest with silence. Use it as a context manager."""

    def __init__(self, path: Path | str, rate: int, total_samples: int) -> None:
        self.rate = rate
        self.total_samples = max(0, int(total_samples))
        self.position = 0  # samples written so far
        self._sound = sf.SoundFile(path, "w", samplerate=rate, channels=1, format="WAV", subtype="PCM_16")

    def silence_to(self, sample: int) -> None:
        """Write silence up to `sample` (at most to the track's end)."""
        end = min(sample, self.total_samples)
        while self.position < end:
            count = min(SILENCE_BLOCK, end - self.position)
            self._sound.write(_SILENCE[:count])
            self.position += count

    def write(self, start: int, clip: np.ndarray) -> None:
        """`clip` from sample `start` on; a part before what was already written, or past the track's end,
        is dropped (clips are cut at the next cue's start, so this only trims rounding)."""
        self.silence_to(start)
        skip = self.position - start
        part = clip[max(0, skip) : max(0, skip) + self.total_samples - self.position]
        if len(part):
            self._sound.write(np.clip(part, -1.0, 1.0).astype(np.float32, copy=False))
            self.position += len(part)

    def close(self) -> None:
        """Pad with silence to the track's length and finish the file (its header says the length)."""
        if not self._sound.closed:
            try:
                self.silence_to(self.total_samples)
            finally:
                self._sound.close()

    def __enter__(self) -> TrackWriter:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, trace: TracebackType | None
    ) -> None:
        if kind is None:
            self.close()
        else:  # the caller removes the file: no point writing hours of silence first
            self._sound.close()


def write_track(
    path: Path | str, cues: Sequence[tuple[CueSlot, LoadCue]], track_s: float, rate: int
) -> list[Placement | None]:
    """Write the dub's track (`track_s` long) to `path` with every cue's audio at its start; returns each
    cue's placement, in the order given (None: a cue without audio, left silent)."""
    total = round(track_s * rate)
    placements: list[Placement | None] = [None] * len(cues)
    order = sorted(range(len(cues)), key=lambda k: cues[k][0].start_s)
    with TrackWriter(path, rate, total) as writer:
        for k in order:
            slot, load = cues[k]
            audio = load()
            if audio is None:
                continue
            limit = min(slot.limit_s, track_s)
            start, clip, placements[k] = place(audio, rate, slot.start_s, slot.end_s, limit)
            writer.write(start, clip)
            del audio, clip  # one cue's audio at a time
    return placements
