"""What a synthesis request carries and what it produces: the service layer's vocabulary.

`SynthesisRequest` (what to say, in which voice) and `OutputSpec` (how the result is delivered and to whom
it is charged) go in; `SynthesisResult` (raw audio, timings) comes out of the synthesizer and becomes a
`TtsOutcome` (what was stored and what the caller gets). A stream announces itself with `StreamStart`.
A new voice is asked for with an `EnrolmentRequest`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from cosyserve.service.audio_formats import SAMPLE_RATE, check_format, check_sample_rate
from cosyserve.service.quality.takes import TakeReport
from cosyserve.service.stores.keys import ApiKey

MAX_SEED = 2**31 - 1  # seeds are non-negative 31-bit integers everywhere (API, UI, synthesizer)
WorkState = Literal["queued", "running", "done", "failed", "cancelled"]  # of a ticket and of a job record
TERMINAL_STATES: frozenset[str] = frozenset({"done", "failed", "cancelled"})


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
    denoise: bool = False  # suppress background noise in `prompt_wav` before analysing it (RNNoise)
    takes: int | None = None  # made again (next seed) while a take fails its checks; None: the server's


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
    reading: dict[str, Any] = field(default_factory=dict)  # what the model read (`reading_report`)
    quality: TakeReport | None = None  # the kept take's scores and how many takes were made

    @property
    def duration_s(self) -> float:
        return len(self.audio) / self.sample_rate


@dataclass(frozen=True)
class VoiceDefaults:
    """Per-voice defaults, used when a request does not set the field."""

    instruct: str | None = None
    speed: float | None = None
    seed: int | None = None
    denoise: bool | None = None  # the recording was enrolled with noise reduction (kept for re-analysis)


@dataclass(frozen=True)
class EnrolmentRequest:
    """A voice to save: its name, a prompt recording, and what to remember with it."""

    name: str
    audio: bytes  # the recording, in any format soundfile decodes
    transcript: str | None = None  # what is said in it (zero-shot cloning needs it)
    suffix: str = ".wav"  # the uploaded file's suffix: a hint for decoding
    defaults: VoiceDefaults | None = None  # instruct, speed and seed used when a request gives none
    lexicon: dict[str, str] | None = None  # word -> pronunciation for this voice
    owner: str | None = None  # who enrols it (a principal's owner string); None: nobody (auth off)
    shared: bool | None = None  # every caller may use it (default: only if it has no owner)
    consent: dict[str, Any] | None = None  # the consent the enrolling caller confirmed (voice_rules)


@dataclass(frozen=True)
class VoiceScope:
    """The voices a caller may use: all of them (admins, and everyone when auth is off), or the shared
    ones and the caller's own. `owner` also says whose voice wins when several have the name asked for."""

    owner: str | None = None
    everything: bool = True

    def includes(self, voice_owner: str | None, shared: bool) -> bool:
        return self.everything or shared or (voice_owner is not None and voice_owner == self.owner)


EVERY_VOICE = VoiceScope()


@dataclass(frozen=True)
class OutputSpec:
    """How a result is delivered and attributed."""

    format: str = "wav"
    sample_rate: int | None = None  # None: the model's rate
    owner: str | None = None
    key: ApiKey | None = None  # charged for the audio seconds produced
    request_id: str | None = None
    endpoint: str = "tts"
    extra: dict[str, Any] = field(default_factory=dict)  # recorded in the manifest's parameters
    reservation: str | None = None  # the key's quota reservation this synthesis settles (`reservations`)

    @property
    def voice_scope(self) -> VoiceScope:
        """The saved voices this request may use: a user key's own and the shared ones; everything for
        admin keys, UI sessions and callers without keys (auth off). Checked where the voice is used."""
        if self.key is not None and self.key.role != "admin":
            return VoiceScope(owner=self.owner, everything=False)
        return VoiceScope(owner=self.owner, everything=True)

    def checked(self, source_rate: int | None = None) -> OutputSpec:
        fmt = check_format(self.format)
        rate = check_sample_rate(fmt, self.sample_rate, source_rate or SAMPLE_RATE)
        return dataclasses.replace(self, format=fmt, sample_rate=rate)


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


def job_parameters(request: SynthesisRequest, spec: OutputSpec) -> dict[str, Any]:
    """What a job record keeps of its request (everything needed to run it again)."""
    return {**dataclasses.asdict(request), "format": spec.format, "sample_rate": spec.sample_rate}
