"""Request and response bodies of batches and dubs, with the constraints and examples /docs shows."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from cosyserve.api.schemas import (
    RECORDING_CONSENT,
    AudioFormat,
    JobError,
    JobPartial,
    NumbersNotBooleans,
    Thresholds,
    form_thresholds,
    inline_schema,
)
from cosyserve.limits import (
    DEFAULT_DUB_MAX_SPEED,
    MAX_SPEED,
    MAX_VOLUME,
    MIN_DUB_MAX_SPEED,
    MIN_SPEED,
    MIN_VOLUME,
)
from cosyserve.service.quality import MAX_TAKES
from cosyserve.service.requests import MAX_SEED, WorkState

TrackFormat = Literal["wav", "flac", "mp3"]


class _Shared(NumbersNotBooleans):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    voice: str | None = Field(None, max_length=64, description="a saved voice for items that name none")
    prompt_wav: str | None = Field(
        None, description="instead of a voice: a 3-30 s recording (JSON: base64; multipart: the file)"
    )
    prompt_text: str | None = Field(None, max_length=500, description="transcript of prompt_wav")
    consent: bool = Field(False, description=RECORDING_CONSENT)
    instruct: str | None = Field(None, max_length=500, description="an instruction for every item")
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    speed: float | None = Field(None, ge=MIN_SPEED, le=MAX_SPEED)
    volume: float | None = Field(None, ge=MIN_VOLUME, le=MAX_VOLUME)
    takes: int | None = Field(
        None,
        ge=1,
        le=MAX_TAKES,
        description="takes per item while one fails its checks (default: the server's)",
    )
    thresholds: Thresholds | None = Field(
        None,
        description="quality thresholds for every item (an item's own win; form and query: JSON text)",
    )

    _form_thresholds = field_validator("thresholds", mode="before")(form_thresholds)

    def shared(self, names: tuple[str, ...]) -> dict[str, Any]:
        """The settings `names` as a batch keeps them (JSON-ready: thresholds as a plain mapping)."""
        values = {name: getattr(self, name) for name in names}
        if "thresholds" in values:
            values["thresholds"] = self.thresholds.given() if self.thresholds is not None else None
        return values


class BatchParams(_Shared):
    """Shared settings of a batch (form fields, query parameters, or the JSON body beside `items`)."""

    model_config = ConfigDict(
        extra="forbid",
        allow_inf_nan=False,
        json_schema_extra={
            "examples": [
                {
                    "voice": "alice",
                    "items": [
                        {"text": "第一课：你好。", "name": "lesson1"},
                        {"text": "第二课：谢谢。", "name": "lesson2", "seed": 7},
                    ],
                }
            ]
        },
    )

    format: AudioFormat = Field("wav", description="format of the items' files (an item may set its own)")
    items: list[dict[str, Any] | str] | None = Field(
        None,
        max_length=100_000,
        description="JSON only: the items, each {text, voice, instruct, seed, speed, volume, format, takes, "
        "thresholds, name}",
    )


class DubParams(_Shared):
    """A dub's settings (form fields, query parameters, or the JSON body beside `subtitles`)."""

    model_config = ConfigDict(
        extra="forbid",
        allow_inf_nan=False,
        json_schema_extra={
            "examples": [{"voice": "alice", "subtitles": "1\n00:00:01,000 --> 00:00:02,500\n你好。\n"}]
        },
    )

    format: TrackFormat = Field("wav", description="the track's format")
    max_speed: float = Field(
        DEFAULT_DUB_MAX_SPEED,
        ge=MIN_DUB_MAX_SPEED,
        le=MAX_SPEED,
        description="a cue longer than its slot is sped up at most this much",
    )
    subtitles: str | None = Field(
        None, max_length=10_000_000, description="JSON only: the SRT or WebVTT text"
    )


class BatchItemView(BaseModel):
    position: int
    name: str
    state: WorkState
    text: str
    voice: str | None = None
    error: JobError | None = None
    output_id: str | None = None
    url: str | None = Field(None, description="signed download link of its audio")
    duration_s: float | None = None
    seed: int | None = None
    start_s: float | None = Field(None, description="dub: the cue's start")
    end_s: float | None = Field(None, description="dub: the cue's planned end")
    speed: float | None = Field(None, description="dub: the speed it was synthesised at")
    overflow_s: float | None = Field(
        None,
        description="dub: how far what plays of its speech runs past the cue's end (cut audio not counted)",
    )
    cut_s: float | None = Field(
        None, description="dub: speech cut so as not to run over the next cue (never played)"
    )
    cue: str | None = Field(None, description="dub: the cue's number or identifier in the subtitle file")
    played_s: float | None = Field(None, description="dub: seconds of its speech played in the track")
    quality: dict[str, Any] | None = Field(
        None, description="the kept take's scores, `takes` made and `passed` (docs/quality.md)"
    )


class BatchView(BaseModel):
    id: str
    kind: Literal["batch", "dub"]
    owner: str | None = Field(
        None, description="whose batch it is (`key:<id>`, `user:<name>`): admins see all"
    )
    state: WorkState
    progress: float
    total: int
    done: int
    failed: int
    cancelled: int
    created_at: str
    started_at: str | None = None
    finished_at: str | None = None
    position: int | None = Field(None, description="place in the queue (0: next); only while queued")
    estimated_wait_s: float | None = Field(
        None, description="seconds until it starts, from measured unit times; only while queued"
    )
    estimated_time_left_s: float | None = Field(None, description="from the items done so far")
    error: JobError | None = None
    duration_s: float | None = Field(None, description="seconds of audio made (a dub: the track's length)")
    charged_s: float | None = Field(
        None,
        description="audio seconds charged to the key's quota so far (a dub: the track's length in the end)",
    )
    archive_url: str | None = Field(None, description="signed link to the ZIP of every finished item")
    track_url: str | None = Field(None, description="dub: signed link to the track")
    report_url: str | None = Field(None, description="dub: the per-cue report (JSON; ?format=csv)")
    params: dict[str, Any] = Field(default_factory=dict)
    partial: JobPartial | None = Field(
        None, description="it stopped early (error says why): the items kept (archive_url) and those missing"
    )
    check_these: list[int] = Field(
        default_factory=list,
        description="positions of the listed items whose every take failed its checks: listen to them",
    )
    items: list[BatchItemView] = Field(
        default_factory=list, description="a page of the items (offset, limit)"
    )


class BatchList(BaseModel):
    object: Literal["list"] = "list"
    data: list[BatchView]
    has_more: bool = Field(False, description="more follow this page: ask again with `offset` + its length")


def upload_body_doc(model: type[BaseModel], raw_types: tuple[str, ...]) -> dict[str, Any]:
    """`openapi_extra` for a route that takes JSON, a multipart form with `file` (and `prompt_wav`), or the
    file itself as the body."""
    schema = inline_schema(model)
    files = {
        "file": {"type": "string", "format": "binary", "description": "the script or subtitle file"},
        "prompt_wav": {"type": "string", "format": "binary", "description": "a recording (instead of voice)"},
    }
    multipart = {**schema, "properties": {**schema["properties"], **files}}
    content: dict[str, Any] = {
        "application/json": {"schema": schema},
        "multipart/form-data": {"schema": multipart},
    }
    content.update({kind: {"schema": {"type": "string"}} for kind in raw_types})
    return {"requestBody": {"required": True, "content": content}}
