"""Uploaded recordings: the type and size limits, the prompt checks, noise reduction (to hear before and
after), transcription, and which of those optional parts this server has installed."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

import soundfile

from cosyserve.errors import InputError
from cosyserve.frontend.audio import decode_audio
from cosyserve.frontend.denoise import denoise
from cosyserve.frontend.prompt_check import PromptReport, load_prompt
from cosyserve.limits import AUDIO_SUFFIXES as ACCEPTED_AUDIO_SUFFIXES
from cosyserve.limits import upload_bytes
from cosyserve.service.assembly import Service
from cosyserve.service.optional_parts import OptionalPart, optional_parts
from cosyserve.service.transcription import transcribe

AUDIO_SUFFIXES = frozenset(ACCEPTED_AUDIO_SUFFIXES)  # what the decoder reads (cosyserve.limits), as the API


@dataclass(frozen=True)
class UploadProblem:
    """Why an uploaded file was refused before decoding (the UI translates it)."""

    kind: str  # "type", "size", or "gone" (the upload's file is no longer on the server)
    suffix: str = ""
    size_mb: float = 0.0
    limit_mb: float = 0.0


class UploadRefused(InputError):
    def __init__(self, problem: UploadProblem) -> None:
        super().__init__(f"upload refused: {problem}")
        self.problem = problem


class UploadsPart:
    """The UI bridge's part that reads uploaded recordings."""

    service: Service

    def read_upload(self, path: str | Path) -> tuple[bytes, str]:
        """The bytes and suffix of an uploaded audio file, after the type and size limits."""
        path = Path(path)
        suffix = path.suffix.lower()
        if suffix not in AUDIO_SUFFIXES:
            raise UploadRefused(UploadProblem("type", suffix=suffix or "(none)"))
        limit_mb = self.service.settings.limits.max_upload_mb
        try:
            size = path.stat().st_size
            if size > upload_bytes(limit_mb):
                raise UploadRefused(UploadProblem("size", size_mb=size / 1e6, limit_mb=limit_mb))
            return path.read_bytes(), suffix
        except FileNotFoundError:  # Gradio's upload cache dropped it (expired, or cleaned by a restart)
            raise UploadRefused(UploadProblem("gone")) from None

    def check_prompt(self, path: str | Path) -> PromptReport:
        """Measurements and warnings for a prompt recording; InputError when it can't be used."""
        data, _ = self.read_upload(path)
        return load_prompt(data)[1]

    def transcribe(self, path: str | Path) -> str:
        data, _ = self.read_upload(path)
        return transcribe(self.service.settings.engine.asr_model, data)

    def optional_parts(self) -> dict[str, OptionalPart]:
        """Noise reduction and prompt transcription: installed here, or what is missing and how to add it."""
        return {part.name: part for part in optional_parts(self.service.settings.engine.asr_model)}

    @property
    def asr_available(self) -> bool:
        """A transcriber that can run: the model and (for SenseVoice) the sherpa-onnx package."""
        return self.optional_parts()["asr"].installed

    def denoised_copy(self, path: str | Path, folder: str | Path) -> str:
        """The uploaded prompt with noise suppressed, as a WAV in `folder` (to hear before and after)."""
        data, _ = self.read_upload(path)
        audio = decode_audio(data)
        cleaned = denoise(audio.samples, audio.sample_rate)
        target = Path(folder) / f"denoised-{uuid.uuid4().hex[:12]}.wav"
        target.parent.mkdir(parents=True, exist_ok=True)
        soundfile.write(target, cleaned, audio.sample_rate)
        return str(target)
