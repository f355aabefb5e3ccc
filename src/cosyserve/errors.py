"""Errors that reach users. Each message says what was wrong and what to do about it."""

from __future__ import annotations

import errno
import sys
from dataclasses import dataclass

from cosyserve.exit_codes import ExitCode


class CosyServeError(Exception):
    """Base class for every error cosyserve raises on purpose (never for bugs)."""


class ModelDirError(CosyServeError):
    """A model directory is missing, incomplete, corrupt or of an unsupported kind."""


class ConfigError(CosyServeError):
    """A model config file could not be read or lacks a required value."""


class CheckpointError(CosyServeError):
    """A state dict does not match the architecture its config describes."""


class InputError(CosyServeError):
    """Input that a user supplied (text, audio, parameters) cannot be used."""


class TextError(InputError):
    """The text to speak cannot be spoken: empty, nothing to say, too long."""

    param = "text"  # the request field it is about (the API's error `param`)


class TextTooLong(TextError):
    """A text over the characters one request may have."""


class VoiceNameInvalid(InputError):
    """A voice name outside what names may hold."""

    param = "name"


class VoiceNameTaken(InputError):
    """The caller already has a voice of that name."""

    param = "name"


class LexiconError(InputError):
    """A voice's lexicon (or an entry of it) that cannot be used."""

    param = "lexicon"


class Cancelled(CosyServeError):
    """The work was cancelled (by its client, a disconnect or a shutdown) before it finished."""


class Interrupted(Cancelled):
    """The server stopped the work, not its client (an engine restart, a worker's shutdown): a job goes back
    to the queue and runs again as its next attempt, after what it finished (a batch's done items)."""


class QueueFull(CosyServeError):
    """The job queue is full: the client should retry after `retry_after_s` seconds."""

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class OutOfMemory(CosyServeError):
    """The accelerator ran out of memory for this request; the engine freed what it could and stays
    usable. The client should retry after `retry_after_s` seconds (or send shorter text)."""

    def __init__(self, message: str, retry_after_s: int = 5) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


OUT_OF_MEMORY_RETRY_AFTER_S = 5  # OutOfMemory's default wait, also for a raw allocation failure


class JobTimeout(CosyServeError):
    """A job ran longer than the request timeout and was stopped."""


class StorageError(CosyServeError, OSError):
    """A result could not be saved (disk full, read-only, no permission): the audio was made but not kept.
    Also an OSError, which is what it wraps."""

    retry_after_s = 30


class ShuttingDown(CosyServeError):
    """The server is shutting down and accepts no new work; queued work is failed with this. Another
    node, or this one once restarted, can take it: retry after `retry_after_s`."""

    retry_after_s = 5


class SettingsError(CosyServeError):
    """A service setting (flag, environment variable or config file value) is invalid or unsafe."""


class ModelNotReady(CosyServeError):
    """The model is still loading, reloading, or failed to load."""

    retry_after_s = 5


class JobStateError(CosyServeError):
    """A job cannot make the requested state change (e.g. it already finished: one job, one result)."""


# -- errors of the service's parts, defined here so that every layer (and the error table) can name them


class AuthRequired(CosyServeError):
    """No valid credentials (API key or UI session) came with a request that needs them."""


class Forbidden(CosyServeError):
    """The credentials are valid but not allowed to do this (role or owner)."""


class RateLimited(CosyServeError):
    """Too many requests for this API key; retry after `retry_after_s`."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class QuotaExceeded(RateLimited):
    """The key's daily audio-seconds quota is used up (`held_only`: it would fit once the key's own work
    in flight has ended, so a retry soon may pass)."""

    def __init__(self, message: str, retry_after_s: int, *, held_only: bool = False) -> None:
        super().__init__(message, retry_after_s)
        self.held_only = held_only


class KeyRevoked(CosyServeError):
    """The API key that started this work was revoked (or deleted) while it ran; the work stopped."""


class KeyChanged(CosyServeError):
    """The API key's role changed while its work ran and the work uses what the key may no longer use."""


class ConsentRequired(InputError):
    """A user key enrolled a voice without confirming the consent statement."""


class VoiceNotFound(InputError):
    """No voice with that id or name."""


class VoiceFilesMissing(VoiceNotFound):
    """The voice exists but its files are on another node only (enrolled before files were shared)."""


class VoiceUnavailable(CosyServeError):
    """A voice that work was accepted with is gone when the work needs it (deleted out of band): not the
    caller's error; the work keeps what it finished."""


class VoiceInUse(CosyServeError):
    """A voice that queued or running work uses cannot be deleted yet."""


class OutputNotFound(InputError):
    """No complete output with that id (never saved, removed, or still being written)."""


class ModelNotFound(InputError):
    """A model id the server does not serve (`GET /v1/models/{id}`)."""


class BodyStalled(InputError):
    """A request body stopped arriving (no byte for a while): its memory and budget are freed."""


class KeyNotFound(InputError):
    """No API key with that id or prefix."""


class JobNotFound(InputError):
    """No job with that id (never created, purged, or someone else's)."""


class PayloadTooLarge(InputError):
    """A request body or upload is larger than the server allows."""


class UnsupportedMediaType(InputError):
    """A body or upload of a type this endpoint does not take."""


class SyncError(CosyServeError):
    """The bucket can't be used or an upload failed for good (the message says which and why)."""


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


# How the libraries underneath say an allocation failed when they have no exception type for it:
# onnxruntime (its arena, the CUDA provider, cuBLAS/cuDNN workspaces) and torch's own RuntimeErrors.
_ALLOCATION_FAILURES = (
    "failed to allocate memory",
    "bad_alloc",
    "cuda failure 2: out of memory",
    "cudaerrormemoryallocation",
    "cuda error: out of memory",
    "cublas_status_alloc_failed",
    "cudnn_status_alloc_failed",
    "cufft_alloc_failed",  # torch.stft/istft on CUDA (features, the vocoder) when no plan workspace fits
    "cusolver_status_alloc_failed",
    "can't allocate memory",
)


def is_out_of_memory(exc: BaseException) -> bool:
    """Did `exc` come from an allocation that failed: `OutOfMemory`, `torch.OutOfMemoryError`, a
    `MemoryError` (numpy's too), or onnxruntime's RUNTIME_EXCEPTION / torch's RuntimeError whose text
    says so. Needs no torch import: a torch error exists only where torch was imported."""
    if isinstance(exc, OutOfMemory | MemoryError):
        return True
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(exc, torch.OutOfMemoryError):
        return True
    if isinstance(exc, RuntimeError) or type(exc).__module__.startswith("onnxruntime"):
        text = str(exc).lower()
        return any(failure in text for failure in _ALLOCATION_FAILURES)
    return False


class Unavailable(CosyServeError):
    """Something a command needs is not here or out of reach (an optional extra, a server): install,
    download or start it and run the command again."""


class MissingExtra(Unavailable):
    """An optional dependency is not installed; the message names the `pip install` line."""

    def __init__(self, module: str, extra: str, needed_for: str) -> None:
        super().__init__(
            f"{needed_for} needs {module}, which is not installed: pip install 'cosyserve[{extra}]'"
        )
        self.module = module
        self.extra = extra


# Optional modules -> the extra that brings them (pyproject.toml's [project.optional-dependencies]).
EXTRA_OF_MODULE: dict[str, str] = {
    "celery": "distributed",
    "kombu": "distributed",
    "redis": "distributed",
    "psycopg": "distributed",
    "huggingface_hub": "download",
    "modelscope": "download",
    "sherpa_onnx": "asr",
    "pyrnnoise": "denoise",
}


def require_modules(needed_for: str, *modules: str) -> None:
    """Raise MissingExtra for the first of `modules` that is not importable (without importing it)."""
    import importlib.util

    for module in modules:
        if importlib.util.find_spec(module) is None:
            raise MissingExtra(module, EXTRA_OF_MODULE.get(module, "distributed"), needed_for)


# -- the error table ------------------------------------------------------------------------------------
# Where every error gets its code, its HTTP status, the `cosyserve` command's exit status and what the web
# UI says: the API (`api/errors.py`), the UI (`ui/generate.py`), the CLI (`exit_code_for`) and the cluster
# (`service/wire.py`, job records, `errors_total{kind}`) all read this one table.


@dataclass(frozen=True)
class ErrorKind:
    """How one kind of error reaches users."""

    code: str  # short and stable: API envelopes, job and batch item records, metrics, the activity log
    status: int  # the HTTP status of its API answer (a 500 never shows its message)
    exit: ExitCode  # what a `cosyserve` command ends with when it stops one
    ui_key: str | None = None  # the web UI's translated sentence (`ui/i18n.py`); None: its own message


_USAGE, _FAILED, _UNAVAILABLE = ExitCode.USAGE, ExitCode.FAILED, ExitCode.UNAVAILABLE

# (exception class, how it reaches users): the first match wins, so subclasses come first.
ERROR_TABLE: tuple[tuple[type[BaseException], ErrorKind], ...] = (
    (VoiceFilesMissing, ErrorKind("voice_not_found", 404, _USAGE)),  # its own message says where they are
    (VoiceNotFound, ErrorKind("voice_not_found", 404, _USAGE, "err_voice_gone")),
    (ConsentRequired, ErrorKind("consent_required", 400, _USAGE, "err_consent")),
    (OutputNotFound, ErrorKind("output_not_found", 404, _USAGE, "err_output_gone")),
    (KeyNotFound, ErrorKind("key_not_found", 404, _USAGE)),
    (ModelNotFound, ErrorKind("model_not_found", 404, _USAGE)),
    (JobNotFound, ErrorKind("job_not_found", 404, _USAGE)),
    (PayloadTooLarge, ErrorKind("payload_too_large", 413, _USAGE)),
    (BodyStalled, ErrorKind("body_timeout", 408, _USAGE)),
    (UnsupportedMediaType, ErrorKind("unsupported_media_type", 415, _USAGE)),
    (QuotaExceeded, ErrorKind("quota_exceeded", 429, _FAILED, "err_rate")),
    (RateLimited, ErrorKind("rate_limited", 429, _FAILED, "err_rate")),
    (QueueFull, ErrorKind("queue_full", 429, _FAILED, "err_queue_full")),
    (AuthRequired, ErrorKind("auth_required", 401, _FAILED, "err_auth")),
    (Forbidden, ErrorKind("forbidden", 403, _FAILED, "err_admin")),
    (ModelNotReady, ErrorKind("model_not_ready", 503, _FAILED, "err_not_ready")),
    (OutOfMemory, ErrorKind("out_of_memory", 503, _FAILED)),
    (StorageError, ErrorKind("storage_error", 503, _FAILED)),
    (NoWorkers, ErrorKind("no_workers", 503, _FAILED)),
    (WorkerLost, ErrorKind("worker_lost", 503, _FAILED)),
    (QueueUnavailable, ErrorKind("queue_unavailable", 503, _FAILED)),
    (SyncError, ErrorKind("storage_unavailable", 503, _FAILED)),
    (ShuttingDown, ErrorKind("shutting_down", 503, _FAILED)),
    (JobTimeout, ErrorKind("timeout", 504, _FAILED, "err_timeout")),
    (Cancelled, ErrorKind("cancelled", 409, _FAILED, "cancelled")),  # Interrupted too
    (JobStateError, ErrorKind("conflict", 409, _FAILED)),
    (VoiceNameInvalid, ErrorKind("invalid_input", 400, _USAGE, "err_voice_name")),
    (VoiceNameTaken, ErrorKind("invalid_input", 400, _USAGE, "err_voice_name_taken")),
    (InputError, ErrorKind("invalid_input", 400, _USAGE)),
    (ModelDirError, ErrorKind("model_unavailable", 503, _UNAVAILABLE)),  # missing or damaged: download it
    (SettingsError, ErrorKind("settings", 500, _USAGE)),
    # work in flight that lost its footing: not the caller's request at fault
    (KeyRevoked, ErrorKind("key_revoked", 401, _FAILED)),
    (KeyChanged, ErrorKind("key_changed", 403, _FAILED)),
    (VoiceUnavailable, ErrorKind("voice_unavailable", 409, _FAILED)),
    (VoiceInUse, ErrorKind("voice_in_use", 409, _FAILED, "err_voice_in_use")),
    (MissingExtra, ErrorKind("missing_extra", 500, _UNAVAILABLE)),
    (Unavailable, ErrorKind("unavailable", 500, _UNAVAILABLE)),
)
_OUT_OF_MEMORY = ErrorKind("out_of_memory", 503, _FAILED)  # a raw allocation failure no layer turned
_INTERNAL = ErrorKind("internal", 500, _FAILED)  # a bug: its details go to the log only


def error_kind(exc: BaseException) -> ErrorKind:
    """How `exc` reaches users: its row of the table; another of ours gets a code from its class name
    (a 500); a raw allocation failure is still no bug; anything else is internal."""
    for cls, kind in ERROR_TABLE:
        if isinstance(exc, cls):
            return kind
    if isinstance(exc, CosyServeError):
        name = type(exc).__name__.removesuffix("Error")
        return ErrorKind(
            "".join("_" + c.lower() if c.isupper() else c for c in name).lstrip("_"), 500, _FAILED
        )
    if is_out_of_memory(exc):
        return _OUT_OF_MEMORY
    if is_resource_exhausted(exc) or is_database_damaged(exc):
        return _STORAGE
    return _INTERNAL


_STORAGE = ErrorKind("storage_error", 503, _FAILED)
_EXHAUSTED_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.ENFILE, errno.EMFILE})
_EXHAUSTED_SQLITE = ("SQLITE_FULL", "SQLITE_CANTOPEN", "SQLITE_IOERR")  # (CANTOPEN: out of files)


def is_resource_exhausted(exc: BaseException | None) -> bool:
    """A full disk or database, or no file descriptor left, anywhere in `exc`'s chain (a SQLAlchemy error
    wraps the driver's as `.orig`): a 503 the client may retry, not an internal error."""
    seen = 0
    while exc is not None and seen < 8:
        seen += 1
        if isinstance(exc, OSError) and exc.errno in _EXHAUSTED_ERRNOS:
            return True
        name = getattr(exc, "sqlite_errorname", None) or ""
        if name.startswith(_EXHAUSTED_SQLITE) or type(exc).__name__ == "DiskFull":  # (psycopg's)
            return True
        exc = getattr(exc, "orig", None) or exc.__cause__ or exc.__context__
    return False


def is_database_damaged(exc: BaseException | None) -> bool:
    """A malformed SQLite database anywhere in `exc`'s chain (a copy taken mid-write, a failing disk)."""
    seen = 0
    while exc is not None and seen < 8:
        seen += 1
        if (getattr(exc, "sqlite_errorname", None) or "") in ("SQLITE_CORRUPT", "SQLITE_NOTADB"):
            return True
        exc = getattr(exc, "orig", None) or exc.__cause__ or exc.__context__
    return False


def error_code(exc: BaseException) -> str:
    """A short stable code for an exception, for job records, `errors_total{kind}` and API error envelopes."""
    return error_kind(exc).code


def exit_code_for(error: BaseException) -> ExitCode:
    """The status a command ends with when `error` stops it."""
    if isinstance(error, KeyboardInterrupt):
        return ExitCode.INTERRUPTED
    return error_kind(error).exit
