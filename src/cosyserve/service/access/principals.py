"""Who is calling (`Principal`) and the errors that say a call may not go ahead."""

from __future__ import annotations

from dataclasses import dataclass

from cosyserve.errors import AuthRequired as AuthRequired  # defined there, with the error table
from cosyserve.errors import Forbidden as Forbidden
from cosyserve.errors import QuotaExceeded as QuotaExceeded
from cosyserve.errors import RateLimited as RateLimited
from cosyserve.service.requests import VoiceScope
from cosyserve.service.stores.keys import ApiKey


@dataclass(frozen=True)
class Principal:
    """Who is calling: `anonymous` (auth off), an API `key`, or a UI `session` user; or a `signed` URL."""

    kind: str
    role: str  # "admin" or "user"
    key: ApiKey | None = None
    name: str | None = None

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    @property
    def owner(self) -> str | None:
        """What jobs and outputs record as their owner (None: no owner, visible to everyone)."""
        if self.key is not None:
            return f"key:{self.key.id}"
        if self.kind == "session" and self.name:
            return f"user:{self.name}"
        return None

    @property
    def listed_owner(self) -> str | None:
        """The owner a listing (jobs, batches, outputs) is filtered by: None for an admin (everyone's), else
        this caller's owner ("" for a caller without one)."""
        return None if self.is_admin else (self.owner or "")

    def may_see(self, owner: str | None) -> bool:
        """Admins see everything; other callers only what they own."""
        return self.is_admin or (owner is not None and owner == self.owner)

    @property
    def voices(self) -> VoiceScope:
        """The voices this caller may use: admins all of them, others the shared ones and their own (a
        name several voices share means the caller's own first: see `VoiceLibrary.get`)."""
        return VoiceScope(owner=self.owner, everything=self.is_admin)
