"""Request and response bodies, with the constraints and examples that /docs shows."""

from __future__ import annotations

import typing
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from cosyserve.api.inputs import parse_json
from cosyserve.errors import InputError
from cosyserve.limits import MAX_SPEED, MAX_VOLUME, MIN_SPEED, MIN_VOLUME, SPEED_RANGE_TEXT
from cosyserve.service.quality import MAX_TAKES
from cosyserve.service.quality.overrides import THRESHOLD_BOUNDS
from cosyserve.service.requests import MAX_SEED, SynthesisRequest, WorkState

AudioFormat = Literal["wav", "mp3", "opus", "flac", "pcm"]


def _numbers_in(annotation: Any) -> set[type]:
    """The number types (int, float) and bool an annotation such as `float | None` takes."""
    args = typing.get_args(annotation)
    if args and typing.get_origin(annotation) is not typing.Literal:
        return set().union(*(_numbers_in(arg) for arg in args))
    return {annotation} & {int, float, bool}


class NumbersNotBooleans(BaseModel):
    """JSON `true` is no number: pydantic reads it as 1 (`"seed": true` was seed 1, `"volume": false` a
    silent result). A field that takes a number refuses a boolean, naming the field."""

    @field_validator("*", mode="before")
    @classmethod
    def _not_a_boolean(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool) and info.field_name in cls.model_fields:
            takes = _numbers_in(cls.model_fields[info.field_name].annotation)
            if takes and bool not in takes:
                raise ValueError(f"must be a number, not {str(value).lower()}")
        return value


class StrictBody(NumbersNotBooleans):
    """A request body that names only its own fields and holds only finite numbers."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


def _threshold_field(name: str) -> Any:
    bounds = THRESHOLD_BOUNDS[name]
    low = {"gt": bounds.low} if bounds.above else {"ge": bounds.low}
    return Field(None, **low, le=bounds.high, description=f"this request's {name} (default: the server's)")


class Thresholds(StrictBody):
    """Some quality thresholds for one request (docs/quality.md); those left out are the server's."""

    min_similarity: float | None = _threshold_field("min_similarity")
    min_pace_ratio: float | None = _threshold_field("min_pace_ratio")
    max_pace_ratio: float | None = _threshold_field("max_pace_ratio")
    max_repetition: float | None = _threshold_field("max_repetition")
    max_silence_ratio: float | None = _threshold_field("max_silence_ratio")
    max_pause_s: float | None = _threshold_field("max_pause_s")
    max_clipping_ratio: float | None = _threshold_field("max_clipping_ratio")
    max_flatness: float | None = _threshold_field("max_flatness")
    max_error_rate: float | None = _threshold_field("max_error_rate")

    @model_validator(mode="after")
    def _pace_is_a_range(self) -> Thresholds:
        low, high = self.min_pace_ratio, self.max_pace_ratio
        if low is not None and high is not None and low > high:
            raise ValueError(f"min_pace_ratio {low:g} is above max_pace_ratio {high:g}")
        return self

    def given(self) -> dict[str, float] | None:
        """The thresholds set, name -> value (None when none is)."""
        return self.model_dump(exclude_none=True) or None


def form_thresholds(value: Any) -> Any:
    """`thresholds` as a multipart form sends it: JSON text, parsed (validation then says what is wrong
    with it); anything else as it is."""
    if isinstance(value, str):
        try:
            return parse_json(value, "thresholds")
        except InputError as exc:
            exc.param = "thresholds"  # type: ignore[attr-defined]  # the envelope's `param`
            raise
    return value


RECORDING_CONSENT = (
    "with prompt_wav: you confirm the server's consent statement (GET /v1/voices/consent): the person whose "
    "voice it is agreed separately; required for user keys unless the server turned it off"
)


class SynthesisParams(StrictBody):
    """One text in one voice. JSON: `prompt_wav` is base64 (or a data: URL); multipart: upload the file."""

    text: str = Field(min_length=1, max_length=100_000, examples=["你好，欢迎使用语音合成服务。"])
    voice: str | None = Field(None, max_length=64, description="a saved voice (id or name)")
    prompt_wav: str | None = Field(
        None, description="a 3-30 s recording of the voice to clone (JSON: base64; multipart: the file)"
    )
    prompt_text: str | None = Field(
        None, max_length=500, description="transcript of the prompt recording (omit for cross-lingual)"
    )
    instruct: str | None = Field(
        None, max_length=500, description="an instruction, e.g. 请用四川话表达 or 'speak happily'"
    )
    seed: int | None = Field(None, ge=0, le=MAX_SEED, description="makes the result reproducible")
    speed: float | None = Field(
        None, ge=MIN_SPEED, le=MAX_SPEED, description=f"{SPEED_RANGE_TEXT} (default: the voice's, or 1)"
    )
    volume: float | None = Field(
        1.0, ge=MIN_VOLUME, le=MAX_VOLUME, description="linear gain on the output (null: 1, unchanged)"
    )
    format: AudioFormat = Field("wav", description="response audio format")
    sample_rate: int | None = Field(
        None, ge=8000, le=48000, description="output rate in Hz (default 24000; mp3/opus only some rates)"
    )
    denoise: bool = Field(False, description="suppress background noise in prompt_wav first (RNNoise)")
    consent: bool = Field(False, description=RECORDING_CONSENT)
    transcribe: bool = Field(
        False, description="no prompt_text given: transcribe prompt_wav with the ASR model (zero-shot)"
    )
    takes: int | None = Field(
        None,
        ge=1,
        le=MAX_TAKES,
        description="takes to make while one fails its checks (default: the server's)",
    )
    thresholds: Thresholds | None = Field(
        None,
        description='some quality thresholds for this request, e.g. {"min_similarity": 0.6} '
        "(multipart: JSON text; default: the server's)",
    )

    _form_thresholds = field_validator("thresholds", mode="before")(form_thresholds)

    def to_request(self, prompt_wav: bytes | None) -> SynthesisRequest:
        return SynthesisRequest(
            text=self.text,
            voice=self.voice or None,
            prompt_wav=prompt_wav,
            prompt_text=self.prompt_text or None,
            instruct=self.instruct or None,
            seed=self.seed,
            speed=self.speed,
            volume=1.0 if self.volume is None else self.volume,
            denoise=self.denoise,
            takes=self.takes,
            thresholds=self.thresholds.given() if self.thresholds is not None else None,
        )


class TtsParams(SynthesisParams):
    model_config = ConfigDict(
        extra="forbid",
        allow_inf_nan=False,
        json_schema_extra={"examples": [{"text": "你好，世界。", "voice": "alice", "format": "mp3"}]},
    )

    stream: bool = Field(False, description="chunked response that starts before synthesis ends")
    explicit_label: bool = Field(
        True, description="false skips the audible AI cue (label_explicit) for this request: admins only"
    )


class JobParams(SynthesisParams):
    model_config = ConfigDict(
        extra="forbid",
        allow_inf_nan=False,
        json_schema_extra={
            "examples": [{"text": "第一章。很久很久以前……", "voice": "alice", "format": "mp3"}]
        },
    )


class VoiceRef(BaseModel):
    id: str = Field(max_length=64)


class SpeechParams(NumbersNotBooleans):
    """OpenAI's `POST /v1/audio/speech` body; unknown fields are ignored as OpenAI SDKs may add some."""

    model_config = ConfigDict(
        extra="ignore",
        allow_inf_nan=False,
        json_schema_extra={"examples": [{"model": "cosyvoice3", "input": "Hello!", "voice": "alice"}]},
    )

    model: str = Field("cosyvoice3", max_length=128, description="accepted and echoed; any value works")
    input: str = Field(min_length=1, max_length=100_000)
    voice: str | VoiceRef = Field(description='a saved voice: its name or id (or {"id": ...})')
    instructions: str | None = Field(None, max_length=500)
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm"] = Field(
        "mp3", description="OpenAI's formats; `aac` is refused here (400: use mp3, opus, flac, wav or pcm)"
    )
    speed: float = Field(
        1.0,
        description=f"CosyVoice supports {SPEED_RANGE_TEXT} (beyond it, in OpenAI's 0.25-4.0 or not: 400)",
        json_schema_extra={"minimum": MIN_SPEED, "maximum": MAX_SPEED},
    )
    stream_format: Literal["audio", "sse"] = "audio"
    seed: int | None = Field(None, ge=0, le=MAX_SEED, description="cosyserve extension")
    sample_rate: int | None = Field(None, ge=8000, le=48000, description="cosyserve extension")

    @property
    def voice_name(self) -> str:
        return self.voice.id if isinstance(self.voice, VoiceRef) else self.voice


class ErrorDetail(BaseModel):
    code: str = Field(examples=["invalid_input"])
    message: str
    request_id: str | None = None
    type: str = Field(
        examples=["invalid_request_error"],
        description="OpenAI's error class for this status (its SDKs read it)",
    )
    param: str | None = Field(None, description="the request field the error is about, when it is one field")


class ErrorEnvelope(BaseModel):
    error: ErrorDetail


class JobError(BaseModel):
    code: str | None
    message: str | None


class JobPartial(BaseModel):
    """What a job that stopped early made, and what is missing."""

    segments_done: int = Field(description="segments (a batch: items) finished and kept")
    segments_total: int
    missing_from: int | None = Field(None, description="a job: this segment (from 0) and every later one")
    missing: list[int] | None = Field(None, description="a batch: the positions of the items not made")
    audio_s: float = Field(description="seconds of audio kept (what result_url downloads)")


class JobView(BaseModel):
    id: str
    state: WorkState
    progress: float
    created_at: str
    started_at: str | None = None
    finished_at: str | None = None
    position: int | None = Field(None, description="place in the queue (0: next); only while queued")
    estimated_wait_s: float | None = None
    error: JobError | None = None
    output_id: str | None = None
    result_url: str | None = Field(None, description="signed download link, valid for a short time")
    result_deleted: bool = Field(False, description="its result was deleted since (DELETE /v1/outputs/{id})")
    duration_s: float | None = Field(None, description="seconds of audio made (a dub: the track's length)")
    charged_s: float | None = Field(None, description="audio seconds charged to the key's quota so far")
    seed: int | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    warnings: list[str] = Field(default_factory=list)
    quality: dict[str, Any] | None = Field(
        None, description="the kept take's scores, `takes` made and `passed` (docs/quality.md)"
    )
    kind: str = Field("tts", description="tts (a long text), batch or dub (see /v1/batches)")
    owner: str | None = Field(None, description="whose job it is (`key:<id>`, `user:<name>`): admins see all")
    partial: JobPartial | None = Field(
        None, description="it stopped early (error says why): what it made (result_url) and what is missing"
    )


class JobList(BaseModel):
    object: Literal["list"] = "list"
    data: list[JobView]
    has_more: bool = Field(False, description="more follow this page: ask again with `offset` + its length")


class OutputView(BaseModel):
    id: str
    created_at: str | None
    duration_s: float | None
    size_bytes: int | None
    sample_rate: int | None
    seed: int | None
    owner: str | None
    url: str = Field(description="signed download link")
    manifest_url: str


class OutputList(BaseModel):
    object: Literal["list"] = "list"
    data: list[OutputView]
    has_more: bool = Field(False, description="more follow this page: ask again with `offset` + its length")


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "cosyserve"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorEnvelope, "description": text}
    for status, text in (
        (400, "invalid input"),
        (401, "missing or invalid API key"),
        (403, "not allowed for this key"),
        (404, "not found"),
        (408, "the request's body stopped arriving"),
        (409, "not in a state for this (a job already ended, a batch still running)"),
        (413, "upload too large"),
        (415, "a body of a type this route does not take (JSON, or multipart with the upload)"),
        (422, "malformed request"),
        (429, "queue full, rate limit or quota (see Retry-After)"),
        (503, "model not ready or shutting down"),
        (504, "synthesis timed out"),
    )
}
AUDIO_CONTENT = {
    "audio/wav": {},
    "audio/mpeg": {},
    "audio/ogg": {},
    "audio/flac": {},
    "audio/pcm": {},
}


def inline_schema(model: type[BaseModel]) -> dict[str, Any]:
    """`model`'s JSON schema with the models it holds written in place: in a request body of the OpenAPI
    document, `#/$defs/...` points at the document's root, where there is no `$defs` (a dangling reference
    clients and fuzzers could not resolve)."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def resolved(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            if ref.startswith("#/$defs/"):
                return resolved(
                    {**defs[ref.removeprefix("#/$defs/")], **{k: v for k, v in node.items() if k != "$ref"}}
                )
            return {key: resolved(value) for key, value in node.items()}
        if isinstance(node, list):
            return [resolved(item) for item in node]
        return node

    return resolved(schema)


def body_doc(model: type[BaseModel], upload_field: str) -> dict[str, Any]:
    """`openapi_extra` for an endpoint that takes JSON or multipart with an upload."""
    schema = inline_schema(model)
    multipart = {
        **schema,
        "properties": {
            **schema["properties"],
            upload_field: {"type": "string", "format": "binary", "description": "the recording"},
        },
    }
    return {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": schema},
                "multipart/form-data": {"schema": multipart},
            },
        }
    }
