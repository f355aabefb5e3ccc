"""What a synthesis produces: the service layer's vocabulary for results.

The synthesizer reports `SynthesisProgress` after each segment and yields `AudioChunk`s; it ends with a
`SynthesisResult` (raw audio, `SentenceTiming`s, what it cost), which `local/results.py` stores and turns
into the `TtsOutcome` the caller gets. A stream announces itself with `StreamStart`. What goes in is
`requests.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cosyserve.service.audio_formats import SAMPLE_RATE
from cosyserve.service.quality.takes import TakeReport


@dataclass(frozen=True)
class AudioChunk:
    """A piece of output audio, in order. Concatenating all chunks gives the whole result."""

    samples: np.ndarray  # (S,) float32 mono in [-1, 1]
    sentence_index: int  # which text segment it belongs to
    sample_rate: int = SAMPLE_RATE


@dataclass(frozen=True)
class SentenceTiming:
    """Where one synthesised segment of the text lies in the output audio."""

    index: int
    text: str
    start_s: float
    end_s: float


@dataclass
class SynthesisProgress:
    """Reported to a progress callback after every segment (and at the start)."""

    segments_done: int
    segments_total: int
    audio_seconds: float = 0.0
    # False while one of several takes is made: which one is delivered is not known yet, so its audio is
    # not what a caller charges. Once chosen, the kept take is reported once more (`chosen`: no new
    # segment), kept, with its whole length.
    kept: bool = True
    chosen: bool = False

    @property
    def fraction(self) -> float:
        return self.segments_done / self.segments_total if self.segments_total else 1.0


@dataclass
class SynthesisResult:
    """A finished synthesis: audio plus everything needed to reproduce and describe it."""

    audio: np.ndarray  # (S,) float32
    sample_rate: int
    seed: int
    timings: list[SentenceTiming] = field(default_factory=list)
    speech_tokens: int = 0
    stage_seconds: dict[str, float] = field(default_factory=dict)  # e.g. {"llm": 1.2, "flow": 3.4, ...}
    warnings: list[str] = field(default_factory=list)
    reading: dict[str, Any] = field(default_factory=dict)  # what the model read (`reading_report`)
    quality: TakeReport | None = None  # the kept take's scores and how many takes were made

    @property
    def duration_s(self) -> float:
        return len(self.audio) / self.sample_rate


@dataclass(frozen=True)
class StreamStart:
    """How a stream begins: the request was checked and its seed is known, so a response can start."""

    seed: int
    media_type: str
    sample_rate: int
    # Why results could not be saved when the stream began (a full or unwritable output directory, under
    # min_free_mb): its audio will probably not be kept. None: nothing was known to be wrong.
    storage_warning: str | None = None


@dataclass(frozen=True)
class TtsOutcome:
    """A finished synthesis as the caller sees it: where it was stored, and the audio when not streamed."""

    seed: int
    duration_s: float
    speech_tokens: int
    output_id: str | None
    output_path: str | None
    media_type: str
    warnings: tuple[str, ...] = ()
    audio: bytes | None = None  # the encoded response (not for streams)
    storage_error: str | None = None  # why the result could not be saved (None: it was, or not asked)
    quality: TakeReport | None = None  # the kept take's scores and how many takes were made
    speech_s: float | None = None  # the engine's audio without an explicit label: what a quota counts
