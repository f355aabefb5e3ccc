"""The one wire format: what crosses a process (the broker, the relay, a worker's HTTP port) as JSON.

Requests, output specs, enrolments, stream starts, outcomes and errors turn into JSON-able dicts here and
back; `to_json`/`from_json` make the bytes. Celery messages are JSON (never pickle: a broker shared by
several machines must not be able to run code on a worker), so raw bytes travel base64-encoded. Errors
travel as their class name and message and come back as the same class when it is one of the
user-facing ones below, so an API node answers a bad voice name with the same 404 a single-process
server gives; their codes come from the error table (`cosyserve.errors.ERROR_TABLE`).
"""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Callable
from typing import Any

from cosyserve.errors import (
    Cancelled,
    CosyServeError,
    InputError,
    JobStateError,
    JobTimeout,
    ModelNotReady,
    OutOfMemory,
    QueueFull,
    ShuttingDown,
    StorageError,
    error_code,
)
from cosyserve.errors import NoWorkers as NoWorkers
from cosyserve.errors import QueueUnavailable as QueueUnavailable
from cosyserve.errors import RemoteFailure as RemoteFailure  # defined there, with the error table
from cosyserve.errors import WorkerLost as WorkerLost
from cosyserve.service.access.key_watch import KeyChanged, KeyRevoked, key_id_of
from cosyserve.service.outcomes import StreamStart, TtsOutcome
from cosyserve.service.quality import TakeReport
from cosyserve.service.requests import EnrolmentRequest, OutputSpec, SynthesisRequest, VoiceDefaults
from cosyserve.service.stores.keys import ApiKey
from cosyserve.service.stores.outputs import OutputNotFound
from cosyserve.service.stores.voices import VoiceNotFound, VoiceUnavailable

# Errors a worker raises that come back on the API node as the same class (anything else: RemoteFailure).
KNOWN_ERRORS: dict[str, type[CosyServeError]] = {
    cls.__name__: cls
    for cls in (
        VoiceNotFound,
        OutputNotFound,
        InputError,
        Cancelled,
        JobTimeout,
        QueueFull,
        ShuttingDown,
        JobStateError,
        ModelNotReady,
        OutOfMemory,
        StorageError,
        WorkerLost,
        KeyRevoked,
        KeyChanged,
        VoiceUnavailable,
    )
}


def to_json(data: Any) -> bytes:
    """`data` (a dict from this module, a number, a readiness report) as UTF-8 JSON bytes."""
    return json.dumps(data, ensure_ascii=False, default=str).encode()


def from_json(data: bytes | str) -> Any:
    """ValueError when `data` is not JSON."""
    return json.loads(data)


def b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text.encode("ascii"))


def encode_request(request: SynthesisRequest) -> dict[str, Any]:
    data = dataclasses.asdict(request)
    data["prompt_wav"] = b64(request.prompt_wav)
    return data


def decode_request(data: dict[str, Any]) -> SynthesisRequest:
    fields = {f.name for f in dataclasses.fields(SynthesisRequest)}
    values = {key: value for key, value in data.items() if key in fields}
    values["prompt_wav"] = unb64(values.get("prompt_wav"))
    return SynthesisRequest(**values)


def encode_spec(spec: OutputSpec) -> dict[str, Any]:
    """An `OutputSpec` without its `ApiKey` object: the key travels as its id (the worker charges it)."""
    return {
        "format": spec.format,
        "sample_rate": spec.sample_rate,
        "owner": spec.owner,
        "key_id": spec.key.id if spec.key is not None else None,
        "request_id": spec.request_id,
        "endpoint": spec.endpoint,
        "extra": spec.extra,
        "reservation": spec.reservation,  # the worker settles what the API node reserved
    }


def decode_spec(data: dict[str, Any], key_lookup: Callable[[int], ApiKey | None] | None = None) -> OutputSpec:
    """The `OutputSpec` back; `key_lookup(key_id)` returns the `ApiKey` (None: not charged here)."""
    key = None
    if data.get("key_id") is not None and key_lookup is not None:
        key = key_lookup(int(data["key_id"]))
    return OutputSpec(
        format=data["format"],
        sample_rate=data.get("sample_rate"),
        owner=data.get("owner"),
        key=key,
        request_id=data.get("request_id"),
        endpoint=data.get("endpoint", "tts"),
        extra=dict(data.get("extra") or {}),
        reservation=data.get("reservation"),
    )


def encode_outcome(outcome: TtsOutcome) -> dict[str, Any]:
    data = dataclasses.asdict(outcome)
    data["warnings"] = list(outcome.warnings)
    data["audio"] = b64(outcome.audio)
    return data


def decode_outcome(data: dict[str, Any]) -> TtsOutcome:
    values = dict(data)
    values["warnings"] = tuple(values.get("warnings") or ())
    values["audio"] = unb64(values.get("audio"))
    quality = values.get("quality")
    values["quality"] = TakeReport.from_fields(quality) if quality else None
    return TtsOutcome(**values)


def encode_stream_start(start: StreamStart) -> dict[str, Any]:
    return dataclasses.asdict(start)


def decode_stream_start(data: dict[str, Any]) -> StreamStart:
    return StreamStart(**data)


def encode_enrolment(enrolment: EnrolmentRequest) -> list[Any]:
    """The enrolment task's arguments: name, base64 audio, transcript, suffix, defaults, lexicon."""
    e = enrolment
    defaults = encode_defaults(e.defaults)
    fields = [e.name, b64(e.audio), e.transcript, e.suffix, defaults, e.lexicon, e.owner, e.shared]
    return [*fields, e.consent]


def decode_enrolment(
    name: str,
    audio_b64: str,
    transcript: str | None,
    suffix: str,
    defaults: dict[str, Any] | None,
    lexicon: dict[str, str] | None,
    owner: str | None = None,  # absent in tasks sent by API nodes from before voices had owners
    shared: bool | None = None,  # absent before voices had a shared flag: then no owner meant shared
    consent: dict[str, Any] | None = None,  # absent before consent was recorded
) -> EnrolmentRequest:
    shared = owner is None if shared is None else bool(shared)
    audio = unb64(audio_b64) or b""
    return EnrolmentRequest(
        name, audio, transcript, suffix, decode_defaults(defaults), lexicon, owner, shared, consent
    )


def encode_defaults(defaults: VoiceDefaults | None) -> dict[str, Any] | None:
    return None if defaults is None else dict(defaults.__dict__)


def decode_defaults(data: dict[str, Any] | None) -> VoiceDefaults | None:
    return None if data is None else VoiceDefaults(**data)


def encode_error(exc: BaseException) -> dict[str, Any]:
    data: dict[str, Any] = {"type": type(exc).__name__, "code": error_code(exc), "message": str(exc)}
    retry = getattr(exc, "retry_after_s", None)
    if retry is not None:
        data["retry_after_s"] = retry
    if not isinstance(exc, CosyServeError):  # a bug: the message may be meaningless to the client
        data["message"] = f"{type(exc).__name__}: {exc}"
    return data


def decode_error(data: dict[str, Any]) -> BaseException:
    """The worker's exception as the same user-facing class, else `RemoteFailure`."""
    cls = KNOWN_ERRORS.get(str(data.get("type")))
    message = str(data.get("message") or "the worker failed")
    if cls is None:
        return RemoteFailure(f"the worker failed: {message}")
    if cls in (QueueFull, OutOfMemory):  # these carry how long to wait
        return cls(message, retry_after_s=int(data.get("retry_after_s") or 1))  # type: ignore[call-arg]
    return cls(message)


# -- what a job record keeps: read again after a restart, or by the worker that claims the job ------------


def encode_job_request(request: SynthesisRequest, spec: OutputSpec) -> dict[str, Any]:
    """What a job record keeps of its request (everything needed to run it again)."""
    return {**dataclasses.asdict(request), "format": spec.format, "sample_rate": spec.sample_rate}


def decode_job_request(params: dict[str, Any], prompt_wav: bytes | None) -> SynthesisRequest:
    """A job's request again from its stored parameters and recording."""
    fields = {f.name for f in dataclasses.fields(SynthesisRequest)} - {"prompt_wav", "stream"}
    values = {key: value for key, value in params.items() if key in fields}
    return SynthesisRequest(**values, prompt_wav=prompt_wav)


def encode_job_spec(spec: OutputSpec) -> dict[str, Any]:
    """What a job keeps of its `OutputSpec` (the key as its id), to run again after a restart or on a
    worker that claims it."""
    return {
        "format": spec.format,
        "sample_rate": spec.sample_rate,
        "key_id": spec.key.id if spec.key is not None else None,
        "request_id": spec.request_id,
        "endpoint": spec.endpoint,
        "extra": spec.extra,
    }


def job_key_id(spec: dict[str, Any] | None, owner: str | None) -> int | None:
    """The id of the key a job is charged to, from its record's spec and owner."""
    key_id = (spec or {}).get("key_id")
    if key_id is None:
        # a job recorded before specs were (2026-12-01) names its key only as its owner: without this it
        # ran keyless after an upgrade, uncharged, with every voice, even for a revoked key
        return key_id_of(owner)
    return int(key_id)


def decode_job_spec(
    data: dict[str, Any] | None,
    params: dict[str, Any] | None,
    owner: str | None,
    key_lookup: Callable[[int], ApiKey | None],
) -> OutputSpec:
    """A job's `OutputSpec` again from its record's spec, params and owner; `key_lookup(key_id)` gives its
    key as it is now (None: revoked or deleted since)."""
    data = data or {}
    key_id = job_key_id(data, owner)
    return OutputSpec(
        format=data.get("format") or (params or {}).get("format") or "wav",
        sample_rate=data.get("sample_rate"),
        owner=owner,
        key=key_lookup(int(key_id)) if key_id is not None else None,
        request_id=data.get("request_id"),
        endpoint=data.get("endpoint") or "jobs",
        extra={**(data.get("extra") or {}), "key_id": key_id},
    )
