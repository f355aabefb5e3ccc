"""What crosses the broker and the relay: requests, output specs, outcomes and errors as JSON-able dicts.

Celery messages are JSON (never pickle: a broker shared by several machines must not be able to run code
on a worker), so raw bytes travel base64-encoded. Errors travel as their class name and message and come
back as the same class when it is one of the user-facing ones below, so an API node answers a bad voice
name with the same 404 a single-process server gives.
"""

from __future__ import annotations

import base64
import dataclasses
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
from cosyserve.service.access.key_watch import KeyChanged, KeyRevoked
from cosyserve.service.quality import TakeReport
from cosyserve.service.requests import (
    EnrolmentRequest,
    OutputSpec,
    SynthesisRequest,
    TtsOutcome,
    VoiceDefaults,
)
from cosyserve.service.stores.keys import ApiKey
from cosyserve.service.stores.outputs import OutputNotFound
from cosyserve.service.stores.voices import VoiceNotFound, VoiceUnavailable


class RemoteFailure(CosyServeError):
    """A worker failed with an unexpected error (its log has the traceback)."""


class WorkerLost(CosyServeError):
    """The worker running a request stopped answering (it crashed or was stopped); retry the request."""

    retry_after_s = 1


class QueueUnavailable(CosyServeError):
    """The shared queue (Redis) cannot be reached."""

    retry_after_s = 5


class NoWorkers(CosyServeError):
    """No worker is connected to the queue, so nothing can be synthesised right now."""

    retry_after_s = 5


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
