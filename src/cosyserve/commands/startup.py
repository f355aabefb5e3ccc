"""Start-up of `serve` and `worker`: failing fast, with one actionable line, when the model can't load.

The model loads in the background so that `/health` answers at once. If that first load fails, a server
that stays up looks alive while it can do nothing; so unless `--keep-serving-on-load-error` is given,
the process prints what failed, the one underlying reason and what to do, and exits non-zero.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from cosyserve.service.local.load_failure import load_failure_message

_POLL_S = 0.1


def watch_first_load(
    state: Callable[[], str],
    error: Callable[[], BaseException | None],
    model: str,
    on_failure: Callable[[str], None],
) -> threading.Thread:
    """Follow the first model load; if it fails, call `on_failure` with the message, once.

    `state()` is the model state ("loading" until the load ends, then "ready" or "failed").
    """

    def follow() -> None:
        while state() in ("stopped", "loading"):
            time.sleep(_POLL_S)
        if state() == "failed":
            failure = error() or RuntimeError("unknown reason")
            on_failure(load_failure_message(model, failure))

    thread = threading.Thread(target=follow, name="cosyserve-load-watch", daemon=True)
    thread.start()
    return thread


def print_failure(command: str, message: str) -> None:
    """The CLI's one-line error format: `cosyserve COMMAND: error: MESSAGE`."""
    print(f"cosyserve {command}: error: {message}", file=sys.stderr, flush=True)


def where_things_are(settings: Any) -> str:
    """One line for the start of `serve`/`worker`: where data, outputs and the log file live, the time zone
    of output names, and the GPUs NVML sees (so an operator knows where to look before anything runs)."""
    from cosyserve.service.gpu import gpu_report

    storage = settings.storage
    report = gpu_report()
    gpus = ", ".join(f"{g.index}: {g.name} ({g.memory_total_bytes / 2**30:.0f} GiB)" for g in report.gpus)
    return (
        f"data directory {storage.data_dir}; outputs in {storage.output_dir} (named in {storage.timezone} "
        f"time, kept {storage.retention_days:g} days); log file {settings.log.file or '(console only)'}; "
        f"GPUs: {gpus or report.absent_reason or 'none'}"
    )


def address_in_use(host: str, port: int) -> str | None:
    """Why the server could not listen on host:port (another program holds it), or None. Bound the way
    uvicorn binds (SO_REUSEADDR), then let go, so the model is not loaded for a server that cannot start."""
    import errno
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                return None  # another problem: uvicorn reports it
            return (
                f"{host}:{port} is already in use (another cosyserve, or another program, listens there): "
                "stop it, or pass --port N"
            )
    return None
