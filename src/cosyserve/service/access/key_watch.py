"""Work in flight keeps asking whether its key still may: a revoked key's streams, jobs and batches stop at
the next segment boundary, and nothing made after the revoke is charged.

`KeyWatch.check` reads the key's row once (one query per segment boundary: the work checks before it
charges a segment, so the segment in flight when the key was revoked is never charged). A key whose role
changed is re-checked against what the work uses: a key that became a user may no longer speak with a
saved voice that is neither shared nor its own, and its work stops with `key_changed`; work that stays
within the new scope goes on. A changed quota is read again at every charge, and by a request as its turn
comes (`local.key_guard`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from cosyserve.errors import KeyChanged as KeyChanged
from cosyserve.errors import KeyRevoked as KeyRevoked  # defined there, with the error table
from cosyserve.service.requests import VoiceScope
from cosyserve.service.stores.keys import ApiKey

# What became of the work, by where the revoke was found (the page and the API show it as the reason).
REVOKED_AT = {
    "start": "before this work started: nothing was made or charged",
    "request": "while this request ran: it stopped, and nothing was kept or charged",
    "chunk": "during this stream: it stopped at its next chunk; the audio already sent is charged, nothing "
    "after it",
    "segment": "while this work ran: it stopped at the next segment (a batch at its next item); the parts "
    "finished before are kept and charged, nothing made after the revoke",
}


def key_id_of(owner: str | None) -> int | None:
    """The id of the API key an owner string names (`key:12` → 12; `Principal.owner`), else None."""
    number = (owner or "").removeprefix("key:")
    return int(number) if owner and owner.startswith("key:") and number.isdigit() else None


class KeyWatch:
    """Re-checks one key at segment boundaries; a no-op for work without a key (auth off, UI sessions)."""

    def __init__(self, lookup: Callable[[int], ApiKey | None], key_id: int | None) -> None:
        self.lookup = lookup  # the key's current row by id, revoked ones included (None: deleted)
        self.key_id = key_id

    def check(self, voices: Iterable[Any] = (), *, stage: str = "segment") -> ApiKey | None:
        """The key's row as it is now (None for work without a key). KeyRevoked when the key was revoked or
        deleted, its message saying what became of the work at `stage` (a key in `REVOKED_AT`);
        KeyChanged when a saved voice the work uses (anything with its `owner` and `shared`) is outside
        what the key may use now."""
        if self.key_id is None:
            return None
        key = self.lookup(self.key_id)
        if key is None or key.revoked_at is not None:
            raise KeyRevoked(f"API key {self.key_id} was revoked {REVOKED_AT[stage]}")
        scope = VoiceScope(owner=f"key:{key.id}", everything=key.is_admin)
        if not all(scope.includes(voice.owner, voice.shared) for voice in voices):
            raise KeyChanged(
                f"API key {key.id} became a {key.role} key while this work ran and may no longer use its "
                "voice (another user's): the work stopped; submit it again with a voice the key may use"
            )
        return key
