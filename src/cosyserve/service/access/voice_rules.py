"""One ownership rule for saved voices, read by every surface (REST API, web UI, jobs, batches, dubs and
the cluster): a voice is someone's biometric data.

- A caller **uses** its own voices and the shared ones; admins use every voice. Any other voice does not
  exist for that caller (the stores answer "no voice", the same as for a missing one).
- Only the **owner** and admins read a voice's recording and its transcript.
- Only the owner and admins **change** a voice (rename, defaults, lexicon, delete).
- Only admins **share** a voice (or stop sharing it); an admin's new voices are shared unless it says not.
- Names are unique per owner (`stores.voice_schema`): nobody learns another user's voice names.
- **Consent**: enrolling confirms the server's consent statement (`auth.voice_consent_statement`): that the
  person whose voice it is agreed separately. User keys must (`auth.voice_consent_required`, on by
  default); admins may. The statement, who confirmed it and when are stored with the voice and shown to
  its owner and admins. A recording cloned once, without saving a voice (`prompt_wav` on /v1/tts, jobs,
  batches and dubs; the web UI's recording), needs the same confirmation, recorded with its output.
"""

from __future__ import annotations

import time
from typing import Any

from cosyserve.errors import ConsentRequired as ConsentRequired  # defined there, with the error table
from cosyserve.service.access.principals import Forbidden, Principal
from cosyserve.service.setting_groups import AuthSettings
from cosyserve.service.stores.voices import Voice


def owns(principal: Principal, voice: Voice) -> bool:
    return voice.owner is not None and voice.owner == principal.owner


def may_read_private(principal: Principal, voice: Voice) -> bool:
    """The recording and its transcript: the owner and admins."""
    return principal.is_admin or owns(principal, voice)


def check_changeable(principal: Principal, voice: Voice) -> None:
    """Forbidden unless `principal` may rename, edit or delete `voice` (which it can already use)."""
    if not (principal.is_admin or owns(principal, voice)):
        raise Forbidden(
            f"voice {voice.name!r} is shared with you, not yours: only its owner or an admin can change it"
        )


def check_recording(principal: Principal, voice: Voice) -> None:
    if not may_read_private(principal, voice):
        raise Forbidden(
            f"the recording of voice {voice.name!r} is for its owner and admins only: "
            "hear the voice by synthesising a text with it instead (API: preview?text=…)"
        )


def check_sharing(principal: Principal, shared: bool | None) -> None:
    """Forbidden when a non-admin asks to share a voice or stop sharing one."""
    if shared is not None and not principal.is_admin:
        raise Forbidden("only an admin can share a voice with everyone or stop sharing it")


def enrolment(
    principal: Principal, auth: AuthSettings, *, consent: bool, shared: bool | None = None
) -> tuple[str | None, bool, dict[str, Any] | None]:
    """(owner, shared, consent record) of a voice `principal` enrols: it owns the voice; admins share by
    default; ConsentRequired when a user key did not confirm the statement and the server requires it."""
    check_sharing(principal, shared if shared else None)
    if shared is None:
        shared = principal.is_admin
    _require_consent(
        principal,
        auth,
        consent,
        "enrolling a voice needs the consent of the person whose voice it is: confirm the statement "
        "(API: consent=true, see GET /v1/voices/consent; web UI: tick the consent box): ",
    )
    return principal.owner, bool(shared), consent_record(principal, auth) if consent else None


def recording_consent(principal: Principal, auth: AuthSettings, *, consent: bool) -> dict[str, Any] | None:
    """The consent record of a synthesis that clones a recording without saving a voice (kept in its
    output's manifest), None when not given; ConsentRequired where a user key must confirm it."""
    _require_consent(
        principal,
        auth,
        consent,
        "cloning a voice from a recording needs the consent of the person whose voice it is: confirm the "
        "statement (API: consent=true beside prompt_wav, see GET /v1/voices/consent; web UI: tick the "
        "consent box under the recording), or use a saved voice: ",
    )
    return consent_record(principal, auth) if consent else None


def _require_consent(principal: Principal, auth: AuthSettings, consent: bool, why: str) -> None:
    if not consent and auth.voice_consent_required and not principal.is_admin:
        raise ConsentRequired(why + auth.voice_consent_statement)


def consent_record(principal: Principal, auth: AuthSettings, by: str | None = None) -> dict[str, Any]:
    """What is kept of a confirmed consent: the statement word for word, who confirmed it, and when."""
    return {
        "statement": auth.voice_consent_statement,
        "by": by or principal.name or principal.owner or principal.kind,
        "owner": principal.owner,
        "at": round(time.time(), 3),
    }


def view(principal: Principal, voice: Voice) -> dict[str, Any]:
    """The voice as `principal` may see it: the transcript only for its owner and admins; whether it is
    the caller's own."""
    fields = voice.public(private=may_read_private(principal, voice))
    fields["own"] = owns(principal, voice)
    return fields
