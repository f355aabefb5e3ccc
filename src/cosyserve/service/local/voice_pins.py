"""Voices that work in flight keeps: a job, batch or dub takes a snapshot of each saved voice it uses when it
is submitted, and its work pins the voice once per attempt.

At submit, each voice the work names (by name or id) is resolved to its id (renaming it later changes
nothing) and its settings (transcript, defaults, lexicon, owner) are kept in the job's parameters
(`voice_snapshots`, by the name or id as given), so changing the voice later does not change how the
job sounds. When an attempt starts, each voice is
pinned: its prompt features are loaded by id once and every segment uses them, so nothing is looked up
again per segment. Deleting a voice that queued or running work uses is refused (`VoiceInUse`, see
`voices_in_use`); a voice that is gone anyway when an attempt needs it (deleted out of band) fails that
work with `voice_unavailable`, never with the caller's `invalid_input`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cosyserve.frontend.prompt_features import PromptFeatures
from cosyserve.service.access.principals import Principal
from cosyserve.service.batches.inputs import ItemSpec
from cosyserve.service.batches.submission import BatchSubmission
from cosyserve.service.requests import EVERY_VOICE, SynthesisRequest, VoiceDefaults, VoiceScope
from cosyserve.service.stores.jobs import JobRecord, JobStore
from cosyserve.service.stores.voices import (
    Voice,
    VoiceFilesMissing,
    VoiceInUse,
    VoiceLibrary,
    VoiceNotFound,
    VoiceUnavailable,
)

SNAPSHOTS = "voice_snapshots"  # the job parameter holding {voice id: snapshot}


@dataclass(frozen=True)
class PinnedVoice:
    """A saved voice as running work uses it: its settings as submitted, its prompt features loaded."""

    voice: Voice
    features: PromptFeatures


def snapshot(voice: Voice) -> dict[str, Any]:
    """What a job keeps of a voice it was submitted with (JSON-able)."""
    return {
        "id": voice.id,
        "name": voice.name,
        "transcript": voice.transcript,
        "defaults": dict(voice.defaults.__dict__),
        "lexicon": dict(voice.lexicon),
        "owner": voice.owner,
        "shared": voice.shared,
    }


def resolve_request(library: VoiceLibrary, request: SynthesisRequest, scope: VoiceScope) -> dict[str, Any]:
    """The snapshots to keep with a job of `request` (VoiceNotFound at submit: the caller's error)."""
    if request.voice is None:
        return {}
    return {request.voice: snapshot(library.get(request.voice, scope))}


def resolve_items(
    library: VoiceLibrary, items: list[ItemSpec], scope: VoiceScope, known: dict[str, Voice] | None = None
) -> tuple[list[ItemSpec], dict[str, Any]]:
    """The items (one whose voice the caller may not use, or that does not exist, is stored failed at once
    with the reason) and the snapshots of their voices; `known`: voices already looked up, by reference."""
    found: dict[str, Voice | str] = dict(known or {})  # by the name or id the items give: the voice, or why
    resolved = []
    for item in items:
        name = item.params.get("voice")
        if item.problem is not None or not name:
            resolved.append(item)
            continue
        if name not in found:
            try:
                found[name] = library.get(str(name), scope)
            except VoiceNotFound as exc:
                found[name] = str(exc)
        voice = found[name]
        resolved.append(dataclasses.replace(item, problem=voice) if isinstance(voice, str) else item)
    return resolved, {ref: snapshot(voice) for ref, voice in found.items() if isinstance(voice, Voice)}


def resolve_batch(library: VoiceLibrary, batch: BatchSubmission, scope: VoiceScope) -> BatchSubmission:
    """`batch` with its items resolved (`resolve_items`) and its voices' snapshots kept in its shared
    settings (under SNAPSHOTS): the voices as they are when it is submitted. A batch-level voice the
    caller may not use, or that does not exist, is VoiceNotFound at submit (404), as for /v1/tts: every
    item taking it would fail, so the batch is refused rather than accepted to fail."""
    shared_voice = batch.shared.get("voice")
    known = {str(shared_voice): library.get(str(shared_voice), scope)} if shared_voice else {}
    items, snapshots = resolve_items(library, batch.items, scope, known)
    return dataclasses.replace(batch, items=items, shared={**batch.shared, SNAPSHOTS: snapshots})


class VoicePins:
    """The voices one attempt pinned (each loaded once); `snapshots` from the job's parameters."""

    def __init__(self, library: VoiceLibrary, snapshots: dict[str, Any] | None, scope: VoiceScope) -> None:
        self.library = library
        self.snapshots = dict(snapshots or {})
        self.scope = scope  # for voices without a snapshot (jobs submitted before snapshots existed)
        self._pinned: dict[str, PinnedVoice] = {}

    def pin(self, voice_ref: str | None, load: Callable[[Voice], PromptFeatures]) -> PinnedVoice | None:
        """The pinned voice `voice_ref` names (None: the work uses an uploaded recording); `load(voice)`
        returns its prompt features. VoiceUnavailable when a snapshotted voice is gone."""
        if voice_ref is None:
            return None
        if voice_ref in self._pinned:
            return self._pinned[voice_ref]
        taken = self.snapshots.get(voice_ref)
        try:
            voice = (
                self.library.get(taken["id"], EVERY_VOICE)
                if taken
                else self.library.get(voice_ref, self.scope)
            )
            if taken:  # the settings as they were at submit
                voice = dataclasses.replace(
                    voice,
                    name=taken.get("name") or voice.name,
                    transcript=taken.get("transcript"),
                    defaults=VoiceDefaults(**(taken.get("defaults") or {})),
                    lexicon=dict(taken.get("lexicon") or {}),
                    owner=taken.get("owner"),
                    shared=bool(taken.get("shared", voice.shared)),
                )
            pinned = PinnedVoice(voice, load(voice))
        except VoiceNotFound as exc:
            if not taken:
                raise  # never resolved at submit: the name the caller gave is unknown
            if isinstance(exc, VoiceFilesMissing):  # it exists, but this node cannot read its files
                raise VoiceUnavailable(f"the work's voice is not available on this node: {exc}") from exc
            raise VoiceUnavailable(
                f"voice {taken.get('name')!r} ({taken['id']}) was deleted after this work was accepted, "
                "before it could be used: enrol it again and resubmit what is missing"
            ) from exc
        self._pinned[voice_ref] = pinned
        return pinned

    def voices(self) -> list[Voice]:
        """The pinned voices (what a key whose role changed is checked against)."""
        return [pinned.voice for pinned in self._pinned.values()]


def refuse_if_in_use(jobs: JobStore, voice: Voice, principal: Principal | None = None) -> None:
    """VoiceInUse when queued or running work was submitted with `voice`, naming the work `principal` may
    see and cancel (its own; an admin: all) and counting the rest."""
    using = voices_in_use(jobs, voice.id)
    if not using:
        return
    visible = [r.id for r in using if principal is None or principal.is_admin or r.owner == principal.owner]
    others = len(using) - len(visible)
    shown = ", ".join(visible[:5]) + (f" and {len(visible) - 5} more" if len(visible) > 5 else "")
    everyone = principal is None or principal.is_admin
    parts = [shown if everyone else f"your {shown}"] if visible else []
    if others:
        parts.append(f"{others} of other users' (only they or an admin can cancel those)")
    advice = "wait until it ends" if not visible else "wait until it ends, or cancel yours"
    cancel = " (DELETE /v1/jobs/{id}, /v1/batches/{id} or /v1/dub/{id})" if visible else ""
    raise VoiceInUse(
        f"voice {voice.name!r} is used by queued or running work ({'; '.join(parts)}): "
        f"{advice}{cancel}, then delete the voice"
    )


def voices_in_use(jobs: JobStore, voice_id: str) -> list[JobRecord]:
    """The queued and running jobs, batches and dubs submitted with this voice."""
    using = []
    for state in ("queued", "running"):
        for record in jobs.list(state=state, limit=500):
            snapshots = (record.params or {}).get(SNAPSHOTS) or {}
            if any(isinstance(s, dict) and s.get("id") == voice_id for s in snapshots.values()):
                using.append(record)
    return using
