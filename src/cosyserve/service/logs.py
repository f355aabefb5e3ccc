"""Logging: one line per event (text or JSON), tagged with the request id, the last lines kept in memory.

`configure_logging` sets up the root logger once at startup. Every record passes `RequestIdFilter`, which
copies the current request id (a contextvar the API sets per request) onto it. The in-memory ring buffer
serves `GET /admin/logs` through `recent_logs`. Extra fields (`logger.info("…", extra={"job_id": …})`)
appear as `key=value` in text lines and as keys in JSON lines.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import uuid
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from datetime import datetime, timezone
from logging.handlers import RotatingFileHandler
from pathlib import Path
from typing import Any, TextIO

from cosyserve.errors import CosyServeError

RING_CAPACITY = 1000
ACTIVITY_CAPACITY = 500
TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s [%(request_id)s] %(message)s"

request_id_var: ContextVar[str | None] = ContextVar("cosyserve_request_id", default=None)

# Attributes every LogRecord has: anything else on a record came from `extra=`.
# a record's own attributes, not fields to show; uvicorn's `color_message` (its message with terminal colour
# codes) too: it put escape codes and an unformatted copy of the message on every line it logged
_RECORD_ATTRS = frozenset(vars(logging.makeLogRecord({}))) | {
    "message", "asctime", "request_id", "taskName", "color_message"
}  # fmt: skip
_CORE_KEYS = ("ts", "level", "logger", "message", "request_id", "exc")


def get_request_id() -> str | None:
    return request_id_var.get()


def new_request_id() -> str:
    return uuid.uuid4().hex[:16]


def set_request_id(request_id: str | None = None) -> Token[str | None]:
    """Tag what this context logs from now on; returns the token for `reset_request_id`."""
    return request_id_var.set(request_id or new_request_id())


def reset_request_id(token: Token[str | None]) -> None:
    request_id_var.reset(token)


@contextmanager
def request_context(request_id: str | None = None) -> Iterator[str]:
    """`with request_context(rid) as rid:` — everything logged inside carries `rid` (generated if None)."""
    token = set_request_id(request_id)
    try:
        yield request_id_var.get() or ""
    finally:
        reset_request_id(token)


class RequestIdFilter(logging.Filter):
    """Adds `record.request_id` ("-" outside a request). Attach to handlers so child loggers get it too."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(record, "request_id", None):
            record.request_id = request_id_var.get() or "-"
        return True


def record_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The `extra=` fields of a record."""
    return {key: value for key, value in vars(record).items() if key not in _RECORD_ATTRS}


def record_to_dict(record: logging.LogRecord) -> dict[str, Any]:
    """A record as flat JSON-able data: core keys first, then its extra fields."""
    out: dict[str, Any] = {
        "ts": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
        "level": record.levelname,
        "logger": record.name,
        "message": record.getMessage(),
        "request_id": getattr(record, "request_id", None) or request_id_var.get() or "-",
    }
    for key, value in record_fields(record).items():
        out[key if key not in _CORE_KEYS else f"field_{key}"] = _jsonable(value)
    if record.exc_info:
        out["exc"] = logging.Formatter().formatException(record.exc_info)
    return out


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_jsonable(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _jsonable(item) for key, item in value.items()}
    return str(value)


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(record_to_dict(record), ensure_ascii=False)


_CONTROL = {code: f"\\x{code:02x}" for code in [*range(32), *range(0x7F, 0xA0)]}
_CONTROL |= {9: "\\t", 10: "\\n", 13: "\\r", 0x2028: "\\u2028", 0x2029: "\\u2029"}  # (line breaks too)


def one_line(value: object) -> str:
    """`value` as text with its control characters escaped: a line break or terminal escape a client sent
    (in a URL path, a user name) can neither start a forged log line nor recolour a terminal."""
    return str(value).translate(_CONTROL)


class TextFormatter(logging.Formatter):
    """`TEXT_FORMAT` followed by the extra fields as key=value, each record on one line (a traceback
    below it)."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = one_line(record.message)
        return super().formatMessage(record)

    def format(self, record: logging.LogRecord) -> str:
        if not hasattr(record, "request_id"):
            record.request_id = request_id_var.get() or "-"
        line = super().format(record)
        fields = record_fields(record)
        if fields:
            extras = " ".join(f"{key}={one_line(value)}" for key, value in fields.items())
            head, sep, tail = line.partition("\n")  # keep a traceback below the fields
            line = f"{head} {extras}{sep}{tail}"
        return line


class RingBufferHandler(logging.Handler):
    """Keeps the last `capacity` records as dicts (see `record_to_dict`); with `only`, those of that
    logger alone."""

    def __init__(self, capacity: int = RING_CAPACITY, only: str | None = None) -> None:
        super().__init__()
        self._entries: deque[tuple[int, dict[str, Any]]] = deque(maxlen=capacity)
        self._entries_lock = threading.Lock()
        if only is not None:
            self.addFilter(lambda record: record.name == only)
        self.addFilter(RequestIdFilter())

    def emit(self, record: logging.LogRecord) -> None:
        try:
            entry = record_to_dict(record)
        except Exception:  # pragma: no cover - logging must never raise into the caller
            self.handleError(record)
            return
        with self._entries_lock:
            self._entries.append((record.levelno, entry))

    def recent(self, limit: int = 100, level: str | int | None = None) -> list[dict[str, Any]]:
        """The newest `limit` entries at `level` or above, oldest first."""
        threshold = _level_number(level) if level is not None else logging.NOTSET
        with self._entries_lock:
            entries = [entry for levelno, entry in self._entries if levelno >= threshold]
        return entries[-limit:] if limit > 0 else []

    def clear(self) -> None:
        with self._entries_lock:
            self._entries.clear()


def _level_number(level: str | int) -> int:
    if isinstance(level, int):
        return level
    number = logging.getLevelName(level.upper())
    if not isinstance(number, int):
        raise ValueError(f"unknown log level {level!r}: use DEBUG, INFO, WARNING, ERROR or CRITICAL")
    return number


class StderrHandler(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is when a record comes, not the one there at configuration: a
    thread that logs after stderr was replaced (a test's captured stream closed at its end, a daemon's
    redirect) writes to the live one instead of raising "I/O operation on closed file"."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:  # StreamHandler's own assignments: always sys.stderr
        pass


_ring = RingBufferHandler()
# The activity lines on their own: a flood of requests (600 unauthenticated ones) pushed every one of them
# out of the shared ring, and the Admin tab's "Recent activity" with them.
_activity = RingBufferHandler(ACTIVITY_CAPACITY, only="cosyserve.activity")
_MARK = "_cosyserve_handler"  # handlers we installed, replaced when configure_logging runs again


def configure_logging(
    level: str | int = "INFO",
    json: bool = False,
    *,
    stream: TextIO | None = None,
    file: str | Path | None = None,
    file_max_mb: float = 50.0,
    file_backups: int = 5,
) -> None:
    """Root logger → one stream handler (text or JSON lines), the ring buffer, and with `file` a
    size-rotated log file in the same format (`file.1` … `file.<backups>`); safe to call again."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, _MARK, False):
            root.removeHandler(handler)
            if handler not in (_ring, _activity):
                handler.close()
    console = logging.StreamHandler(stream) if stream is not None else StderrHandler()
    handlers: list[logging.Handler] = [console, _ring, _activity]
    if file is not None:
        path = Path(file).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        max_bytes = max(1024, int(file_max_mb * 1e6))
        handlers.append(
            RotatingFileHandler(path, maxBytes=max_bytes, backupCount=file_backups, encoding="utf-8")
        )
    for handler in handlers:
        if handler not in (_ring, _activity):
            handler.setFormatter(JsonFormatter() if json else TextFormatter())
            handler.addFilter(RequestIdFilter())
        setattr(handler, _MARK, True)
        root.addHandler(handler)
    root.setLevel(_level_number(level))


def configure_from_settings(log: Any) -> None:
    """`configure_logging` from the `[log]` settings group (`LogSettings`)."""
    configure_logging(
        log.level, log.json_lines, file=log.file, file_max_mb=log.file_max_mb, file_backups=log.file_backups
    )


def recent_logs(limit: int = 100, level: str | int | None = None) -> list[dict[str, Any]]:
    """The newest `limit` log entries (at `level` or above), oldest first, for `GET /admin/logs`."""
    return _ring.recent(limit, level)


def recent_activity(limit: int = 100) -> list[dict[str, Any]]:
    """The newest `limit` activity lines (`cosyserve.activity`), oldest first, kept apart from the rest."""
    return _activity.recent(limit)


def clear_recent_logs() -> None:
    _ring.clear()
    _activity.clear()


def log_failure(
    kind: str,
    message: str,
    *,
    exc: BaseException | None = None,
    logger: logging.Logger | None = None,
    level: int | None = None,
    **fields: Any,
) -> None:
    """Log a failure with its reason: `kind` (e.g. an `error_code`) and extra fields such as job_id.

    Unexpected exceptions (not CosyServeError) get their traceback and ERROR; expected ones a single WARNING.
    """
    unexpected = exc is not None and not isinstance(exc, CosyServeError)
    if level is None:
        level = logging.ERROR if unexpected or kind == "internal" else logging.WARNING
    extra = {"kind": kind}
    for key, value in fields.items():
        extra[key if key not in _RECORD_ATTRS else f"{key}_"] = value
    exc_info = (type(exc), exc, exc.__traceback__) if unexpected and exc is not None else None
    (logger or logging.getLogger("cosyserve.failures")).log(
        level, "%s: %s", kind, message, extra=extra, exc_info=exc_info
    )
