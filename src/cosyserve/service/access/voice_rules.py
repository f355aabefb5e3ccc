"""One ownership rule for saved voices, read by every surface (REST API, web UI, jobs, batches, dubs and
the cluster): a voice is someone's biometric data.

- A caller **uses** its own voices and the shared ones; admins use every voice. Any other voice does not
  exist for that caller (the stores answer "no voice", the same as for a missing one).
- Only the **owner** and admins read a voice's recording and its transcript.
- Only the owner and admins **change** a voice (rename, defaults, lexicon, delete).
- Only admins **share** a voice (or stop sharing it); an admin's new voices are shared unless it says not.
- Names are unique per owner (`stores.voice_schema`): nobody learns another user's voice names.
"""

from __future__ import annotations

from typing import Any

from cosyserve.service.access.principals import Forbidden, Principal
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


def enrolment(principal: Principal, shared: bool | None = None) -> tuple[str | None, bool]:
    """(owner, shared) of a voice `principal` enrols: it owns it; admins share by default."""
    check_sharing(principal, shared if shared else None)
    if shared is None:
        shared = principal.is_admin
    return principal.owner, bool(shared)


def view(principal: Principal, voice: Voice) -> dict[str, Any]:
    """The voice as `principal` may see it: the transcript only for its owner and admins; whether it is
    the caller's own."""
    fields = voice.public(private=may_read_private(principal, voice))
    fields["own"] = owns(principal, voice)
    return fields
