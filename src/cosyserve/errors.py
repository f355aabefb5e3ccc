"""Errors that reach users. Each message says what was wrong and what to do about it."""

from __future__ import annotations

import sys


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


_CODES: tuple[tuple[type[BaseException], str], ...] = (
    (JobTimeout, "timeout"),
    (Cancelled, "cancelled"),
    (ShuttingDown, "shutting_down"),
    (QueueFull, "queue_full"),
    (StorageError, "storage_error"),
    (InputError, "invalid_input"),
)


def error_code(exc: BaseException) -> str:
    """A short stable code for an exception, for job records, `errors_total{kind}` and API error envelopes."""
    for cls, code in _CODES:
        if isinstance(exc, cls):
            return code
    if isinstance(exc, CosyServeError):
        name = type(exc).__name__.removesuffix("Error")
        return "".join("_" + c.lower() if c.isupper() else c for c in name).lstrip("_")
    if is_out_of_memory(exc):  # one that no layer turned into OutOfMemory still is no bug
        return "out_of_memory"
    return "internal"


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
