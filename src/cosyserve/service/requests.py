"""What a synthesis request carries: the service layer's vocabulary for what goes in.

`SynthesisRequest` (what to say, in which voice) and `OutputSpec` (how the result is delivered and to whom
it is charged) go in; `VoiceScope` says which saved voices the caller may use. A new voice is asked for
with an `EnrolmentRequest`. What comes out is `outcomes.py`; how a request crosses a process or is kept
with a job is `wire.py`; how long its audio will be is `access/estimate.py`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from cosyserve.errors import InputError
from cosyserve.limits import MAX_INSTRUCT_CHARS, MAX_SPEED, MIN_SPEED
from cosyserve.service.audio_formats import SAMPLE_RATE, check_format, check_sample_rate
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
    # Some quality thresholds for this request only, name -> value (`quality.overrides`); None: the server's.
    thresholds: dict[str, float] | None = field(default=None, hash=False)

    def check_fields(self) -> None:
        """InputError for what is wrong whatever the model and the voice say: the checks a job is refused
        at submit for, as `/v1/tts` refuses them (a voice's default speed is checked once it is read)."""
        if (self.voice is None) == (self.prompt_wav is None):
            raise InputError("give exactly one of `voice` (a saved voice) or `prompt_wav` (a recording)")
        if not (0.0 <= self.volume <= 4.0):
            raise InputError(f"volume {self.volume} is out of range: use 0 to 4 (1 = unchanged)")
        if self.seed is not None and not (0 <= self.seed <= MAX_SEED):
            raise InputError(f"seed must be an integer from 0 to {MAX_SEED}")
        if self.speed is not None and not (MIN_SPEED <= self.speed <= MAX_SPEED):
            raise InputError(f"speed {self.speed} is out of range: use {MIN_SPEED} to {MAX_SPEED}")
        for name, value in (("instruct", self.instruct), ("prompt_text", self.prompt_text)):
            if value is not None and len(value) > MAX_INSTRUCT_CHARS:  # as the API's schema has it
                raise InputError(f"{name} is {len(value)} characters: at most {MAX_INSTRUCT_CHARS}")


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
