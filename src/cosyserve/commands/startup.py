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
