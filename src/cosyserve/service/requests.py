"""What a synthesis request carries and what it produces: the service layer's vocabulary."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

SAMPLE_RATE = 24000


@dataclass(frozen=True)
class SynthesisRequest:
    """One text to speak in one voice. Exactly one of `voice` or `prompt_wav` gives the voice."""

    text: str
    voice: str | None = None  # id or name of a saved voice
    prompt_wav: bytes | None = None  # an uploaded prompt recording (any format soundfile decodes)
    prompt_text: str | None = None  # transcript of the prompt: zero-shot clone; absent: cross-lingual
    instruct: str | None = None  # plain-language instruction (dialect, emotion, speed, ...)
    seed: int | None = None  # None: one is drawn and reported, so any result can be reproduced
    speed: float | None = None  # None: the voice's default, else 1.0
    volume: float = 1.0  # linear gain on the output, clipped to [-1, 1]
    stream: bool = False  # chunks within a sentence as soon as they are ready


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

    @property
    def duration_s(self) -> float:
        return len(self.audio) / self.sample_rate
