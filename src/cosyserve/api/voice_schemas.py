"""Request and response bodies of the voice library (`/v1/voices`), with the constraints /docs shows."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, Field

from cosyserve.api.schemas import StrictBody
from cosyserve.limits import MAX_SPEED, MIN_SPEED
from cosyserve.service.requests import MAX_SEED


class VoiceDefaultsBody(StrictBody):
    instruct: str | None = Field(None, max_length=500)
    speed: float | None = Field(None, ge=MIN_SPEED, le=MAX_SPEED)
    seed: int | None = Field(None, ge=0, le=MAX_SEED)


class VoiceCreateParams(StrictBody):
    """Enrol a voice. JSON: `audio` is base64; multipart: upload the recording as `audio`."""

    name: str = Field(min_length=1, max_length=64, examples=["alice"])
    audio: str | None = Field(
        None,
        validation_alias=AliasChoices("audio", "prompt_wav"),
        description="the recording (JSON: base64; multipart: the file); `prompt_wav`, its name in "
        "/v1/tts, is accepted too",
    )
    transcript: str | None = Field(
        None,
        max_length=500,
        validation_alias=AliasChoices("transcript", "prompt_text"),
        description="what the recording says; `prompt_text`, its name in /v1/tts, is accepted too",
    )
    instruct: str | None = Field(None, max_length=500, description="default instruction")
    speed: float | None = Field(None, ge=MIN_SPEED, le=MAX_SPEED, description="default speed")
    seed: int | None = Field(None, ge=0, le=MAX_SEED, description="default seed")
    denoise: bool = Field(False, description="suppress background noise in the recording before analysis")
    lexicon: dict[str, str] | str | None = Field(
        None, description='word → pronunciation, e.g. {"重庆": "[chóng qìng]"} (multipart: JSON text)'
    )
    shared: bool | None = Field(
        None, description="every caller may use it (admins only; an admin's voices are shared by default)"
    )
    consent: bool = Field(
        False,
        description="you confirm the server's consent statement (GET /v1/voices/consent): the person whose "
        "voice this is agreed separately; required for user keys unless the server turned it off",
    )


class VoiceUpdate(StrictBody):
    name: str | None = Field(None, min_length=1, max_length=64)
    transcript: str | None = Field(None, max_length=500)
    defaults: VoiceDefaultsBody | None = None
    lexicon: dict[str, str] | None = None
    shared: bool | None = Field(None, description="share it with every caller, or stop (admins only)")


class VoiceView(BaseModel):
    id: str
    name: str
    transcript: str | None  # None for a voice that is not the caller's (unless the caller is an admin)
    created_at: float
    defaults: dict[str, Any]
    lexicon: dict[str, str]
    report: dict[str, Any]
    shared: bool = True  # every caller may use it; False: only its owner and admins
    own: bool = False  # the caller enrolled it
    owner: str | None = (
        None  # whose voice it is, who enrolled it (`key:<id>`, `user:<name>`; owner and admins)
    )
    enrolled_by: str | None = None  # who confirmed consent at enrolment (owner and admins see it)
    consent: dict[str, Any] | None = None  # the statement confirmed, by whom and when (owner and admins)
    preview_url: str


class ConsentStatement(BaseModel):
    statement: str  # what `consent=true` confirms, recorded with the voice word for word
    required: bool  # whether user keys must confirm it to enrol a voice


class VoiceList(BaseModel):
    object: Literal["list"] = "list"
    data: list[VoiceView]
    has_more: bool = Field(False, description="more follow this page: ask again with `offset` + its length")
