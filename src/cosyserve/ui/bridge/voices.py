"""Saved voices for the UI: the ones a principal may use, their recordings, enrolment with consent, renaming
and deleting; every rule is `service.access.voice_rules`, the same the `/v1/voices` routes apply."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from cosyserve.service.access import voice_rules
from cosyserve.service.access.principals import Principal
from cosyserve.service.assembly import Service
from cosyserve.service.local.voice_pins import refuse_if_in_use
from cosyserve.service.requests import EnrolmentRequest, VoiceDefaults
from cosyserve.service.scheduling.scheduler import Ticket
from cosyserve.service.stores.voices import Voice


class VoicesPart:
    """The UI bridge's part that reads and changes saved voices (it reads uploads through `UploadsPart`)."""

    service: Service
    read_upload: Callable[[str | Path], tuple[bytes, str]]  # `UploadsPart`'s, in the assembled bridge

    @property
    def consent_statement(self) -> tuple[str, bool]:
        """(the statement an enrolment confirms, whether user keys must confirm it)"""
        auth = self.service.settings.auth
        return auth.voice_consent_statement, auth.voice_consent_required

    def voices(self, principal: Principal) -> list[Voice]:
        """The voices `principal` may use (`voice_rules`): its own and the shared ones; admins all."""
        return self.service.voices.list(principal.voices)

    def voice(self, principal: Principal, id_or_name: str) -> Voice:
        """A voice `principal` may use; VoiceNotFound for any other, as for a missing one."""
        return self.service.voices.get(id_or_name, principal.voices)

    @staticmethod
    def may_change_voice(principal: Principal, voice: Voice) -> bool:
        """Whether `principal` may rename or delete the voice (its owner, or an admin)."""
        return principal.is_admin or voice_rules.owns(principal, voice)

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
        refuse_if_in_use(self.service.jobs, voice, principal)  # VoiceInUse while work uses it
        self.service.voices.delete(voice.id)
        return voice
