"""The admin routes' and the UI login's request bodies (`api.admin`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from cosyserve.api.schemas import StrictBody
from cosyserve.service.stores.keys import MAX_QUOTA_S, MAX_RATE_PER_MINUTE


class KeyCreate(StrictBody):
    """What POST /admin/keys makes: a key with a name and a role, and optional limits of its own."""

    name: str = Field(..., min_length=1, max_length=64, description="who or what the key is for")
    role: Literal["admin", "user"] = "user"
    daily_audio_seconds_quota: float | None = Field(
        None, gt=0, le=MAX_QUOTA_S, strict=True, allow_inf_nan=False, description="null: the server default"
    )
    rate_limit_per_minute: int | None = Field(
        None, ge=0, le=MAX_RATE_PER_MINUTE, strict=True, description="0: unlimited; null: the server default"
    )


class KeyUpdate(StrictBody):
    """What PATCH /admin/keys/{id} changes; a field left out stays as it is."""

    role: Literal["admin", "user"] | None = None
    # strict: `true` is no number (it became a quota of 1 s); the bounds are the key store's
    daily_audio_seconds_quota: float | None = Field(
        None,
        gt=0,
        le=MAX_QUOTA_S,
        strict=True,
        allow_inf_nan=False,
        description="audio seconds per UTC day; null: the server default",
    )
    rate_limit_per_minute: int | None = Field(
        None,
        ge=0,
        le=MAX_RATE_PER_MINUTE,
        strict=True,
        description="requests per minute; 0: unlimited; null: the server default",
    )


class LoginBody(StrictBody):
    username: str = Field(max_length=128)
    password: str = Field(max_length=1024)
