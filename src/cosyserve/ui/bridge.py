"""What the web UI asks of the service, in one place: the same `Service` calls the API routers make.

The UI never touches the engine or the synthesizer: synthesis goes through the scheduler
(`service.backend`), voices through the library and `backend.submit_enrolment`, results through the
output store, and every call is made as a `Principal` resolved from the same credentials the API takes
(the API's session cookie, an API key, or nobody when auth is off).
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import soundfile

from cosyserve.errors import CosyServeError, InputError
from cosyserve.frontend.audio import decode_audio
from cosyserve.frontend.denoise import denoise
from cosyserve.frontend.prompt_check import PromptReport, load_prompt
from cosyserve.frontend.text.describe import describe_text
from cosyserve.limits import AUDIO_SUFFIXES
from cosyserve.service.access import voice_rules
from cosyserve.service.access.principals import AuthRequired, Principal
from cosyserve.service.access.sessions import SESSION_COOKIE
from cosyserve.service.assembly import Service
from cosyserve.service.backend import JOB_TEXT_FACTOR, AudioStream
from cosyserve.service.local.voice_pins import refuse_if_in_use
from cosyserve.service.optional_parts import OptionalPart, optional_parts
from cosyserve.service.requests import EnrolmentRequest, OutputSpec, SynthesisRequest, VoiceDefaults
from cosyserve.service.scheduling.scheduler import Ticket
from cosyserve.service.stores.jobs import JobRecord
from cosyserve.service.stores.outputs import OutputNotFound, StoredOutput
from cosyserve.service.stores.voices import Voice
from cosyserve.service.transcription import transcribe
from cosyserve.ui.admin_bridge import AdminBridge

DOWNLOAD_FORMATS = ("wav", "mp3", "flac", "opus")
MODES = ("zero_shot", "cross_lingual", "instruct")


@dataclass(frozen=True)
class UploadProblem:
    """Why an uploaded file was refused before decoding (the UI translates it)."""

    kind: str  # "type" or "size"
    suffix: str = ""
    size_mb: float = 0.0
    limit_mb: float = 0.0


class UploadRefused(InputError):
    def __init__(self, problem: UploadProblem) -> None:
        super().__init__(f"upload refused: {problem}")
        self.problem = problem


class UiBridge(AdminBridge):
    """The UI's view of one `Service`."""

    def __init__(self, service: Service) -> None:
        self.service = service

    # -- who is calling ----------------------------------------------------------------------------

    def principal(self, headers: Mapping[str, str], cookies: Mapping[str, str]) -> Principal | None:
        """Like the API: an API key in a header, the login's session cookie (whether by key or password),
        or anonymous with full rights when the server has no authentication at all; None: not signed in."""
        return self.service.access.identify(_header_key(headers), cookies.get(SESSION_COOKIE))

    def principal_of(self, request: Any) -> Principal:
        """The principal of a Gradio request; AuthRequired when its credentials are gone or invalid."""
        headers = dict(getattr(request, "headers", None) or {})
        cookies = dict(getattr(request, "cookies", None) or {})
        found = self.principal(headers, cookies)
        if found is None:
            raise AuthRequired("not signed in: log in again")
        return found

    # -- uploads -----------------------------------------------------------------------------------

    def read_upload(self, path: str | Path) -> tuple[bytes, str]:
        """The bytes and suffix of an uploaded audio file, after the type and size limits."""
        path = Path(path)
        suffix = path.suffix.lower()
        if suffix not in AUDIO_SUFFIXES:
            raise UploadRefused(UploadProblem("type", suffix=suffix or "(none)"))
        limit_mb = self.service.settings.limits.max_upload_mb
        size_mb = path.stat().st_size / 1e6
        if size_mb > limit_mb:
            raise UploadRefused(UploadProblem("size", size_mb=size_mb, limit_mb=limit_mb))
        return path.read_bytes(), suffix

    def check_prompt(self, path: str | Path) -> PromptReport:
        """Measurements and warnings for a prompt recording; InputError when it can't be used."""
        data, _ = self.read_upload(path)
        return load_prompt(data)[1]

    # -- synthesis ---------------------------------------------------------------------------------

    @property
    def max_text_chars(self) -> int:
        return self.service.settings.limits.max_text_chars

    def submit(
        self, principal: Principal, request: SynthesisRequest, *, mode: str, request_id: str, fmt: str = "wav"
    ) -> Ticket:
        """Queue one synthesis as `principal` (QueueFull, ModelNotReady, RateLimited, InputError, ...)."""
        return self.service.backend.submit_tts(request, self._spec(principal, "wav", mode, request_id, fmt))

    def stream(
        self, principal: Principal, request: SynthesisRequest, *, mode: str, request_id: str, fmt: str = "wav"
    ) -> AudioStream:
        """The same as `submit`, read while it is made (raw 16-bit PCM, which the page plays as it comes)."""
        return self.service.backend.stream_tts(request, self._spec(principal, "pcm", mode, request_id, fmt))

    def _spec(self, principal: Principal, delivered: str, mode: str, request_id: str, fmt: str) -> OutputSpec:
        access = self.service.access
        access.check_rate(principal)
        access.check_quota(principal)
        return OutputSpec(
            format=delivered,
            owner=principal.owner,
            key=principal.key,
            request_id=request_id,
            endpoint="ui",
            extra={"ui_mode": mode, "ui_format": fmt},
        )

    def submit_job(
        self, principal: Principal, request: SynthesisRequest, *, mode: str, request_id: str
    ) -> str:
        """A text over the interactive limit as an ordinary job (the same as POST /v1/jobs); its id."""
        spec = self._spec(principal, "wav", mode, request_id, "wav")
        return self.service.backend.submit_job(request, dataclasses.replace(spec, endpoint="ui-job")).id

    def job(self, job_id: str) -> tuple[JobRecord | None, Ticket | None]:
        """The job's record and, while this process runs it, its ticket (progress, finished pieces)."""
        return self.service.jobs.get(job_id), self.service.scheduler.get(job_id)

    def cancel_job(self, job_id: str) -> None:
        with contextlib.suppress(CosyServeError):  # it ended meanwhile: the poller reports how
            self.service.backend.cancel_job(job_id)

    @property
    def max_job_chars(self) -> int:
        return self.max_text_chars * JOB_TEXT_FACTOR

    def describe(
        self,
        principal: Principal | None,
        text: str,
        *,
        prompt_text: str | None,
        instruct: str | None,
        voice: str | None,
    ) -> Any:
        """How the model will read `text` (`describe_text`) with a saved voice's transcript, instruction and
        lexicon when one is given (a voice `principal` may use; None: no saved voice at all); InputError
        for text the synthesis would refuse too."""
        synth = self.service.model.loaded if self.service.model is not None else None
        if synth is None:
            raise InputError(
                "the text preview needs the model loaded on this server: try again when it is ready"
            )
        lexicon = None
        if voice:
            if principal is None:
                raise AuthRequired("not signed in: log in again")
            saved = self.voice(principal, voice)
            prompt_text = saved.transcript if prompt_text is None else prompt_text
            instruct = instruct if instruct is not None else saved.defaults.instruct
            lexicon = saved.lexicon or None
        return describe_text(
            text, synth.tokenizer, prompt_text=prompt_text, instruct=instruct, lexicon=lexicon, max_chars=None
        )

    def transcribe(self, path: str | Path) -> str:
        data, _ = self.read_upload(path)
        return transcribe(self.service.settings.engine.asr_model, data)

    @property
    def consent_statement(self) -> tuple[str, bool]:
        """(the statement an enrolment confirms, whether user keys must confirm it)"""
        auth = self.service.settings.auth
        return auth.voice_consent_statement, auth.voice_consent_required

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

    def mean_duration_s(self) -> float | None:
        return self.service.scheduler.stats().get("mean_duration_s")

    def cancel(self, ticket: Ticket) -> None:
        if not ticket.finished:
            ticket.cancel("cancelled in the web UI")

    # -- results -----------------------------------------------------------------------------------

    def output(self, principal: Principal, output_id: str) -> StoredOutput:
        """A stored result the principal may see (admins and anonymous users see all)."""
        output = self.service.outputs.get(output_id)
        if not principal.may_see(output.manifest.get("owner")):
            raise OutputNotFound(f"no output {output_id}; it may have expired or been deleted")
        return output

    def history(self, principal: Principal, limit: int = 50, everyone: bool = False) -> list[StoredOutput]:
        """This user's results, newest first (everyone's when there is no login at all, or when an admin
        asks for `everyone`'s)."""
        if everyone and principal.is_admin:
            return self.service.outputs.list(owner=None, limit=limit)
        owner = principal.owner
        if owner is None and principal.kind != "anonymous":
            return []
        return self.service.outputs.list(owner=owner, limit=limit)

    def delete_output(self, principal: Principal, output_id: str) -> StoredOutput:
        """Delete a stored result by the rule of `DELETE /v1/outputs/{id}`: a user its own, an admin any;
        another user's is OutputNotFound, as for a missing one."""
        self.output(principal, output_id)
        return self.service.outputs.delete(output_id)

    def download_url(self, output: StoredOutput, fmt: str = "wav") -> str:
        """A signed link to the output store's download route (works without credentials until it expires)."""
        query = {"format": fmt} if fmt != "wav" else None
        return self.service.access.signed_url(output.url_path, query)

    # -- voices ------------------------------------------------------------------------------------

    def voices(self, principal: Principal) -> list[Voice]:
        """The voices `principal` may use (`voice_rules`): its own and the shared ones; admins all."""
        return self.service.voices.list(principal.voices)

    def voice(self, principal: Principal, id_or_name: str) -> Voice:
        """A voice `principal` may use; VoiceNotFound for any other, as for a missing one."""
        return self.service.voices.get(id_or_name, principal.voices)

    @staticmethod
    def may_read_private(principal: Principal, voice: Voice) -> bool:
        """Whether `principal` may hear the voice's recording and read its transcript."""
        return voice_rules.may_read_private(principal, voice)

    def voice_recording(self, principal: Principal, id_or_name: str) -> Path:
        """The original recording, for its owner and admins only (Forbidden for anyone else)."""
        voice = self.voice(principal, id_or_name)
        voice_rules.check_recording(principal, voice)
        return self.service.voices.audio_file(voice)

    def enrol(
        self,
        principal: Principal,
        name: str,
        path: str | Path,
        transcript: str | None,
        request_id: str,
        denoise: bool = False,
        consent: bool = False,
    ) -> Ticket:
        """Enrol a voice as `principal` (the same rules as POST /v1/voices): it owns the voice, and user
        keys confirm the consent statement (ConsentRequired otherwise)."""
        auth = self.service.settings.auth
        owner, shared, record = voice_rules.enrolment(principal, auth, consent=consent)
        data, suffix = self.read_upload(path)
        defaults = VoiceDefaults(denoise=True) if denoise else None
        enrolment = EnrolmentRequest(
            name, data, transcript or None, suffix, defaults, owner=owner, shared=shared, consent=record
        )
        return self.service.backend.submit_enrolment(enrolment, request_id=request_id)

    def rename_voice(self, principal: Principal, voice_id: str, new_name: str) -> Voice:
        voice = self.voice(principal, voice_id)
        voice_rules.check_changeable(principal, voice)
        return self.service.voices.update(voice.id, name=new_name)

    def delete_voice(self, principal: Principal, voice_id: str) -> Voice:
        voice = self.voice(principal, voice_id)
        voice_rules.check_changeable(principal, voice)
        refuse_if_in_use(self.service.jobs, voice)  # VoiceInUse while queued or running work uses it
        self.service.voices.delete(voice.id)
        return voice


def _header_key(headers: Mapping[str, str]) -> str | None:
    lowered = {k.lower(): v for k, v in headers.items()}
    scheme, _, value = lowered.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return lowered.get("x-api-key", "").strip() or None
